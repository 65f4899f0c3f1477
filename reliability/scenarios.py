"""The eight scenarios, each run against one store (a :class:`~reliability.targets.Target`).

Every scenario starts real processes (see :mod:`reliability.workers`), injects its faults, reads
every key it used once more at the end (the ``final`` events), and hands the merged history to
:func:`reliability.history.check`. Sizes come from :class:`Sizes`: :data:`FULL` is what
``RELIABILITY.md`` reports, :data:`CI` what ``reliability/run --ci`` and ``tests/test_reliability.py``
run in a few minutes on two cores.

1. ``contention``  many processes x many keys, no faults: every key computed exactly once.
2. ``kill``        SIGKILL the holder at random points: every key completes, takeovers are measured.
3. ``pause``       SIGSTOP the holder past its ttl, let another finish, SIGCONT: the old holder is
                   fenced out, the artifact untouched, its own run still gets the right value.
4. ``faults``      connections cut, slowed, stalled and reset through a fault proxy; the store down;
                   Azurite restarted: no corruption, ambiguity re-read, the unavailable policy kept.
5. ``skew``        client wall clocks +-10 minutes (libfaketime): exclusion holds where the service's
                   clock decides; the local-clock stores' limit is shown as expected violations.
6. ``hostile``     fuzzed keys, malformed URLs, corrupted and foreign records, tampered artifacts,
                   unsigned pickles (:mod:`reliability.hostile`).
7. ``removal``     removers (prune, reap, forget, force_release + discard) run while processes compute
                   the same keys again and again: two removers at once, one of them SIGSTOPped at
                   random, a third paused inside its removals (between listing and removing, and
                   between reading a record and writing it back), holders SIGKILLed so that expired
                   leases are there to reap. Exclusion, fences that only go up, and no artifact lost.
8. ``payloads``    the same with every artifact in a payload store (a folder; fsspec's local file
                   system beside the file store; Azure Blob beside the Azure store) and collectors as
                   the removers: collections of the payloads no record refers to, forgets (whose
                   payload is collected at once) and reaps, while processes compute keys whose values
                   are shared by groups of keys (identical payloads published under several keys) and
                   computed again after each forget (the same bytes published again). Two collectors
                   at once, one SIGSTOPped at random, a third paused at every step of a collection:
                   after listing the records, after listing the copies, before removing a copy. No
                   prune: a collection removes no artifact, so every payload lost is a lost artifact
                   the checker sees (a key read as free while its record named the payload), and each
                   miss a reader logged ("treated as missing") must be excused by a forget of its key.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dibs
from dibs.keys import Key
from reliability import faults, history, targets
from reliability.history import Event, Expectations, Recorder, Summary, Violation
from reliability.targets import Target
from reliability.workers import expected_value

__all__ = ["CI", "FULL", "SCENARIOS", "Launcher", "ScenarioResult", "Sizes", "run_scenario"]

ROOT = Path(__file__).resolve().parent.parent
SKEW_SECONDS = 600


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How big each scenario is."""

    contention_procs: int
    contention_keys: int
    kill_trials: int
    kill_batch: int
    pause_trials: int
    fault_procs: int
    fault_keys: int
    fault_seconds: float
    skew_procs: int
    skew_keys: int
    skew_kills: int
    fuzz_examples: int
    removal_procs: int
    removal_keys: int
    removal_seconds: float
    removal_kills: int


FULL = Sizes(
    contention_procs=16,
    contention_keys=500,
    kill_trials=50,
    kill_batch=10,
    pause_trials=10,
    fault_procs=6,
    fault_keys=400,
    fault_seconds=30.0,
    skew_procs=6,
    skew_keys=150,
    skew_kills=6,
    fuzz_examples=300,
    removal_procs=6,
    removal_keys=24,
    removal_seconds=40.0,
    removal_kills=20,
)
CI = Sizes(
    contention_procs=6,
    contention_keys=60,
    kill_trials=5,
    kill_batch=5,
    pause_trials=2,
    fault_procs=3,
    fault_keys=100,
    fault_seconds=5.0,
    skew_procs=3,
    skew_keys=24,
    skew_kills=2,
    fuzz_examples=12,
    removal_procs=3,
    removal_keys=8,
    removal_seconds=6.0,
    removal_kills=3,
)


@dataclasses.dataclass
class ScenarioResult:
    """What one scenario did on one store, and what the checker found."""

    scenario: str
    store: str
    trials: int = 0
    trial_unit: str = ""
    faults: Counter[str] = dataclasses.field(default_factory=Counter)
    violations: list[Violation] = dataclasses.field(default_factory=list)
    summary: Summary = dataclasses.field(default_factory=Summary)
    figures: dict[str, Any] = dataclasses.field(default_factory=dict)
    notes: list[str] = dataclasses.field(default_factory=list)
    skipped: str | None = None
    seconds: float = 0.0

    @property
    def unexpected(self) -> list[Violation]:
        return [v for v in self.violations if not v.expected]

    @property
    def expected(self) -> list[Violation]:
        return [v for v in self.violations if v.expected]

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "store": self.store,
            "trials": self.trials,
            "trial_unit": self.trial_unit,
            "faults": dict(self.faults),
            "violations": [dataclasses.asdict(v) for v in self.violations],
            "summary": dataclasses.asdict(self.summary),
            "figures": self.figures,
            "notes": self.notes,
            "skipped": self.skipped,
            "seconds": round(self.seconds, 1),
        }


# -- processes ---------------------------------------------------------------------------------------

_PRELOAD = [
    "dibs",
    "dibs.client",
    "dibs.stores.sql",
    "dibs.stores.filesystem",
    "dibs.stores.redis",
    "dibs.stores.azure",
    "sqlalchemy",
    "psycopg",
    "pymysql",
    "reliability.workers",
]


class Child:
    """A worker process, started from the fork server or (for libfaketime) as a fresh interpreter."""

    def __init__(self, proc: str, handle: Any) -> None:
        self.proc = proc
        self._handle = handle

    @property
    def pid(self) -> int:
        return int(self._handle.pid)

    def alive(self) -> bool:
        if isinstance(self._handle, subprocess.Popen):
            return self._handle.poll() is None
        return bool(self._handle.is_alive())

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds; ``True`` if the process has ended."""
        if isinstance(self._handle, subprocess.Popen):
            try:
                self._handle.wait(timeout=max(0.0, timeout))
            except subprocess.TimeoutExpired:
                return False
            return True
        self._handle.join(max(0.0, timeout))
        return not self._handle.is_alive()

    def kill(self) -> None:
        if self.alive():
            try:
                faults.signal_child(self.pid, signal.SIGCONT)
                faults.signal_child(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.join(10)


class Launcher:
    """Starts workers. The fork server has imported dibs, SQLAlchemy and the drivers once, so a
    holder that is killed a second later costs a fork, not an interpreter start."""

    def __init__(self) -> None:
        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload(_PRELOAD)
        self.children: list[Child] = []

    def start(self, spec: dict[str, Any], env: dict[str, str] | None = None) -> Child:
        from reliability import workers

        if env is None:
            process = self._context.Process(target=workers.run, args=(spec,), name=spec["proc"], daemon=False)
            process.start()
            child = Child(spec["proc"], process)
        else:
            popen = subprocess.Popen(
                [sys.executable, "-m", "reliability.workers", json.dumps(spec)],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
            )
            child = Child(spec["proc"], popen)
        self.children.append(child)
        return child

    def reap(self) -> list[str]:
        """Kill every child still running; returns their names (a scenario's leftovers are hangs)."""
        leftovers = [child.proc for child in self.children if child.alive()]
        for child in self.children:
            child.kill()
        self.children.clear()
        return leftovers


# -- shared plumbing ---------------------------------------------------------------------------------


class Run:
    """One scenario on one store: its folder, history, harness recorder and helpers."""

    def __init__(
        self, name: str, target: Target, sizes: Sizes, folder: Path, *, launcher: Launcher, seed: int
    ) -> None:
        self.name = name
        self.target = target
        self.sizes = sizes
        self.folder = folder
        self.history = folder / "history"
        self.history.mkdir(parents=True, exist_ok=True)
        self.launcher = launcher
        self.rng = random.Random(seed)
        self.seed = seed
        self.recorder = Recorder(self.history / "harness.jsonl", "harness")
        self.namespace = f"rel.{name}"
        self.result = ScenarioResult(name, target.name)
        self._offsets: dict[str, int] = {}
        self._seen: dict[str, list[Event]] = {}
        # Watcher threads (kill_holders) and the main thread read the same files: one reader at a time,
        # or two of them advance the offset past each other's half-read line.
        self._read_lock = threading.Lock()

    def spec(self, proc: str, role: str, keys: list[str], **fields: Any) -> dict[str, Any]:
        return {
            "proc": proc,
            "role": role,
            "keys": keys,
            "url": self.target.url,
            "namespace": self.namespace,
            "history": str(self.history),
            "seed": self.rng.randrange(2**31),
            **fields,
        }

    def events_of(self, proc: str) -> list[Event]:
        """The events ``proc`` has written so far (read incrementally)."""
        path = self.history / f"{proc}.jsonl"
        with self._read_lock:
            seen = self._seen.setdefault(proc, [])
            if not path.exists():
                return list(seen)
            with open(path, "rb") as handle:
                handle.seek(self._offsets.get(proc, 0))
                data = handle.read()
            complete = data[: data.rfind(b"\n") + 1]
            self._offsets[proc] = self._offsets.get(proc, 0) + len(complete)
            seen.extend(json.loads(line) for line in complete.splitlines() if line.strip())
            return list(seen)

    def wait_for(
        self, proc: str, predicate: Callable[[Event], bool], timeout: float, child: Child | None = None
    ) -> Event | None:
        """The first event of ``proc`` matching ``predicate``; ``None`` after ``timeout`` seconds, or
        as soon as ``child`` has exited without writing one."""
        deadline = time.monotonic() + timeout
        while True:
            for event in self.events_of(proc):
                if predicate(event):
                    return event
            if time.monotonic() > deadline or (child is not None and not child.alive() and child.join(0)):
                found = [event for event in self.events_of(proc) if predicate(event)]
                return found[0] if found else None
            time.sleep(0.005)

    def mark(self, op: str, **fields: Any) -> None:
        self.recorder.emit(op, **fields)

    def join(self, children: list[Child], timeout: float) -> list[str]:
        """Wait for ``children``; any still running at the deadline is killed and reported as hung."""
        deadline = time.monotonic() + timeout
        hung = []
        for child in children:
            if not child.join(deadline - time.monotonic()):
                hung.append(child.proc)
                child.kill()
        return hung

    def finalize(self, keys: list[str], payloads: str | None = None) -> None:
        """Read every key once more, directly, and record what is stored (the ``final`` events)."""
        client = dibs.Reservations(self.target.url, namespace=self.namespace, ttl=60, payloads=payloads)
        try:
            for name in keys:
                key = Key(self.namespace, name)
                fields: dict[str, Any] = {"key": name, "t0": time.monotonic()}
                try:
                    state = client.store.read(key)
                    fields["key_fence"] = state.fence
                    if state.artifact is not None:
                        fields["artifact"] = history.artifact_identity(state.artifact)
                        fields["value_ok"] = client.decode(key, state.artifact) == expected_value(name)
                except Exception as exc:  # recorded and judged by the checker
                    fields["error"] = f"{type(exc).__name__}: {exc}"
                fields["t1"] = time.monotonic()
                self.mark("final", **fields)
        finally:
            client.close()

    def check(self, expect: Expectations, folder: Path | None = None) -> list[Event]:
        events, torn = history.load(folder or self.history)
        violations, summary = history.check(events, expect)
        self.result.violations.extend(violations)
        self.result.summary.add(summary)
        if torn:
            self.result.notes.append(f"{torn} torn history line(s) from killed processes were ignored")
        return events

    def hung(self, procs: list[str]) -> None:
        for proc in procs:
            self.result.violations.append(Violation("waiter returns", None, f"{proc} did not finish in time"))


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {
        "n": len(ordered),
        "min": round(ordered[0], 3),
        "median": round(statistics.median(ordered), 3),
        "p95": round(p95, 3),
        "max": round(ordered[-1], 3),
    }


def _orders(keys: list[str], procs: int) -> list[list[str]]:
    """Each process's walk over the keys: forwards, backwards and from the middle, so that several
    processes reach the same key at the same moment all along the way."""
    middle = len(keys) // 2
    shapes = [keys, keys[::-1], keys[middle:] + keys[:middle]]
    return [shapes[w % 3] for w in range(procs)]


# -- 1. contention -------------------------------------------------------------------------------------


def contention(run: Run) -> None:
    procs, count = run.sizes.contention_procs, run.sizes.contention_keys
    keys = [f"c{i:04d}" for i in range(count)]
    start = time.monotonic() + 1.0 + 0.15 * procs
    children = [
        run.launcher.start(
            run.spec(
                f"racer-{w:02d}", "race", order, ttl=30.0, work=(0.002, 0.02), timeout=600, start_mono=start
            )
        )
        for w, order in enumerate(_orders(keys, procs))
    ]
    run.hung(run.join(children, timeout=60 + 0.5 * procs * count))
    elapsed = time.monotonic() - start
    run.finalize(keys)
    run.check(Expectations(single_execution=True, complete_keys=frozenset(keys)))
    run.result.trials = procs * count
    run.result.trial_unit = f"compute calls ({procs} processes x {count} keys)"
    run.result.figures["elapsed_seconds"] = round(elapsed, 1)
    run.result.figures["calls_per_second"] = round(procs * count / max(elapsed, 1e-9), 1)


# -- 2. SIGKILL the holder -----------------------------------------------------------------------------

KILL_TTL = 2.0


def _kill_trial(run: Run, holder: Child, key: str, phase: str, interval: float) -> None:
    """Kill ``holder`` at a random point of the chosen ``phase`` and record when."""
    if phase == "early":
        time.sleep(run.rng.uniform(0.0, 0.4))
    else:
        started = run.wait_for(
            holder.proc, lambda e: e["op"] == "exec" and e.get("phase") == "start", timeout=60
        )
        if started is None:
            run.mark(
                "signal",
                sig="KILL",
                proc=holder.proc,
                key=key,
                phase=phase,
                delivered=False,
                t0=time.monotonic(),
            )
            return
        if phase == "holding":
            time.sleep(run.rng.uniform(0.0, 2 * interval))  # anywhere in the heartbeat cycle
        else:
            time.sleep(run.rng.uniform(0.0, 0.45))  # around the complete
    try:
        at = faults.signal_child(holder.pid, signal.SIGKILL)
        delivered = True
    except ProcessLookupError:
        at, delivered = time.monotonic(), False
    run.mark("signal", sig="KILL", proc=holder.proc, key=key, phase=phase, delivered=delivered, t0=at)


def _exec_started(event: Event) -> bool:
    return event["op"] == "exec" and event.get("phase") == "start"


def kill_holders(run: Run, *, env_for: Callable[[int], dict[str, str] | None] | None = None) -> list[Event]:
    """SIGKILL trials. ``env_for(i)`` may give trial ``i``'s holder and waiter a skewed clock
    (scenario 5 reuses this with libfaketime)."""
    interval = KILL_TTL / 3
    trials, batch = run.sizes.kill_trials, run.sizes.kill_batch
    if env_for is not None:
        trials, batch = run.sizes.skew_kills, run.sizes.skew_kills
    all_keys: list[str] = []
    holders: set[str] = set()
    for first in range(0, trials, batch):
        keys = [f"k{i:03d}" for i in range(first, min(trials, first + batch))]
        all_keys += keys
        threads, children, phases = [], [], []
        for i, key in enumerate(keys):
            phase = (
                "holding" if env_for else run.rng.choices(["holding", "early", "finishing"], [70, 15, 15])[0]
            )
            work = (0.05, 0.3) if phase == "finishing" else (60.0, 60.0)
            proc = f"holder-{key}"
            holders.add(proc)
            env = env_for(first + i) if env_for else None
            holder = run.launcher.start(
                run.spec(proc, "race", [key], ttl=KILL_TTL, work=work, timeout=120, skew=_skew_of(env)),
                env=env,
            )
            children.append(holder)
            phases.append(phase)
            threads.append(threading.Thread(target=_kill_trial, args=(run, holder, key, phase, interval)))
        for thread in threads:
            thread.start()
        # Waiters come once the holders hold their keys (the early kills may already have happened).
        for holder, phase in zip(children, phases, strict=True):
            if phase != "early":
                run.wait_for(holder.proc, _exec_started, timeout=90, child=holder)
        waiters = []
        for w in range(2):
            env = env_for(w) if env_for else None  # in the skew scenario: one waiter ahead, one behind
            spec = run.spec(
                f"waiter-{first:03d}-{w}", "threads", keys, ttl=KILL_TTL, timeout=90, skew=_skew_of(env)
            )
            waiters.append(run.launcher.start(spec, env=env))
        for thread in threads:
            thread.join()
        run.hung(run.join(waiters, timeout=150))
        run.join(children, timeout=5)  # killed already, or finished before the kill
        for child in children:
            child.kill()
    run.finalize(all_keys)
    events = run.check(
        Expectations(
            complete_keys=frozenset(all_keys),
            killed=frozenset(holders),
            clock_tolerance=run.target.clock_tolerance,
        )
    )
    _takeovers(run, events, interval)
    run.result.trials = trials
    run.result.trial_unit = "SIGKILL trials"
    run.result.faults["SIGKILL"] = sum(1 for e in events if e["op"] == "signal" and e.get("delivered"))
    return events


def _skew_of(env: dict[str, str] | None) -> int:
    if not env or "FAKETIME" not in env:
        return 0
    return int(env["FAKETIME"].rstrip("s"))


def _takeovers(run: Run, events: list[Event], interval: float) -> None:
    """Classify every kill and measure takeover latency: kill delivered -> successor's grant returned."""
    grants = [e for e in events if e["op"] == "acquire" and e.get("result") == "granted"]
    completes = [e for e in events if e["op"] == "complete" and e.get("result") == "ok"]
    finals = {e["key"]: e for e in events if e["op"] == "final"}
    outcomes: Counter[str] = Counter()
    latencies: list[float] = []
    bound = KILL_TTL + interval
    for kill in (e for e in events if e["op"] == "signal" and e.get("sig") == "KILL"):
        key, at, owner = kill["key"], kill["t0"], f"{kill['proc']}/{kill['key']}/0"
        if not kill.get("delivered"):
            outcomes["holder finished before the kill"] += 1
            continue
        held = [g for g in grants if g["owner"] == owner and g["t1"] < at]
        done = [c for c in completes if c["key"] == key and c["t1"] < at]
        successor = next(
            (
                g
                for g in sorted(grants, key=lambda g: g["t1"])
                if g["key"] == key and g["owner"] != owner and g["t1"] > at
            ),
            None,
        )
        final_producer = (finals.get(key, {}).get("artifact") or {}).get("producer")
        if done:
            outcomes["killed after completing"] += 1
        elif not held and not (successor and successor.get("took_over_from") == owner):
            outcomes["killed before holding"] += 1
        elif final_producer == owner:
            outcomes["killed during its complete (stored)"] += 1
        elif successor is None:
            outcomes["killed while holding, no successor"] += 1
        else:
            outcomes["killed while holding"] += 1
            latencies.append(successor["t1"] - at)
    run.result.figures["kill outcomes"] = dict(outcomes)
    run.result.figures["takeover_seconds"] = _percentiles(latencies)
    run.result.figures["takeover_bound_seconds"] = round(bound, 3)
    run.result.figures["takeovers_within_bound"] = sum(1 for latency in latencies if latency <= bound)
    run.result.figures["ttl"] = KILL_TTL
    run.result.figures["heartbeat_interval"] = round(interval, 3)


# -- 3. SIGSTOP the holder -----------------------------------------------------------------------------

PAUSE_TTL = 1.5


def _pause_trial(run: Run, key: str, outcome: dict[str, Any]) -> None:
    go = run.folder / f"go-{key}"
    proc = f"paused-{key}"
    holder = run.launcher.start(run.spec(proc, "race", [key], ttl=PAUSE_TTL, go_file=str(go), timeout=120))
    try:
        beat = run.wait_for(proc, lambda e: e["op"] == "heartbeat" and e.get("result") == "ok", timeout=60)
        if beat is None:
            outcome["error"] = "the holder never heartbeat"
            return
        stopped_at = faults.signal_child(holder.pid, signal.SIGSTOP)  # right after a heartbeat: not mid-write
        run.mark("signal", sig="STOP", proc=proc, key=key, delivered=True, t0=stopped_at)
        successor = run.launcher.start(run.spec(f"successor-{key}", "race", [key], ttl=30.0, timeout=120))
        if run.join([successor], timeout=150):
            outcome["error"] = "the successor never finished"
        resumed_at = faults.signal_child(holder.pid, signal.SIGCONT)
        run.mark("signal", sig="CONT", proc=proc, key=key, delivered=True, t0=resumed_at)
        outcome["paused_seconds"] = resumed_at - stopped_at
        # Let the resumed heartbeat thread speak first, then let the work finish and try to complete.
        run.wait_for(proc, lambda e: e["op"] == "heartbeat" and e.get("result") != "ok", timeout=10)
        go.touch()
        if run.join([holder], timeout=60):
            outcome["error"] = "the resumed holder never returned"
    finally:
        holder.kill()


def pause_holders(run: Run) -> None:
    trials = run.sizes.pause_trials
    keys = [f"p{i:03d}" for i in range(trials)]
    outcomes: dict[str, dict[str, Any]] = {key: {} for key in keys}
    threads = [threading.Thread(target=_pause_trial, args=(run, key, outcomes[key])) for key in keys]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    run.finalize(keys)
    events = run.check(
        Expectations(complete_keys=frozenset(keys), clock_tolerance=run.target.clock_tolerance)
    )
    fenced, inconclusive = 0, 0
    for key in keys:
        owner = f"paused-{key}/{key}/0"
        successor = next(
            (
                e
                for e in events
                if e["op"] == "compute" and e["phase"] == "return" and e["proc"] == f"successor-{key}"
            ),
            {},
        )
        if successor.get("result") != "computed" or not successor.get("stored"):
            # Nobody took the key over (the checker already reports why the successor failed): then
            # the resumed holder's lease is rightly still current, and fencing is not exercised.
            inconclusive += 1
            continue
        mine = [e for e in events if e.get("key") == key and e.get("proc") == f"paused-{key}"]
        ret = next((e for e in mine if e["op"] == "compute" and e["phase"] == "return"), None)
        beats = [e["result"] for e in mine if e["op"] == "heartbeat" and e["t0"] > 0]
        writes = [e["result"] for e in mine if e["op"] == "complete"]
        final = next((e for e in events if e["op"] == "final" and e["key"] == key), {})
        problems = []
        if outcomes[key].get("error"):
            problems.append(outcomes[key]["error"])
        if not ret or ret.get("result") != "computed" or not ret.get("value_ok"):
            problems.append(f"the resumed run did not return the right value ({ret})")
        elif ret.get("stored", True):
            problems.append("the resumed run says its value was stored")
        if "lost" not in beats:
            problems.append(f"no heartbeat of the resumed holder was rejected (heartbeats: {beats})")
        if writes != ["lost"]:
            problems.append(
                f"the resumed holder's complete was not rejected exactly once (completes: {writes})"
            )
        if (final.get("artifact") or {}).get("producer") != f"successor-{key}/{key}/0":
            problems.append(f"the stored artifact is not the successor's: {final.get('artifact')}")
        if (final.get("artifact") or {}).get("producer") == owner:
            problems.append("the paused holder's value replaced the successor's")
        if problems:
            run.result.violations.append(Violation("paused holder fenced", key, "; ".join(problems)))
        else:
            fenced += 1
    run.result.trials = trials
    run.result.trial_unit = "SIGSTOP trials"
    run.result.faults["SIGSTOP"] = trials
    paused = [o["paused_seconds"] for o in outcomes.values() if "paused_seconds" in o]
    run.result.figures["paused_seconds"] = _percentiles(paused)
    run.result.figures["fenced_out"] = fenced
    if inconclusive:
        run.result.notes.append(f"{inconclusive} trial(s) without a successor, so without fencing to check")
    run.result.figures["ttl"] = PAUSE_TTL


# -- 4. store faults -----------------------------------------------------------------------------------

FAULT_TTL = 2.0


def _inject(run: Run, proxy: faults.FaultProxy, seconds: float) -> None:
    """A random fault every few hundred milliseconds for ``seconds``."""
    deadline = time.monotonic() + seconds
    rng = run.rng
    while time.monotonic() < deadline:
        fault = rng.choice(["cut", "reset-reply", "reset-request", "latency", "stall", "long stall"])
        run.mark("fault", fault=fault, t0=time.monotonic())
        if fault == "cut":
            proxy.cut_all()
            time.sleep(rng.uniform(0.1, 0.3))
        elif fault in ("reset-reply", "reset-request"):
            proxy.set_resets(0.08, ("down",) if fault == "reset-reply" else ("up",))
            time.sleep(rng.uniform(0.3, 0.8))
            proxy.set_resets(0.0)
        elif fault == "latency":
            proxy.set_latency(rng.uniform(0.02, 0.25))
            time.sleep(rng.uniform(0.3, 0.8))
            proxy.set_latency(0.0)
        elif fault == "stall":
            pause = rng.uniform(0.2, 0.8 * FAULT_TTL / 3)
            proxy.stall(pause)
            time.sleep(pause + 0.1)
        else:  # longer than the ttl: leases behind the proxy expire, the direct bystander takes over
            pause = rng.uniform(1.1 * FAULT_TTL, 1.6 * FAULT_TTL)
            proxy.stall(pause)
            time.sleep(pause + 0.1)
    proxy.heal()


def store_faults(run: Run) -> None:
    target = run.target
    if target.service is None:
        run.result.skipped = (
            "no network connection to break (the store is a local file or an embedded database)"
        )
        return
    sizes = run.sizes
    keys = [f"f{i:03d}" for i in range(sizes.fault_keys)]
    outage = [f"o{i}" for i in range(3)]
    proxy = faults.FaultProxy(*target.service, seed=run.seed)
    proxy.start()
    try:
        proxied = target.proxied_url(proxy.port)
        start = time.monotonic() + 1.0 + 0.1 * sizes.fault_procs
        duration = sizes.fault_seconds + 90
        children = []
        # Every worker walks the same keys in the same order (skipping a third at random), so most
        # keys have a holder and waiters at once while the faults hit; the work outlasts heartbeats.
        for w in range(sizes.fault_procs + 1):
            direct = w == sizes.fault_procs  # one bystander outside the partition
            spec = run.spec(
                "bystander" if direct else f"faulty-{w:02d}",
                "until_done",
                keys,
                ttl=FAULT_TTL,
                work=(0.05, 1.2),
                timeout=45,
                start_mono=start,
                stop_mono=start + sizes.fault_seconds,
                skip=0.3,
                duration=duration,
                policy="fail" if direct or w % 2 == 0 else "run",
            )
            if not direct:
                spec["url"] = proxied
            children.append(run.launcher.start(spec))
        time.sleep(max(0.0, start - time.monotonic()))
        _inject(run, proxy, sizes.fault_seconds)
        run.hung(run.join(children, timeout=duration + 30))

        _cut_while_waiting(run, proxied, proxy)

        # The store is down: the unavailable policy decides, and says so.
        proxy.refuse(True)
        proxy.cut_all()
        down = [
            run.launcher.start(
                dict(
                    run.spec(f"outage-{policy}", "race", outage, ttl=FAULT_TTL, timeout=20, policy=policy),
                    url=proxied,
                )
            )
            for policy in ("fail", "run")
        ]
        run.hung(run.join(down, timeout=120))
        proxy.refuse(False)
    finally:
        proxy.stop()
        run.result.faults.update(proxy.stats)
        run.result.figures["stalled_seconds"] = round(proxy.stalled_seconds, 1)
    restart_keys: list[str] = []
    if target.name == "azure":
        restart_keys = _restart_azurite(run)
    run.finalize(keys + restart_keys + outage + list(WATCH_KEYS))
    invoked = {
        e["key"] for e in history.load(run.history)[0] if e["op"] == "compute" and e["phase"] == "invoke"
    }
    events = run.check(
        Expectations(
            complete_keys=frozenset(k for k in keys + restart_keys + list(WATCH_KEYS) if k in invoked),
            unavailable_allowed=True,
            clock_tolerance=target.clock_tolerance,
        )
    )
    _check_outage(run, events, outage)
    _check_spin(run, events)
    run.result.trials = sum(1 for e in events if e["op"] == "compute" and e["phase"] == "invoke")
    run.result.trial_unit = "compute calls under faults"
    run.result.figures["faults by kind"] = dict(Counter(e["fault"] for e in events if e["op"] == "fault"))
    run.result.figures["leases lost and reported"] = run.result.summary.leases_lost


WATCH_KEYS = ("w0", "w1", "w2")
#: Asks per second that only a spinning waiter reaches (backoff or a notification allow a handful).
SPIN_ASKS_PER_SECOND = 50


def _cut_while_waiting(run: Run, proxied: str, proxy: faults.FaultProxy) -> None:
    """Cut the waiters' connections (their listening ones included) while they wait on held keys:
    they must go on backing off, not ask again and again at full speed."""
    keys = list(WATCH_KEYS)
    holder = run.launcher.start(run.spec("watch-holder", "threads", keys, ttl=FAULT_TTL, work=(3.0, 3.0)))
    deadline = time.monotonic() + 60
    while sum(1 for e in run.events_of("watch-holder") if _exec_started(e)) < len(keys):
        if not holder.alive() or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    waiter = run.launcher.start(
        dict(run.spec("watch-waiter", "threads", keys, ttl=FAULT_TTL, timeout=60), url=proxied)
    )
    time.sleep(1.0)
    for _ in range(2):
        run.mark("fault", fault="cut while waiting", t0=time.monotonic())
        proxy.cut_all()
        time.sleep(0.5)
    run.hung(run.join([holder, waiter], timeout=90))


def _check_spin(run: Run, events: list[Event]) -> None:
    for (proc, owner), asks in history.busiest_second(events, {"watch-waiter"}).items():
        if asks > SPIN_ASKS_PER_SECOND:
            run.result.violations.append(
                Violation(
                    "waiters back off",
                    owner.split("/")[1] if "/" in owner else None,
                    f"{proc} asked {asks} times within one second while the key was held: it spins "
                    "instead of backing off (its listening connection was cut)",
                )
            )
    run.result.figures["most asks per second while waiting (connections cut)"] = max(
        history.busiest_second(events, {"watch-waiter"}).values(), default=0
    )


def _check_outage(run: Run, events: list[Event], keys: list[str]) -> None:
    """While the store is down, policy 'fail' raises StoreUnavailable and 'run' runs unreserved; both log."""
    for policy, wanted in (("fail", "raised:StoreUnavailable"), ("run", "unreserved")):
        returns = [
            e
            for e in events
            if e["op"] == "compute" and e["phase"] == "return" and e["proc"] == f"outage-{policy}"
        ]
        logs = [
            e
            for e in events
            if e["op"] == "log" and e["proc"] == f"outage-{policy}" and e["level"] in ("WARNING", "ERROR")
        ]
        for key in keys:
            got = next((e["result"] for e in returns if e["key"] == key), None)
            if got != wanted:
                run.result.violations.append(
                    Violation(
                        "unavailable policy",
                        key,
                        f"policy {policy!r} with the store down gave {got!r}, not {wanted!r}",
                    )
                )
            elif not logs:
                run.result.violations.append(
                    Violation("unavailable policy", key, f"policy {policy!r}: nothing logged")
                )


def _restart_azurite(run: Run) -> list[str]:
    """Restart the emulator (the one store process this suite owns) under a running workload."""
    from reliability.targets import shared_azurite

    emulator = shared_azurite()
    keys = [f"r{i:03d}" for i in range(max(6, run.sizes.fault_keys // 4))]
    children = [
        run.launcher.start(
            run.spec(
                f"restart-{policy}",
                "until_done",
                order,
                ttl=FAULT_TTL,
                work=(0.05, 0.3),
                timeout=45,
                duration=120,
                policy=policy,
            )
        )
        for policy, order in zip(("fail", "run"), _orders(keys, 2), strict=True)
    ]
    time.sleep(1.5)
    run.mark("fault", fault="store restart", t0=time.monotonic())
    emulator.stop()
    time.sleep(2.0)
    emulator.start()
    run.result.faults["store restarts"] += 1
    run.hung(run.join(children, timeout=180))
    return keys


# -- 5. clock skew -------------------------------------------------------------------------------------

LOCAL_CLOCK_INVARIANTS = (
    "exclusion (real time)",
    "exclusion (store clock)",
    "single execution",
    "waiter returns",
)


def clock_skew(run: Run) -> None:
    library = faults.faketime_library()
    if library is None:
        run.result.skipped = "libfaketime is not installed: run scripts/install-faketime.sh"
        return
    measured = faults.verify_skew(library, SKEW_SECONDS)
    if abs(measured - SKEW_SECONDS) > 30:
        raise RuntimeError(f"libfaketime at {library} did not shift the clock: measured {measured:.1f}s")
    skews = [0, SKEW_SECONDS, -SKEW_SECONDS]

    def env(i: int) -> dict[str, str]:
        return faults.skew_environment(library, skews[i % 3])

    sizes = run.sizes
    keys = [f"s{i:03d}" for i in range(sizes.skew_keys)]
    start = time.monotonic() + 4.0 + 0.5 * sizes.skew_procs  # fresh interpreters start slowly
    children = [
        run.launcher.start(
            run.spec(
                f"skewed-{w:02d}",
                "race",
                order,
                ttl=3.0,
                work=(0.005, 0.03),
                timeout=60,
                start_mono=start,
                skew=skews[w % 3],
            ),
            env=env(w),
        )
        for w, order in enumerate(_orders(keys, sizes.skew_procs))
    ]
    run.hung(run.join(children, timeout=120 + sizes.skew_keys))
    run.finalize(keys)
    events = run.check(
        Expectations(
            single_execution=True, complete_keys=frozenset(keys), clock_tolerance=run.target.clock_tolerance
        )
    )
    _verify_clocks(run, events)

    # Kill trials with the holder and the waiter skewed in opposite directions.
    kill_run = Run(
        "skew-kill", run.target, run.sizes, run.folder / "kill", launcher=run.launcher, seed=run.seed + 1
    )
    kill_run.namespace = f"{run.namespace}.kill"
    kill_events = kill_holders(kill_run, env_for=lambda i: env(1 + i % 2))
    _verify_clocks(kill_run, kill_events)
    run.result.violations += kill_run.result.violations
    run.result.summary.add(kill_run.result.summary)
    run.result.figures["takeover_seconds"] = kill_run.result.figures["takeover_seconds"]
    run.result.figures["kill outcomes"] = kill_run.result.figures["kill outcomes"]
    run.result.figures["skew_seconds"] = SKEW_SECONDS
    run.result.figures["measured_skew_seconds"] = round(measured, 1)
    run.result.trials = sizes.skew_procs * len(keys) + sizes.skew_kills
    run.result.trial_unit = "compute calls and SIGKILL trials with skewed clocks"
    run.result.faults["skewed processes"] = (
        sum(1 for w in range(sizes.skew_procs) if skews[w % 3]) + 2 * sizes.skew_kills
    )
    run.result.faults["SIGKILL"] = kill_run.result.faults["SIGKILL"]
    if run.target.local_clock:
        history.mark_expected(
            run.result.violations,
            lambda v: v.invariant in LOCAL_CLOCK_INVARIANTS,
            f"the {run.target.name} store judges expiry by each process's own clock (documented limit)",
        )


def _verify_clocks(run: Run, events: list[Event]) -> None:
    """Every worker's wall clock really was off by its skew (else the scenario would prove nothing)."""
    offset = time.time() - time.monotonic()
    for clock in (e for e in events if e["op"] == "clock"):
        off = clock["wall"] - (clock["t0"] + offset)
        if abs(off - clock.get("skew", 0)) > 30:
            run.result.violations.append(
                Violation(
                    "setup",
                    None,
                    f"{clock['proc']} should run {clock.get('skew')}s off, but ran {off:.0f}s off",
                )
            )


# -- 6. hostile input ----------------------------------------------------------------------------------


def hostile(run: Run) -> None:
    from reliability import hostile as cases

    cases.run_all(run)


# -- 7. removals during the scenario ---------------------------------------------------------------

REMOVAL_TTL = 1.5


def _stop_and_continue(run: Run, remover: Child, stop: float, counts: Counter[str]) -> None:
    """SIGSTOP the remover at random moments (whatever it is doing) and SIGCONT it up to two ttls later."""
    while time.monotonic() < stop and remover.alive():
        time.sleep(run.rng.uniform(0.1, 0.6))
        try:
            at = faults.signal_child(remover.pid, signal.SIGSTOP)
        except ProcessLookupError:
            return
        run.mark("signal", sig="STOP", proc=remover.proc, t0=at)
        counts["SIGSTOP remover"] += 1
        time.sleep(run.rng.uniform(0.05, 2 * REMOVAL_TTL))
        try:
            at = faults.signal_child(remover.pid, signal.SIGCONT)
        except ProcessLookupError:
            return
        run.mark("signal", sig="CONT", proc=remover.proc, t0=at)


def _doomed_holders(
    run: Run,
    keys: list[str],
    stop: float,
    doomed: list[str],
    counts: Counter[str],
    *,
    common: dict[str, Any] | None = None,
) -> None:
    """Start holders that are SIGKILLed soon after they get their lease (often before their first
    heartbeat), so that expired leases nobody took over yet are there for reap and prune to race.
    ``common``: settings of the scenario's own processes they share (a payload store)."""
    count = run.sizes.removal_kills
    shared = {k: v for k, v in (common or {}).items() if k.startswith("payload")}
    for n in range(count):
        if time.monotonic() > stop - 1.0:
            return
        key = run.rng.choice(keys)
        proc = f"doomed-{n:03d}"
        doomed.append(proc)
        holder = run.launcher.start(
            run.spec(proc, "race", [key], ttl=REMOVAL_TTL, work=(60.0, 60.0), timeout=30, **shared)
        )
        run.wait_for(proc, _exec_started, timeout=3.0, child=holder)
        time.sleep(run.rng.uniform(0.0, REMOVAL_TTL / 3))
        try:
            at = faults.signal_child(holder.pid, signal.SIGKILL)
            counts["SIGKILL"] += 1
            run.mark("signal", sig="KILL", proc=proc, key=key, delivered=True, t0=at)
        except ProcessLookupError:
            pass
        holder.join(5)
        time.sleep(max(0.0, run.rng.uniform(0.5, 1.5) * (stop - time.monotonic()) / max(1, count - n)))


def removals(run: Run) -> None:
    sizes = run.sizes
    keys = [f"m{i:03d}" for i in range(sizes.removal_keys)]
    start = time.monotonic() + 1.0 + 0.15 * (sizes.removal_procs + 3)
    stop = start + sizes.removal_seconds
    common = {"ttl": REMOVAL_TTL, "start_mono": start, "stop_mono": stop}
    loopers = [
        run.launcher.start(run.spec(f"looper-{w:02d}", "loop", keys, work=(0.01, 0.8), timeout=60, **common))
        for w in range(sizes.removal_procs)
    ]
    # Two removers at once, one of them stopped and continued at random by the harness; a third
    # pauses inside its own removals (see workers._pause_points).
    free = run.launcher.start(run.spec("remover-free", "remove", keys, gap=(0.01, 0.15), **common))
    stopped = run.launcher.start(run.spec("remover-stopped", "remove", keys, gap=(0.01, 0.15), **common))
    paused = run.launcher.start(
        run.spec(
            "remover-paused",
            "remove",
            keys,
            gap=(0.01, 0.15),
            pause_chance=0.5,
            pause_seconds=(0.05, 2 * REMOVAL_TTL),
            **common,
        )
    )
    counts: Counter[str] = Counter()
    doomed: list[str] = []
    time.sleep(max(0.0, start - time.monotonic()))
    threads = [
        threading.Thread(target=_stop_and_continue, args=(run, stopped, stop, counts)),
        threading.Thread(target=_doomed_holders, args=(run, keys, stop, doomed, counts)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    run.hung(run.join([free, stopped, paused, *loopers], timeout=90 + 4 * REMOVAL_TTL))
    # The removers are gone: every key must now be computed (again) and stay stored.
    closer = run.launcher.start(run.spec("closer", "race", keys, ttl=30.0, timeout=60))
    run.hung(run.join([closer], timeout=90))
    run.finalize(keys)
    events = run.check(
        Expectations(
            complete_keys=frozenset(keys),
            killed=frozenset(doomed),
            clock_tolerance=run.target.clock_tolerance,
        )
    )
    done: Counter[str] = Counter()
    for event in events:
        if event["op"] in history.REMOVALS and event.get("proc", "").startswith("remover"):
            name = "force_release+discard" if event["op"] in ("force_release", "discard") else event["op"]
            if event["op"] != "discard":
                done[f"{name} calls"] += 1
            if event.get("result") == "ok" and event.get("changed"):
                done[f"{name} that removed"] += 1
    pauses = Counter(e["point"] for e in events if e["op"] == "pause")
    points: list[str] = next(
        (e["points"] for e in events if e["op"] == "pause points" and e["proc"] == "remover-paused"), []
    )
    run.result.trials = sum(1 for e in events if e["op"] == "compute" and e["phase"] == "invoke")
    run.result.trial_unit = "compute calls racing removals"
    for kind in ("prune", "reap", "forget", "force_release+discard"):
        run.result.faults[kind] = done[f"{kind} calls"]
    run.result.faults["paused removals"] = sum(pauses.values())
    run.result.faults.update(counts)
    run.result.figures["removals"] = dict(done)
    run.result.figures["pauses"] = dict(pauses)
    run.result.figures["pause points"] = points
    run.result.figures["grants"] = run.result.summary.grants
    run.result.figures["leases lost"] = run.result.summary.leases_lost
    run.result.figures["ttl"] = REMOVAL_TTL


# -- 8. payload collection during the scenario -----------------------------------------------------

#: The collection's grace in the payload scenario: what the stores' times need (a folder's are exact,
#: Azure's Last-Modified whole seconds); the default is a minute.
PAYLOAD_GRACE = {"azure": 2.0}


def _payloads_url(run: Run) -> str:
    """The payload store beside the target's records: Azure's own container for Azure, fsspec's local
    file system beside the file store, a folder elsewhere."""
    folder = run.folder / "payloads"
    if run.target.name == "azure":
        return run.target.url  # payloads under the same container's prefix/payloads/
    if run.target.name == "file":
        return f"local://{folder}"
    return folder.as_uri()


def payload_collection(run: Run) -> None:
    """On a space of its own: the hostile scenario leaves foreign and damaged records on the target,
    and a collection whose listing skipped a record it cannot read removes nothing (the rule: such a
    record may refer to any payload), so it would collect nothing there."""
    with targets.isolated(run.target.name, run.folder / "space", defaults=True) as own:
        run.target = own
        _payload_collection(run)


def _payload_collection(run: Run) -> None:
    sizes = run.sizes
    # Half the keys in pairs that share their value (one payload, published under two keys), half
    # with a value of their own; each forgotten key is computed again with the same bytes.
    count = sizes.removal_keys
    keys = [f"shared{i // 2}.{i}" for i in range(count // 2)] + [
        f"p{i:03d}" for i in range(count // 2, count)
    ]
    start = time.monotonic() + 1.0 + 0.15 * (sizes.removal_procs + 3)
    stop = start + sizes.removal_seconds
    payloads = _payloads_url(run)
    grace = PAYLOAD_GRACE.get(run.target.name, 0.05)
    common = {
        "ttl": REMOVAL_TTL,
        "start_mono": start,
        "stop_mono": stop,
        "payloads": payloads,
        "payload_grace": grace,
    }
    loopers = [
        run.launcher.start(run.spec(f"looper-{w:02d}", "loop", keys, work=(0.01, 0.2), timeout=60, **common))
        for w in range(sizes.removal_procs)
    ]
    collector = {"gap": (0.05, 0.3), "removals": {"collect": 4, "forget": 2, "reap": 1}, **common}
    free = run.launcher.start(run.spec("remover-free", "remove", keys, **collector))
    stopped = run.launcher.start(run.spec("remover-stopped", "remove", keys, **collector))
    # Paused at the steps of its collections (each forget's too), for up to half a ttl: long enough
    # for a looper to compute the key it is collecting again and publish the same bytes. Always before
    # it removes a copy (the step the lost payloads of issue 31 went through), a quarter of the time
    # after listing the records or the copies.
    paused = run.launcher.start(
        run.spec(
            "remover-paused",
            "remove",
            keys,
            pause_chance=0.25,
            pause_chance_at={"before removing a copy": 1.0, "after read": 0.0},
            pause_seconds=(0.05, REMOVAL_TTL / 2),
            **{**collector, "gap": (0.0, 0.05), "removals": {"collect": 1, "forget": 4}},
        )
    )
    counts: Counter[str] = Counter()
    doomed: list[str] = []
    time.sleep(max(0.0, start - time.monotonic()))
    threads = [
        threading.Thread(target=_stop_and_continue, args=(run, stopped, stop, counts)),
        threading.Thread(
            target=_doomed_holders, args=(run, keys, stop, doomed, counts), kwargs={"common": common}
        ),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    run.hung(run.join([free, stopped, paused, *loopers], timeout=90 + 4 * REMOVAL_TTL))
    # One collection certain to find a copy to remove, once the others have stopped: a key with a
    # value of its own computed, forgotten, and collected once its copy is past the grace. The
    # collections above race the loopers, which publish the same bytes again at once: on a busy
    # machine they may find every copy referenced, and "removed copies" would prove nothing.
    last = keys[-1]
    warm = run.launcher.start(run.spec("warm-last", "race", [last], timeout=60, **{**common, "ttl": 30.0}))
    run.hung(run.join([warm], timeout=90))
    final = run.launcher.start(
        run.spec(
            "remover-last",
            "remove",
            [last],
            in_order=["forget", "collect"],
            **{**collector, "gap": (grace + 0.2, grace + 0.2)},
        )
    )
    run.hung(run.join([final], timeout=90))
    closer = run.launcher.start(run.spec("closer", "race", keys, timeout=60, **{**common, "ttl": 30.0}))
    run.hung(run.join([closer], timeout=90))
    run.finalize(keys, payloads)
    events = run.check(
        Expectations(
            complete_keys=frozenset(keys),
            killed=frozenset(doomed),
            clock_tolerance=run.target.clock_tolerance,
        )
    )
    _check_misses(run, events)
    done: Counter[str] = Counter()
    for event in events:
        if event["op"] in ("collect", "forget", "reap") and event.get("proc", "").startswith("remover"):
            done[f"{event['op']} calls"] += 1
            if event["op"] != "collect" and event.get("result") == "ok" and event.get("changed"):
                done[f"{event['op']} that removed"] += 1
        elif event["op"] == "collected":
            done[f"copies removed ({event['kind']})"] += int(event["copies"])
            done["copies removed"] += int(event["copies"])
    pauses = Counter(e["point"] for e in events if e["op"] == "pause")
    run.result.trials = sum(1 for e in events if e["op"] == "compute" and e["phase"] == "invoke")
    run.result.trial_unit = "compute calls racing payload collections"
    for kind in ("collect", "forget", "reap"):
        run.result.faults[kind] = done[f"{kind} calls"]
    run.result.faults["paused collections"] = sum(pauses.values())
    run.result.faults.update(counts)
    run.result.figures["removals"] = dict(done)
    run.result.figures["pauses"] = dict(pauses)
    run.result.figures["payloads"] = {"file": "folder", "local": "fsspec local", "azure": "Azure Blob"}[
        payloads.split("://", 1)[0]
    ]
    run.result.figures["grace"] = grace
    run.result.figures["grants"] = run.result.summary.grants
    run.result.figures["ttl"] = REMOVAL_TTL


def _check_misses(run: Run, events: list[Event]) -> None:
    violations, misses, excused = history.payload_misses(events)
    run.result.violations.extend(violations)
    run.result.figures["payload misses"] = misses
    run.result.figures["payload misses after a forget"] = excused


SCENARIOS: dict[str, Callable[[Run], Any]] = {
    "contention": contention,
    "kill": kill_holders,
    "pause": pause_holders,
    "faults": store_faults,
    "skew": clock_skew,
    "hostile": hostile,
    "removal": removals,
    "payloads": payload_collection,
}


def run_scenario(
    name: str, target: Target, sizes: Sizes, folder: Path, *, launcher: Launcher, seed: int = 0
) -> ScenarioResult:
    """Run scenario ``name`` on ``target``; a crash of the harness itself is reported as a violation."""
    run = Run(name, target, sizes, folder, launcher=launcher, seed=seed)
    started = time.monotonic()
    try:
        SCENARIOS[name](run)
    except Exception as exc:  # the report must show it, and the next scenario must run
        run.result.violations.append(
            Violation("harness", None, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}")
        )
    finally:
        leftovers = launcher.reap()
        if leftovers:
            run.result.notes.append(f"killed leftover workers: {', '.join(leftovers)}")
        run.recorder.close()
    run.result.seconds = time.monotonic() - started
    return run.result

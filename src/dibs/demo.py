"""``dibs demo``: several processes need the same slow computation; watch one compute and the rest wait.

Act 1: N worker processes ask for the same key at once. One takes the lease and computes; the others
wait on it and pick up the stored artifact the moment it is completed.
Act 2: the same on a new key, but the demo kills the computing process with SIGKILL halfway. Its
lease expires after the ttl and one waiter takes over; the others wait for that one.

Everything runs on the embedded SQLite store in a temporary directory, in about 15 seconds.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import queue
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.queues import Queue
from pathlib import Path
from typing import Any

from dibs.client import Reservations
from dibs.outcomes import Acquired, Busy, Hit

__all__ = ["run_demo"]

TTL = 2.0


@dataclass
class _Worker:
    name: str
    role: str = "starting"
    detail: str = ""
    started: float = 0.0
    finished: float | None = None
    value: Any = None
    events: list[str] = field(default_factory=list)


def _work(url: str, key: str, name: str, work_seconds: float, events: Queue[tuple[Any, ...]]) -> None:
    """One worker process: get the key's value, reporting every step to the parent."""
    client = Reservations(url, namespace="demo", ttl=TTL)

    def say(kind: str, detail: str = "", value: Any = None) -> None:
        events.put((time.time(), name, kind, detail, value))

    say("asking")
    while True:
        outcome = client.get_or_reserve(key, owner=name)
        if isinstance(outcome, Hit):
            say("hit", f"artifact by {outcome.producer}", outcome.value)
            return
        if isinstance(outcome, Acquired):
            lease = outcome.lease
            took = f", took over from {outcome.took_over_from}" if outcome.took_over_from else ""
            say("computing", f"token {lease.token}{took}")
            with lease.keep_alive():
                steps = 10
                for step in range(steps):
                    time.sleep(work_seconds / steps)
                    say("progress", f"{(step + 1) * 100 // steps}%")
            value = {"model": "churn-v3", "auc": 0.91, "trained_by": name}
            lease.complete(value)
            say("done", f"stored with token {lease.token}", value)
            return
        assert isinstance(outcome, Busy)
        say(
            "waiting",
            f"on {outcome.holder} (token attempt {outcome.attempt}, lease {outcome.remaining:.1f}s left)",
        )
        hit = client.wait(key)  # returns on completion, or when the lease is released or expires
        if hit is not None:
            say("hit", f"artifact by {hit.producer}", hit.value)
            return


def _act(  # noqa: PLR0917 - a private helper called twice, each argument named at the call
    title: str, url: str, key: str, workers: int, work_seconds: float, kill_after: float | None
) -> dict[str, _Worker]:
    print(f"\n== {title}\n")
    ctx = multiprocessing.get_context("spawn")
    events: Queue[tuple[Any, ...]] = ctx.Queue()
    names = [f"worker-{i + 1}" for i in range(workers)]
    state = {name: _Worker(name) for name in names}
    procs = {name: ctx.Process(target=_work, args=(url, key, name, work_seconds, events)) for name in names}
    t0 = time.time()
    for proc in procs.values():
        proc.start()
    killed: str | None = None
    last_progress: dict[str, str] = {}
    while any(p.is_alive() for p in procs.values()) or not events.empty():
        try:
            at, name, kind, detail, value = events.get(timeout=0.1)
        except queue.Empty:
            at = None
        if at is not None:
            worker = state[name]
            if kind == "asking":
                worker.started = at
            if kind == "progress":
                last_progress[name] = detail
                if detail not in ("50%", "100%"):
                    continue
            else:
                worker.role, worker.detail = kind, detail
            if kind in ("hit", "done"):
                worker.finished, worker.value = at, value
            print(f"  t+{at - t0:5.2f}s  {name:<9} {kind:<10} {detail}")
        if kill_after is not None and killed is None:
            computing = [
                n for n, w in state.items() if w.role == "computing" and last_progress.get(n) == "50%"
            ]
            if computing:
                killed = computing[0]
                os.kill(procs[killed].pid or 0, signal.SIGKILL)
                state[killed].role = "killed"
                state[killed].detail = "SIGKILL at 50%"
                print(
                    f"  t+{time.time() - t0:5.2f}s  {killed:<9} {'KILLED':<10} "
                    f"SIGKILL halfway (its lease expires in {TTL:g}s)"
                )
    for proc in procs.values():
        proc.join()
    return state


def _summary(state: dict[str, _Worker]) -> None:
    from dibs.cli import print_table

    done = [w.finished for w in state.values() if w.role == "done" and w.finished is not None]
    completed_at = min(done) if done else None
    rows = []
    for worker in state.values():
        role = {"done": "computed", "hit": "waited", "killed": "killed"}.get(worker.role, worker.role)
        took = "" if worker.finished is None else f"{worker.finished - worker.started:.2f}s"
        handoff = ""
        if role == "waited" and completed_at is not None and worker.finished is not None:
            handoff = f"{(worker.finished - completed_at) * 1000:.0f} ms"
        rows.append(
            {"worker": worker.name, "role": role, "took": took, "hand-off": handoff, "detail": worker.detail}
        )
    print()
    print_table(rows, ["worker", "role", "took", "hand-off", "detail"])
    computed = sum(1 for w in state.values() if w.role == "done")
    values = {json.dumps(w.value, sort_keys=True) for w in state.values() if w.finished is not None}
    print(
        f"\n  computed {computed}x; {len(values)} distinct value(s) returned to "
        f"{sum(1 for w in state.values() if w.finished)} worker(s)"
    )


def run_demo(workers: int = 4, work_seconds: float = 3.0) -> int:
    if workers < 2:
        print("dibs demo: use at least 2 workers", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="dibs-demo-") as folder:
        url = f"sqlite:///{Path(folder) / 'dibs.db'}"
        print(f"dibs demo: {workers} processes, one slow computation ({work_seconds:g}s), store {url}")
        Reservations(url).close()  # create the tables once, before the race
        first = _act(
            "Act 1: everyone needs the same model",
            url,
            "train:churn:2026-11-25",
            workers,
            work_seconds,
            kill_after=None,
        )
        _summary(first)
        second = _act(
            f"Act 2: the computing process is killed halfway (ttl {TTL:g}s)",
            url,
            "train:churn:2026-11-26",
            workers,
            work_seconds,
            kill_after=0.5,
        )
        _summary(second)
    ok = all(w.finished is not None for w in first.values())
    ok = ok and sum(1 for w in first.values() if w.role == "done") == 1
    ok = ok and all(w.finished is not None for w in second.values() if w.role != "killed")
    print(
        "\nEach act computed once per live holder; every surviving worker got the artifact."
        if ok
        else "\nSomething went wrong: see above."
    )
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    return 0 if ok else 1

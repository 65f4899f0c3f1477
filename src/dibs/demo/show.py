"""The demo as the user watches it: what is about to happen, each act's events, and what came out.

The show owns the temporary folder and the deadline. Whatever ends it (its own end, a worker going
wrong, the deadline, Ctrl-C, SIGTERM or a hangup), every worker is killed and reaped before the folder
is removed, and the exit status says which it was.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from dibs._cli.text import print_table
from dibs.client import Reservations
from dibs.demo.crew import Crew, DeadlinePassed, Event
from dibs.demo.worker import STEPS, TTL

__all__ = ["run_demo"]

EXIT_OK, EXIT_WRONG, EXIT_USAGE = 0, 1, 2

# Starting the worker processes, each of which imports dibs and opens the store: about 1s on an idle
# machine, several on a busy one. Only used to say how long the demo takes.
STARTUP_SECONDS = 1.5
# The holder is killed halfway through the work: shorter work would end before the kill lands.
MIN_WORK_SECONDS = 0.5
# The default deadline is the expected duration plus this: far more than a slow, busy machine adds,
# far less than "for ever".
DEADLINE_MARGIN_SECONDS = 60.0

HALFWAY = f"{STEPS // 2 * 100 // STEPS}%"
SHOWN_PROGRESS = {HALFWAY, "100%"}
FINISHED = {"done": "computed", "hit": "waited"}  # a finished worker's report, and its role in the table


@dataclasses.dataclass
class _Worker:
    name: str
    role: str = "about to ask"
    detail: str = ""
    started: float | None = None
    computing_since: float | None = None
    took_over_from: str | None = None
    finished: float | None = None
    value: Any = None


@dataclasses.dataclass
class _Act:
    workers: dict[str, _Worker]
    killed: str | None = None
    killed_at: float | None = None

    def role(self, role: str) -> list[_Worker]:
        return [w for w in self.workers.values() if w.role == role]

    def over(self) -> bool:
        return all(w.role in {*FINISHED, "killed", "failed"} for w in self.workers.values())


class _Failed(Exception):
    """The demo cannot go on; the message says why."""


class _GaveUp(Exception):
    """The deadline passed; the message says where the demo was."""


class _Interrupted(BaseException):
    """Ctrl-C, SIGTERM or SIGHUP: the demo stops, through its cleanup rather than around it."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        name = signal.Signals(signum).name
        super().__init__("Ctrl-C (SIGINT)" if signum == signal.SIGINT else name)


def _say(text: str = "", err: bool = False) -> None:
    # Flushed line by line: the demo is watched live, often through a pipe (tee, CI logs).
    print(text, file=sys.stderr if err else sys.stdout, flush=True)


def expected_seconds(work_seconds: float) -> float:
    """About how long the demo takes: the workers start; act 1 computes once; act 2 computes half,
    waits for the killed holder's lease to expire (at most the ttl), then computes in full."""
    return STARTUP_SECONDS + 2.5 * work_seconds + TTL


def run_demo(workers: int = 4, work_seconds: float = 3.0, *, deadline: float | None = None) -> int:
    """Run both acts on a fresh SQLite store in a temporary folder; the exit status of ``dibs demo``.

    :param deadline: seconds after which the demo gives up (default: the expected duration plus a
        minute); it then stops every worker, removes the folder and exits 1 saying where it was.
    :returns: 0 when both acts showed what they should; 1 when something went wrong (the output
        says what) or the deadline passed; 2 for bad options; 128 + the signal number when
        interrupted (130 for Ctrl-C, 143 for SIGTERM, 141 when the reader of the output has gone).
    """
    problem = _check_options(workers, work_seconds, deadline)
    if problem:
        _say(f"dibs demo: {problem}", err=True)
        return EXIT_USAGE
    expected = expected_seconds(work_seconds)
    budget = deadline if deadline is not None else expected + DEADLINE_MARGIN_SECONDS
    give_up_at = time.monotonic() + budget
    folder = "the demo's temporary folder"
    try:
        with _signals_interrupt(), tempfile.TemporaryDirectory(prefix="dibs-demo-") as folder:
            url = f"sqlite:///{Path(folder) / 'dibs.db'}"
            _intro(folder, workers, work_seconds, expected, budget)
            Reservations(url).close()  # create the tables once, before the race
            names = [f"worker-{i + 1}" for i in range(workers)]
            with Crew(url, names, work_seconds) as crew:
                _start(crew, give_up_at)
                first = _play(
                    "Act 1",
                    "everyone needs the same model",
                    crew,
                    "train:churn:2026-11-25",
                    give_up_at,
                    kill_halfway=False,
                )
                second = _play(
                    "Act 2",
                    f"the computing process is killed halfway (ttl {TTL:g}s)",
                    crew,
                    "train:churn:2026-11-26",
                    give_up_at,
                    kill_halfway=True,
                )
    except _GaveUp as exc:
        _say(
            f"\ndibs demo: gave up after {_duration(budget)} (it normally takes about "
            f"{_duration(expected)}): {exc}.\n"
            f"Every worker was stopped and {folder} removed. This is a bug in dibs or in its demo; "
            "please report it with the output above.",
            err=True,
        )
        return EXIT_WRONG
    except _Failed as exc:
        _say(f"\ndibs demo: {exc}. Every worker was stopped and {folder} removed.", err=True)
        return EXIT_WRONG
    except _Interrupted as exc:
        _say(f"\ndibs demo: stopped by {exc}; every worker was stopped and {folder} removed.", err=True)
        return 128 + exc.signum
    except BrokenPipeError:
        # Whoever read the output has gone (``dibs demo | head``); the cleanup has run all the same.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    return _verdict(_act_one_problems(first) + _act_two_problems(second))


def _check_options(workers: int, work_seconds: float, deadline: float | None) -> str | None:
    if workers < 2:
        return f"--workers must be at least 2 (one computes, the others wait), got {workers}"
    if not work_seconds >= MIN_WORK_SECONDS:  # also refuses NaN
        return (
            f"--work-seconds must be at least {MIN_WORK_SECONDS:g} (the demo kills the computing process "
            f"halfway through it), such as 3; got {work_seconds:g}"
        )
    if deadline is not None and not deadline > 0:
        return f"the deadline must be a positive number of seconds, got {deadline:g}"
    return None


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP raise :class:`_Interrupted` once, then are ignored until the
    cleanup is over: a second Ctrl-C must not leave workers or the folder behind."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    signums = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def interrupt(signum: int, frame: FrameType | None) -> None:
        for each in signums:
            signal.signal(each, signal.SIG_IGN)
        raise _Interrupted(signum)

    previous = {signum: signal.signal(signum, interrupt) for signum in signums}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f}s" if seconds < 120 else f"{seconds / 60:.0f} minutes"


def _plural(count: int, one: str, many: str) -> str:
    return one if count == 1 else many.format(count)


def _intro(folder: str, workers: int, work_seconds: float, expected: float, budget: float) -> None:
    """What is about to happen, said before the first worker has even started."""
    others = _plural(workers - 1, "the other one waits and picks", "the other {} wait and pick")
    _say(
        f"dibs demo: {workers} worker processes need the same slow result (a {work_seconds:g}s model "
        f"training).\nThey share one embedded SQLite store in {folder} (removed at the end).\n"
    )
    everyone = "Both" if workers == 2 else f"All {workers}"
    _say(f"  Act 1  {everyone} ask at once. One takes the lease and computes; {others} up")
    _say("         the stored artifact the moment it is completed.")
    _say("  Act 2  The same on a new key, but the computing process is killed (SIGKILL) halfway.")
    _say(f"         Its lease expires within the ttl ({TTL:g}s) and one waiter takes over.\n")
    _say(
        f"About {_duration(expected)} in all; it gives up after {_duration(budget)}. "
        "Ctrl-C stops it and cleans up."
    )


def _start(crew: Crew, give_up_at: float) -> None:
    """Start the workers and wait until each has imported dibs and opened the store, so that each
    act's race starts at one instant and its times count the demo, not the interpreters starting."""
    _say(f"\nStarting {len(crew.names)} worker processes; each imports dibs and opens the store.")
    t0 = time.time()
    waiting_for = set(crew.names)
    try:
        for event in crew.events(give_up_at):
            if event.kind == "exited":
                raise _Failed(f"{event.worker} stopped before it was ready ({event.detail}; see above)")
            if event.kind == "ready":
                waiting_for.discard(event.worker)
            if not waiting_for:
                break
    except DeadlinePassed:
        raise _GaveUp(f"while starting, {', '.join(sorted(waiting_for))} never got ready") from None
    _say(f"All ready after {time.time() - t0:.1f}s.")


def _play(label: str, title: str, crew: Crew, key: str, give_up_at: float, *, kill_halfway: bool) -> _Act:
    """One act: every worker asks for ``key``; print the events as they come, kill the holder
    halfway if asked, until each worker has the artifact, was killed or failed."""
    act = _Act({name: _Worker(name) for name in crew.running()})
    _say(f"\n== {label}: {title}\n")
    t0 = time.time()

    def line(at: float, name: str, kind: str, detail: str) -> None:
        _say(f"  t+{at - t0:5.2f}s  {name:<9} {kind:<10} {detail}".rstrip())

    crew.go(key)
    try:
        for event in crew.events(give_up_at):
            worker = act.workers.get(event.worker)
            if worker is None or worker.name == act.killed:
                continue  # a worker out of this act; the killed one's last words
            if event.kind == "exited":
                worker.role, worker.detail = "failed", f"{event.detail} without the artifact"
                line(event.at, worker.name, "FAILED", worker.detail)
            elif event.kind == "progress":
                if event.detail in SHOWN_PROGRESS:
                    line(event.at, worker.name, event.kind, event.detail)
                if kill_halfway and act.killed is None and event.detail == HALFWAY:
                    crew.kill(worker.name)
                    act.killed, act.killed_at = worker.name, time.time()
                    worker.role, worker.detail = "killed", f"SIGKILL at {HALFWAY}"
                    line(act.killed_at, worker.name, "KILLED", f"SIGKILL; its lease expires within {TTL:g}s")
            else:
                _record(worker, event)
                line(event.at, worker.name, event.kind, event.detail)
            if act.over():
                break
    except DeadlinePassed as exc:
        doing = [_doing(act.workers[name]) for name in exc.running if name in act.workers]
        raise _GaveUp(f"in {label}, {'; '.join(doing)}") from None
    _summary(act)
    return act


def _record(worker: _Worker, event: Event) -> None:
    """What a worker's report says about it."""
    if event.kind == "asking":
        worker.started = event.at
    if event.kind == "computing":
        worker.computing_since = event.at
        worker.took_over_from = (event.value or {}).get("took_over_from")
    if event.kind in FINISHED:
        worker.finished, worker.value = event.at, event.value
    if event.kind != "said":
        worker.role, worker.detail = event.kind, event.detail


def _doing(worker: _Worker) -> str:
    """What a worker that is still running was last seen doing, for the deadline's message."""
    doing = {"done": "had stored the artifact", "hit": "had the artifact"}.get(
        worker.role, f"was {worker.role}"
    )
    return f"{worker.name} {doing}" + (f" ({worker.detail})" if worker.detail else "")


def _summary(act: _Act) -> None:
    completed = [w.finished for w in act.role("done") if w.finished is not None]
    rows = []
    for worker in act.workers.values():
        took = ""
        if worker.finished is not None and worker.started is not None:
            took = f"{worker.finished - worker.started:.2f}s"
        handoff = ""
        if worker.role == "hit" and completed and worker.finished is not None:
            handoff = f"{(worker.finished - completed[0]) * 1000:.0f} ms"
        role = FINISHED.get(worker.role, worker.role)
        rows.append(
            {"worker": worker.name, "role": role, "took": took, "hand-off": handoff, "detail": worker.detail}
        )
    _say()
    print_table(rows, ["worker", "role", "took", "hand-off", "detail"])
    who, what = _outcome(act)
    _say(f"\n  outcome: {who}\n           {what}")


def _outcome(act: _Act) -> list[str]:
    """The act in two lines, from what the workers reported."""
    computed = act.role("done")
    names = ", ".join(w.name for w in computed)
    said = {0: "nobody computed", 1: f"computed once (by {names})"}.get(
        len(computed), f"computed {len(computed)} times ({names})"
    )
    taker = next((w for w in computed if w.took_over_from is not None), None)
    if act.killed_at is not None and taker is not None and taker.computing_since is not None:
        later = taker.computing_since - act.killed_at
        said = f"{act.killed} killed halfway; {taker.name} took over {later:.1f}s later and computed once"
    alive = [w for w in act.workers.values() if w.name != act.killed]
    got = [w for w in alive if w.finished is not None]
    values = len({json.dumps(w.value, sort_keys=True) for w in got})
    survivors = "surviving workers" if act.killed else "workers"
    distinct = _plural(values, "one value", "{} different values")
    return [said, f"{len(got)} of {len(alive)} {survivors} got the artifact ({distinct})"]


def _act_one_problems(act: _Act) -> list[str]:
    problems = [
        f"act 1: {w.name} did not get the artifact" for w in act.workers.values() if w.finished is None
    ]
    if len(act.role("done")) != 1:
        problems.append(f"act 1: computed {len(act.role('done'))} times, not once")
    problems += _same_value("act 1", act.workers.values())
    return problems


def _act_two_problems(act: _Act) -> list[str]:
    if act.killed is None:
        return ["act 2: the computing process was never killed"]
    survivors = [w for w in act.workers.values() if w.name != act.killed]
    problems = [f"act 2: {w.name} did not get the artifact" for w in survivors if w.finished is None]
    computed = act.role("done")
    if not computed and not problems:
        return [
            f"act 2: {act.killed} stored the artifact before its SIGKILL landed; try a longer --work-seconds"
        ]
    if len(computed) != 1:
        problems.append(f"act 2: computed {len(computed)} times after the kill, not once")
    elif computed[0].took_over_from != act.killed:
        problems.append(f"act 2: {computed[0].name} computed without taking over from {act.killed}")
    problems += _same_value("act 2", survivors)
    return problems


def _same_value(act: str, workers: Iterable[_Worker]) -> list[str]:
    values = {json.dumps(w.value, sort_keys=True) for w in workers if w.finished is not None}
    return [f"{act}: the workers got {len(values)} different values"] if len(values) > 1 else []


def _verdict(problems: list[str]) -> int:
    if problems:
        _say("\nSomething went wrong:\n" + "\n".join(f"  - {p}" for p in problems), err=True)
        return EXIT_WRONG
    _say(
        "\nBoth acts went as they should: one live holder computed each key at a time, and every "
        "surviving worker got the artifact."
    )
    return EXIT_OK

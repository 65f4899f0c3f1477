"""Code that runs in child OS processes of the multi-process tests (importable under ``spawn``).

Children report through files in a folder the test owns, so the parent never depends on a child
living long enough to send something back through a pipe (some of them are killed on purpose).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import dibs


def _append(path: Path, line: dict[str, Any]) -> None:
    # O_APPEND writes of one short line are atomic on POSIX: racing children never interleave.
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(line) + "\n")


def read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def race_keys(url: str, keys: list[str], folder: str, worker: int, start_at: float) -> None:
    """Compute every key through ``run``; log each execution and each value obtained."""
    out = Path(folder)
    client = dibs.Reservations(url, namespace="race", ttl=30)
    while time.time() < start_at:  # line the racers up so they really collide
        time.sleep(0.001)

    def compute(key: str) -> str:
        _append(out / "executions.jsonl", {"key": key, "worker": worker})
        return f"value-of-{key}"

    results = {key: client.run(key, compute, key) for key in keys}
    _append(out / f"results-{worker}.jsonl", {"results": results})
    client.close()


def hold_forever(url: str, key: str, folder: str, ttl: float) -> None:
    """Acquire ``key``, keep it alive with heartbeats, announce it, and never finish (to be killed)."""
    client = dibs.Reservations(url, namespace="faults", ttl=ttl)
    outcome = client.get_or_reserve(key, owner=f"holder-{os.getpid()}")
    assert isinstance(outcome, dibs.Acquired), outcome
    with outcome.lease.keep_alive():
        _append(Path(folder) / "holder.jsonl", {"pid": os.getpid(), "lease": outcome.lease.export()})
        while True:
            time.sleep(0.05)


def hold_then_finish_on_signal(url: str, key: str, folder: str, ttl: float) -> None:
    """Acquire ``key`` with heartbeats, announce it, then (once ``go`` exists) try to finish it.

    The test pauses this process with SIGSTOP past its ttl, lets another holder complete, resumes
    it with SIGCONT and creates ``go``: the stale heartbeat and complete must both be refused.
    """
    out = Path(folder)
    client = dibs.Reservations(url, namespace="faults", ttl=ttl)
    outcome = client.get_or_reserve(key, owner=f"paused-{os.getpid()}")
    assert isinstance(outcome, dibs.Acquired), outcome
    lease = outcome.lease
    _append(out / "holder.jsonl", {"pid": os.getpid(), "token": lease.token})
    while not (out / "go").exists():
        time.sleep(0.01)
    report: dict[str, Any] = {}
    for action, call in (("heartbeat", lease.heartbeat), ("complete", lambda: lease.complete("stale value"))):
        try:
            call()
            report[action] = "accepted"
        except dibs.LeaseLost as exc:
            report[action] = f"LeaseLost: {exc}"
    _append(out / "paused-report.jsonl", report)


def acquire_and_exit(url: str, key: str, owner: str, folder: str) -> None:
    """Take a lease as ``owner`` and exit without releasing it (a crash before any cleanup)."""
    client = dibs.Reservations(url, namespace="faults", ttl=60)
    outcome = client.get_or_reserve(key, owner=owner)
    assert isinstance(outcome, dibs.Acquired), outcome
    _append(Path(folder) / "first.jsonl", {"token": outcome.lease.token})
    os._exit(0)


def wait_through_outage(url: str, key: str, folder: str, worker: int) -> None:
    """Wait for ``key`` (held by the test, whose store goes down meanwhile): say when the first busy
    answer came, then report how the call ended, its value or its error."""
    out = Path(folder)
    client = dibs.Reservations(url, namespace="outage", ttl=60)

    def observe(event: object) -> None:
        if isinstance(event, dibs.events.KeyBusy):
            _append(out / "waiting.jsonl", {"worker": worker})

    try:
        report = client.compute(key, lambda: "computed by a waiter", observer=observe, timeout=300)
        _append(out / f"waiter-{worker}.jsonl", {"value": report.value, "role": report.role})
    except Exception as exc:
        _append(out / f"waiter-{worker}.jsonl", {"error": f"{type(exc).__name__}: {exc}"})


def _go(folder: Path, worker: int) -> None:
    """Say this worker is ready, then wait for the test's ``go`` (a file): the racers start together
    however long each took to start."""
    (folder / f"ready-{worker}").touch()
    _await_file(folder / "go")


def _await_file(path: Path, timeout: float = 300.0) -> None:
    """Wait until the test writes ``path`` (looking every 5 ms, so that racers start together)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.005)


def race_and_stay(url: str, keys: list[str], folder: str, worker: int) -> None:
    """:func:`race_keys` after the test's go, then stay (store open) until the test has counted this
    process's connections (``exit``)."""
    out = Path(folder)
    client = dibs.Reservations(url, namespace="race", ttl=30)
    _go(out, worker)

    def compute(key: str) -> str:
        _append(out / "executions.jsonl", {"key": key, "worker": worker})
        return f"value-of-{key}"

    results = {key: client.run(key, compute, key) for key in keys}
    _append(out / f"results-{worker}.jsonl", {"results": results})
    while not (out / "exit").exists():
        time.sleep(0.01)
    client.close()


#: The file the failover test writes as it starts the failover (see :func:`grant_through_failover`).
FAILING_OVER = "failing-over"


def grant_through_failover(url: str, keys: list[str], folder: str, worker: int) -> None:
    """Take every key (``acquire``: a hit, or the lease, waiting while another holds it), logging each
    lease granted with its token before computing under it, and retrying whatever the store could
    not answer (a failover: ``StoreUnavailable``), as a caller's own retry policy would.

    Past the first third of the keys, each worker waits for the test's ``failing-over`` file, written
    as the failover starts: without it, 40 keys were all taken before the test got to fail the master
    over, and no grant was left to race it."""
    out = Path(folder)
    client = dibs.Reservations(url, namespace="failover", ttl=30)
    _go(out, worker)
    results: dict[str, Any] = {}
    unavailable = 0
    for index, key in enumerate(keys):
        if index == len(keys) // 3:
            _await_file(out / FAILING_OVER)
        while key not in results:
            try:
                got = client.acquire(key, owner=f"worker-{worker}", timeout=120)
                if isinstance(got, dibs.Acquired):
                    _append(
                        out / "grants.jsonl",
                        {"key": key, "token": got.lease.token, "worker": worker, "at": time.time()},
                    )
                    got.lease.complete(f"value-of-{key}")
                    results[key] = f"value-of-{key}"
                else:
                    results[key] = got.value
            except dibs.StoreUnavailable:
                unavailable += 1
                time.sleep(0.02)
    _append(out / f"results-{worker}.jsonl", {"results": results, "unavailable": unavailable})
    client.close()

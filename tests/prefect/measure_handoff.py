"""Measure hand-off latency: from the moment a holder finishes to the moment a waiter returns.

Not a test (no assertions, no thresholds): run it by hand and read the table::

    python -m tests.prefect.measure_handoff [--rounds 10]

Two long-lived worker processes (a holder and a waiter) take commands on stdin, so process start-up
is paid once, not per round. Per round the holder takes the key, the waiter starts waiting (and is
given time to block), then the holder finishes; the latency is the waiter's return time minus the
holder's finish time (``time.time()`` of one machine). Scenarios:

* ``lock/filesystem`` and ``lock/dibs``: Prefect's ``LockManager`` protocol alone: holder calls
  ``release_lock``, waiter's blocked ``acquire_lock`` returns.
* ``native/filesystem`` and ``native/dibs``: Prefect's own cache with SERIALIZABLE isolation in real
  flow runs: the holder's task function returns (then Prefect persists the result and releases the
  lock), the waiter's task call returns the cached value inside its flow.
* ``reserved``: ``@prefect_dibs.reserved``: the holder's function returns (then the artifact is
  stored), the waiter's task call returns it inside its flow.

The dibs store is a SQLite file (it wakes waiters through ``PRAGMA data_version``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

# -- the worker side -----------------------------------------------------------------------------------


def _lock_manager(kind: str, work: Path) -> Any:
    if kind == "filesystem":
        from prefect.locking.filesystem import FileSystemLockManager

        return FileSystemLockManager(work / "locks")
    from prefect_dibs import DibsLockManager

    return DibsLockManager(f"sqlite:///{work / 'dibs.db'}", ttl=30)


def _flow(kind: str, work: Path) -> Any:
    from prefect.cache_policies import INPUTS

    from prefect import flow, task
    from prefect_dibs import reserved

    def body(i: int, run: str) -> int:
        gate = work / f"gate-{run}-{i}"
        (work / f"started-{run}-{i}").touch()
        while not gate.exists():
            time.sleep(0.001)
        (work / f"finished-{run}-{i}").write_text(repr(time.time()))
        return i

    if kind == "reserved":
        job = reserved(f"sqlite:///{work / 'dibs.db'}", key="job-{run}-{i}", artifact=False)(task(body))
    else:
        policy = INPUTS.configure(isolation_level="SERIALIZABLE", lock_manager=_lock_manager(kind, work))
        job = task(cache_policy=policy, persist_result=True)(body)

    @flow
    def handoff(i: int, run: str) -> float:
        job(i, run)
        return time.time()

    return handoff


def worker(scenario: str, kind: str, role: str, work: Path) -> None:
    manager: Any = _lock_manager(kind, work) if scenario == "lock" else None
    handoff: Any = _flow(kind, work) if scenario != "lock" else None
    if manager is not None:
        manager.is_locked("warm-up")  # open the store now: measure hand-offs, not start-up
    print("ready", flush=True)
    for line in sys.stdin:
        command, i, run = line.split()
        key = f"key-{run}-{i}"
        if scenario == "lock":
            if command == "acquire":
                assert manager.acquire_lock(key, holder=role)
                print("held", flush=True)
            elif command == "release":
                finished = time.time()
                manager.release_lock(key, holder=role)
                print(f"finished {finished!r}", flush=True)
            elif command == "wait":
                print("waiting", flush=True)
                assert manager.acquire_lock(key, holder=role)
                returned = time.time()
                manager.release_lock(key, holder=role)
                print(f"returned {returned!r}", flush=True)
        else:
            if role == "waiter":
                print("waiting", flush=True)
            returned = handoff(int(i), run)
            print(f"returned {returned!r}", flush=True)


# -- the coordinator -------------------------------------------------------------------------------------


class Worker:
    def __init__(self, scenario: str, kind: str, role: str, work: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.prefect.measure_handoff",
                "--worker",
                scenario,
                kind,
                role,
                str(work),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd=Path(__file__).resolve().parents[2],
        )
        self.expect("ready")

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def expect(self, word: str) -> str:
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"worker exited while we expected {word!r}")
            if line.startswith(word):
                return line.strip()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.kill()
        self.proc.wait()


def measure(scenario: str, kind: str, rounds: int, env: dict[str, str]) -> list[float]:
    work = Path(tempfile.mkdtemp(prefix=f"handoff-{scenario}-{kind}-"))
    holder = Worker(scenario, kind, "holder", work, env)
    waiter = Worker(scenario, kind, "waiter", work, env)
    run = uuid.uuid4().hex[:8]
    latencies = []
    try:
        for i in range(rounds):
            if scenario == "lock":
                holder.send(f"acquire {i} {run}")
                holder.expect("held")
                waiter.send(f"wait {i} {run}")
                waiter.expect("waiting")
                # Let the waiter block, then finish at a random phase of its polling: a fixed delay
                # would line the release up with a poller's schedule and flatter it.
                time.sleep(random.uniform(0.3, 0.8))
                holder.send(f"release {i} {run}")
                finished = float(holder.expect("finished").split()[1])
                returned = float(waiter.expect("returned").split()[1])
            else:
                holder.send(f"run {i} {run}")
                while not (work / f"started-{run}-{i}").exists():
                    time.sleep(0.01)
                waiter.send(f"run {i} {run}")
                waiter.expect("waiting")
                time.sleep(random.uniform(2.0, 2.5))  # the waiter's flow run starts and blocks on the key
                (work / f"gate-{run}-{i}").touch()
                returned = float(waiter.expect("returned").split()[1])
                holder.expect("returned")
                finished = float((work / f"finished-{run}-{i}").read_text())
            latencies.append(returned - finished)
    finally:
        holder.close()
        waiter.close()
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--worker", nargs=4, metavar=("SCENARIO", "KIND", "ROLE", "WORK"))
    args = parser.parse_args()
    if args.worker:
        scenario, kind, role, work = args.worker
        worker(scenario, kind, role, Path(work))
        return

    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        env = dict(os.environ, PREFECT_API_URL=str(PREFECT_API_URL.value()))
        env["PREFECT_LOCAL_STORAGE_PATH"] = tempfile.mkdtemp(prefix="handoff-results-")
        rows = []
        for scenario, kind in [
            ("lock", "filesystem"),
            ("lock", "dibs"),
            ("native", "filesystem"),
            ("native", "dibs"),
            ("reserved", "reserved"),
        ]:
            latencies = measure(scenario, kind, args.rounds, env)
            rows.append((f"{scenario}/{kind}", latencies))
            print(json.dumps({"scenario": f"{scenario}/{kind}", "latencies": latencies}), flush=True)
    print(f"\n{'scenario':<20} {'n':>3} {'median ms':>10} {'mean ms':>8} {'min ms':>7} {'max ms':>7}")
    for name, values in rows:
        ms = [v * 1000 for v in values]
        print(
            f"{name:<20} {len(ms):>3} {statistics.median(ms):>10.1f} {statistics.fmean(ms):>8.1f} "
            f"{min(ms):>7.1f} {max(ms):>7.1f}"
        )


if __name__ == "__main__":
    main()

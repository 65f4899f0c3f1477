"""Flows the multi-process tests run in child processes: ``python -m tests.prefect.flows SCENARIO CONFIG``.

Each child is a real Prefect flow run against the session's API (``PREFECT_API_URL``). The expensive
task appends its pid to a count file when it *starts executing* (so the test counts executions,
not calls), then blocks until the test creates a gate file, so the test decides when the holder
finishes (or kills it first). A child prints one ``RESULT <json>`` line with what its flow returned.

Scenarios:

* ``reserved``: a task under ``@prefect_dibs.reserved`` (the dibs store is ``CONFIG["store"]``);
* ``native``: Prefect's own cache policy with SERIALIZABLE isolation, with ``CONFIG["manager"]``
  ``"dibs"`` (:class:`prefect_dibs.DibsLockManager`) or ``"filesystem"`` (Prefect's
  ``FileSystemLockManager``, wrapped to print ``ACQUIRING`` before it blocks);
* ``lock``: no flow, just take a ``DibsLockManager`` lock, print ``LOCKED`` and sleep (to be killed).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def _expensive(x: int, count_file: str, gate_file: str) -> dict[str, Any]:
    with open(count_file, "a") as out:  # O_APPEND: concurrent writers never interleave a short line
        out.write(f"{os.getpid()}\n")
    while not Path(gate_file).exists():
        time.sleep(0.02)
    return {"x": x, "squared": x * x, "computed_by": os.getpid()}


def reserved_flow(config: dict[str, Any]) -> Any:
    from prefect import flow, task
    from prefect_dibs import reserved

    @reserved(config["store"], key="square-{x}", ttl=config["ttl"], heartbeat_interval=config["ttl"] / 4)
    @task
    def square(x: int, count_file: str, gate_file: str) -> dict[str, Any]:
        return _expensive(x, count_file, gate_file)

    @flow(name=config["flow_name"])
    def compute(x: int) -> Any:
        return square(x, config["count_file"], config["gate_file"])

    return compute(config["x"])


def native_flow(config: dict[str, Any]) -> Any:
    from prefect.cache_policies import INPUTS
    from prefect.locking.filesystem import FileSystemLockManager

    from prefect import flow, task
    from prefect_dibs import DibsLockManager

    class ReportingFileSystemLockManager(FileSystemLockManager):
        def acquire_lock(self, *args: Any, **kwargs: Any) -> bool:
            print("ACQUIRING", flush=True)
            return super().acquire_lock(*args, **kwargs)

    manager: Any
    if config["manager"] == "dibs":
        manager = DibsLockManager(config["store"], ttl=config["ttl"], heartbeat_interval=config["ttl"] / 4)
    else:
        manager = ReportingFileSystemLockManager(Path(config["lock_dir"]))
    policy = INPUTS.configure(isolation_level="SERIALIZABLE", lock_manager=manager)

    @task(cache_policy=policy, persist_result=True)
    def square(x: int, count_file: str, gate_file: str) -> dict[str, Any]:
        return _expensive(x, count_file, gate_file)

    @flow(name=config["flow_name"])
    def compute(x: int) -> Any:
        return square(x, config["count_file"], config["gate_file"])

    return compute(config["x"])


def hold_lock(config: dict[str, Any]) -> None:
    from prefect_dibs import DibsLockManager

    manager = DibsLockManager(config["store"], ttl=config["ttl"], heartbeat_interval=config["ttl"] / 4)
    assert manager.acquire_lock(config["key"], holder=config["holder"], acquire_timeout=0)
    print("LOCKED", flush=True)
    while True:  # heartbeats run in the background until this process is killed
        time.sleep(60)


def main() -> None:
    scenario, raw = sys.argv[1], sys.argv[2]
    config = json.loads(raw)
    if scenario == "lock":
        hold_lock(config)
        return
    runner = {"reserved": reserved_flow, "native": native_flow}[scenario]
    result = runner(config)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

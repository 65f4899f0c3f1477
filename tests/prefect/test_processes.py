"""Real processes against one Prefect API and one SQLite dibs store.

Each child process is a flow run (see ``tests/prefect/flows.py``); the tests count executions in a
file, decide when the holder may finish (a gate file), and kill holders with SIGKILL. Every wait is
for a condition (a line in a file, a state in the API, a lease in the store), never for a fixed time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("prefect")

import dibs
from dibs.backoff import Backoff
from dibs.records import LeaseRecord
from tests.prefect.support import PYTHON, ROOT, wait_until
from tests.services import full_size

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")

TTL = 2.0  # short, so a killed holder is taken over quickly


class Child:
    """A child process whose output is collected by a thread, so tests can wait for a line."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def said(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def result(self, timeout: float = 120) -> Any:
        """What the child's flow returned (its ``RESULT`` line), after it exited successfully."""
        self.proc.wait(timeout=timeout)
        self._reader.join(timeout=30)
        out = "\n".join(self.lines)
        assert self.proc.returncode == 0, out
        results = [line for line in self.lines if line.startswith("RESULT ")]
        assert results, out
        return json.loads(results[-1].removeprefix("RESULT "))


class Children:
    """Child processes of one test, killed at the end whatever happened."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.started: list[Child] = []

    def start(self, scenario: str, config: dict[str, Any]) -> Child:
        proc = subprocess.Popen(
            [PYTHON, "-m", "tests.prefect.flows", scenario, json.dumps(config)],
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        child = Child(proc)
        self.started.append(child)
        return child

    def kill_all(self) -> None:
        for child in self.started:
            if child.proc.poll() is None:
                child.proc.kill()
            child.proc.wait()


@pytest.fixture
def children(child_env: dict[str, str]) -> Iterator[Children]:
    group = Children(child_env)
    try:
        yield group
    finally:
        group.kill_all()


def _pids(count_file: Path) -> list[int]:
    return [int(line) for line in count_file.read_text().split()] if count_file.exists() else []


def _task_runs_in_state(flow_name: str, state_name: str) -> list[Any]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        TaskRunFilter,
        TaskRunFilterState,
        TaskRunFilterStateName,
    )

    with get_client(sync_client=True) as client:
        return list(
            client.read_task_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])),
                task_run_filter=TaskRunFilter(
                    state=TaskRunFilterState(type=None, name=TaskRunFilterStateName(any_=[state_name]))
                ),
            )
        )


def _lease(client: dibs.Reservations, key: str) -> LeaseRecord | None:
    return client.status(key).lease


def _assert_taken_over_promptly(dead: LeaseRecord, new: LeaseRecord, client: dibs.Reservations) -> None:
    """The contract's liveness: one waiter takes over within ttl + one interval of the last heartbeat.

    Both times are the store's clock: ``dead.expires_at`` is the killed holder's last heartbeat + ttl,
    and a waiter re-asks right after the holder's expiry, so the takeover follows within one polling
    interval of the waiter.
    """
    assert new.owner != dead.owner
    assert new.token.fence == dead.token.fence + 1
    assert new.acquired_at >= dead.expires_at  # exclusion: never before the dead lease expired
    assert new.acquired_at - dead.expires_at <= Backoff().maximum + client.heartbeat_interval


def test_four_flow_runs_in_four_processes_compute_once(
    children: Children, dibs_url: str, tmp_path: Path
) -> None:
    flow_name = f"four-{uuid.uuid4().hex[:8]}"
    config: dict[str, Any] = {
        "store": dibs_url,
        "ttl": 30.0,
        "x": 7,
        "flow_name": flow_name,
        "count_file": str(tmp_path / "executions"),
        "gate_file": str(tmp_path / "gate"),
    }
    procs = [children.start("reserved", config) for _ in range(4)]

    wait_until(lambda: _pids(tmp_path / "executions"), what="one run to start computing")
    # All four overlap: the three others are visibly waiting (state "Waiting" in the API).
    wait_until(
        lambda: len(_task_runs_in_state(flow_name, "Waiting")) == 3, timeout=180, what="3 waiting runs"
    )
    Path(config["gate_file"]).touch()

    results = [proc.result() for proc in procs]
    executions = _pids(tmp_path / "executions")
    assert len(executions) == 1
    assert results == [{"x": 7, "squared": 49, "computed_by": executions[0]}] * 4
    with dibs.Reservations(dibs_url) as client:
        hit = client.get_or_reserve("square-7")
    assert isinstance(hit, dibs.Hit) and hit.value == results[0]
    assert hit.producer.startswith("prefect-task-run:")


def test_sigkilled_holder_is_taken_over_by_one_waiter(
    children: Children, dibs_url: str, tmp_path: Path
) -> None:
    flow_name = f"kill-{uuid.uuid4().hex[:8]}"
    config: dict[str, Any] = {
        "store": dibs_url,
        "ttl": TTL,
        "x": 3,
        "flow_name": flow_name,
        "count_file": str(tmp_path / "executions"),
        "gate_file": str(tmp_path / "gate"),
    }
    holder = children.start("reserved", config)
    wait_until(lambda: _pids(tmp_path / "executions"), what="the holder to start computing")
    waiters = [children.start("reserved", config) for _ in range(2)]
    wait_until(
        lambda: len(_task_runs_in_state(flow_name, "Waiting")) == 2, timeout=180, what="2 waiting runs"
    )

    with dibs.Reservations(dibs_url, ttl=TTL, heartbeat_interval=TTL / 4) as client:
        holder.kill()
        dead = _lease(client, "square-3")
        assert dead is not None

        def taken_over() -> LeaseRecord | None:
            lease = _lease(client, "square-3")
            return lease if lease is not None and lease.owner != dead.owner else None

        new = wait_until(taken_over, what="a waiter to take over")
        _assert_taken_over_promptly(dead, new, client)

    Path(config["gate_file"]).touch()
    results = [proc.result() for proc in waiters]
    executions = _pids(tmp_path / "executions")
    assert executions[0] == holder.pid and len(executions) == 2  # the dead holder, then one taker
    assert results == [{"x": 3, "squared": 9, "computed_by": executions[1]}] * 2


def test_dibs_lock_manager_is_taken_over_after_sigkill(children: Children, dibs_url: str) -> None:
    key, holder_name = "prefect-cache-key-0123abcd", "transaction-of-the-dead-holder"
    holder = children.start("lock", {"store": dibs_url, "ttl": TTL, "key": key, "holder": holder_name})
    wait_until(lambda: holder.said("LOCKED"), what="the child to lock")

    from prefect_dibs import DibsLockManager

    manager = DibsLockManager(dibs_url, ttl=TTL, heartbeat_interval=TTL / 4)
    assert manager.is_lock_holder(key, holder_name)
    assert not manager.acquire_lock(key, holder="me", acquire_timeout=0)
    holder.kill()
    dead = manager.client.status(manager._key(key)).lease
    assert dead is not None and dead.owner == holder_name

    assert manager.acquire_lock(key, holder="me", acquire_timeout=120)
    new = manager.client.status(manager._key(key)).lease
    assert new is not None
    _assert_taken_over_promptly(dead, new, manager.client)
    assert manager.is_lock_holder(key, "me") and not manager.is_lock_holder(key, holder_name)
    manager.release_lock(key, holder="me")
    assert not manager.is_locked(key)


def test_native_serializable_cache_survives_a_killed_holder_with_dibs_but_not_filesystem(
    children: Children, dibs_url: str, tmp_path: Path
) -> None:
    """Prefect's own cache (SERIALIZABLE) with DibsLockManager: a waiter takes over from a killed
    holder. The same scenario with Prefect's FileSystemLockManager, run alongside, is still stuck."""
    runs: dict[str, tuple[dict[str, Any], Child, Child]] = {}
    for manager in ("dibs", "filesystem"):
        work = tmp_path / manager
        work.mkdir()
        config: dict[str, Any] = {
            "manager": manager,
            "store": dibs_url,
            "lock_dir": str(work / "locks"),
            "ttl": TTL,
            "x": 5,
            "flow_name": f"native-{manager}-{uuid.uuid4().hex[:8]}",
            "count_file": str(work / "executions"),
            # x and the files are the task's inputs: the two scenarios have different cache keys
            "gate_file": str(work / "gate"),
        }
        holder = children.start("native", config)
        count_file = work / "executions"
        wait_until(lambda: _pids(count_file), what=f"the {manager} holder to compute")  # noqa: B023 (called at once)
        runs[manager] = (config, holder, children.start("native", config))

    dibs_config, dibs_holder, dibs_waiter = runs["dibs"]
    fs_config, fs_holder, fs_waiter = runs["filesystem"]
    # Both waiters are blocked on the lock: dibs says so in the API, the wrapped filesystem manager on stdout.
    wait_until(
        lambda: _task_runs_in_state(dibs_config["flow_name"], "Waiting"), timeout=180, what="dibs waiter"
    )
    wait_until(lambda: fs_waiter.said("ACQUIRING"), timeout=180, what="the filesystem waiter to block")

    for holder in (dibs_holder, fs_holder):
        holder.kill()
    for config in (dibs_config, fs_config):
        Path(config["gate_file"]).touch()

    result = dibs_waiter.result()
    dibs_executions = _pids(Path(dibs_config["count_file"]))
    assert dibs_executions == [dibs_holder.pid, result["computed_by"]]
    assert result == {"x": 5, "squared": 25, "computed_by": dibs_waiter.pid}

    # By now the dibs waiter has waited out its ttl and finished; the filesystem one is still blocked
    # on the dead holder's lock file, which has no expiry.
    assert fs_waiter.proc.poll() is None
    assert _pids(Path(fs_config["count_file"])) == [fs_holder.pid]
    (lock_file,) = Path(fs_config["lock_dir"]).glob("*.lock")
    assert json.loads(lock_file.read_text())["expiration"] is None


#: Seconds the dibs store stays down under waiting flow runs: a managed database's failover (20-60 s
#: on the big clouds) at full size; in CI 10 s, still twice what failed every waiter before (5 s).
OUTAGE = 30.0 if full_size() else 10.0


def test_waiting_flow_runs_ride_out_a_store_restart(
    children: Children, restartable_postgres: Any, tmp_path: Path
) -> None:
    """Three flow runs in three processes on a PostgreSQL store that restarts, OUTAGE s down, while two of
    them wait: the waiters keep waiting (they hold nothing: ``outage_patience``), and every run ends
    with the one computation's value once the store is back (issue 29)."""
    flow_name = f"outage-{uuid.uuid4().hex[:8]}"
    store = restartable_postgres.url(schema=f"t_{uuid.uuid4().hex[:12]}", timeout="2")
    config: dict[str, Any] = {
        "store": store,
        "ttl": OUTAGE + 30,  # the holder's lease outlives the outage: nobody takes it over meanwhile
        "x": 5,
        "flow_name": flow_name,
        "count_file": str(tmp_path / "executions"),
        "gate_file": str(tmp_path / "gate"),
    }
    holder = children.start("reserved", config)
    wait_until(lambda: _pids(tmp_path / "executions"), what="the holder to start computing")
    waiters = [children.start("reserved", config) for _ in range(2)]
    wait_until(
        lambda: len(_task_runs_in_state(flow_name, "Waiting")) == 2, timeout=180, what="2 waiting runs"
    )
    restartable_postgres.restart(OUTAGE)  # every connection cut, the server down OUTAGE s, then back
    Path(config["gate_file"]).touch()
    results = [child.result(timeout=OUTAGE + 180) for child in (holder, *waiters)]
    executions = _pids(tmp_path / "executions")
    assert executions == [holder.pid]  # one computation, through the restart
    assert results == [{"x": 5, "squared": 25, "computed_by": holder.pid}] * 3

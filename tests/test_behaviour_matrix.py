"""One behaviour matrix: the same scenarios through every front end, the same events and outcome.

Every front end drives the one compute-once flow (:mod:`dibs.flow`), so a scenario must look the same
from each of them: the same sequence of events (heard by a process-wide observer) and the same ending.
The front ends in this process are ``Reservations.compute``, ``AsyncReservations.compute``, the Airflow
operator and ``@task.reserved`` (``execute`` called directly, waiting in the worker), a ``prefect_dibs``
``@reserved`` function, and (for the scenarios that ask a lock the same question) ``DibsLockManager``;
``dibs run`` runs as a real subprocess, so only its outcome (the ``--json`` envelope, or its exit
status) is compared. Each scenario runs on SQLite and on PostgreSQL.

The other party of a scenario (a holder that completes, fails or dies) acts through a plain client
when the front end reports ``key_busy``: the events are then the same however the threads interleave.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import json
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import dibs
from tests.cli_harness import dibs as run_dibs
from tests.cli_harness import running

#: Nothing listens on port 1: a store that refuses connections at once.
UNREACHABLE = "postgresql+psycopg://postgres@127.0.0.1:1/dibs"
KEY = "matrix"
OTHER = "other-worker"
NEXT = "next-worker"
LOCK_HOLDER = "matrix-holder"
VALUE = {"rows": 3}


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    events: tuple[str, ...]
    outcome: str
    #: What the front end's call gets: ``ttl``, ``timeout``, ``refresh``, ``max_age``, ``policy``.
    call: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: The error the call ends with (``None``: it returns the value).
    raises: type[BaseException] | None = None
    cli: bool = True  # whether dibs run can play it


COMPUTED = ("asked", "lease_acquired", "artifact_stored", "finished")
AFTER_A_WAIT = ("asked", "key_busy", "waited", "lease_acquired", "artifact_stored", "finished")
SCENARIOS = [
    Scenario("compute", COMPUTED, "computed"),
    Scenario("hit", ("asked", "artifact_found", "finished"), "hit"),
    Scenario("wait", ("asked", "key_busy", "waited", "artifact_found", "finished"), "waited"),
    Scenario("holder_changes", ("asked", "key_busy", "holder_changed", "waited", "artifact_found",
                                "finished"), "waited", cli=False),  # a CLI waiter may win the key between
    Scenario("holder_dies", AFTER_A_WAIT, "took_over"),
    Scenario("holder_fails", AFTER_A_WAIT, "computed"),
    Scenario("work_fails", ("asked", "lease_acquired", "work_failed", "lease_released", "finished"), "failed",
             raises=ValueError),
    Scenario("stop", ("asked", "lease_acquired", "work_failed", "lease_released", "finished"), "failed",
             raises=KeyboardInterrupt, cli=False),
    Scenario("store_down_at_first_ask", ("asked", "ran_unreserved", "finished"), "unreserved",
             call={"policy": "run"}, cli=False),
    Scenario("store_down_at_first_ask_fail", ("asked", "finished"), "failed",
             raises=dibs.StoreUnavailable),
    Scenario("store_down_at_complete", ("asked", "lease_acquired", "not_stored", "finished"), "computed",
             call={"policy": "run", "ttl": 1.0}, cli=False),
    Scenario("store_down_at_complete_fail", ("asked", "lease_acquired", "finished"), "failed",
             call={"policy": "fail", "ttl": 1.0}, raises=dibs.StoreUnavailable, cli=False),
    Scenario("refresh", COMPUTED, "computed", call={"refresh": True}),
    # Another refresh holds the key: its value is the fresh one, shared (not the old, not computed again).
    Scenario("refresh_while_busy", ("asked", "key_busy", "waited", "artifact_found", "finished"), "waited",
             call={"refresh": True}),
    Scenario("max_age", COMPUTED, "computed", call={"max_age": 0.05}),
    Scenario("timeout", ("asked", "key_busy", "waited", "finished"), "failed", call={"timeout": 0},
             raises=dibs.WaitTimeout),
]  # fmt: skip


# -- the front ends: each computes KEY with ``work`` and returns its value ------------------------------
Work = Callable[[], Any]


def python_frontend(url: str, work: Work, call: dict[str, Any], tmp_path: Path) -> Any:
    with dibs.Reservations(url, **_client_settings(call)) as client:
        return (
            client.run(KEY, work)
            if not _per_call(call)
            else client.compute(KEY, work, **_per_call(call)).value
        )


def python_call_frontend(url: str, work: Work, call: dict[str, Any], tmp_path: Path) -> Any:
    """``Reservations.call`` with the store-down policy given for the call, the client's the other one:
    the call's policy must decide at every step (its first ask, its ``complete``)."""
    from dibs.seam import StoreIO

    policy = call.get("policy", "fail")
    other = {**call, "policy": "run" if policy == "fail" else "fail"}
    with dibs.Reservations(url, **_client_settings(other)) as client:
        reserved = client.call(KEY, on_store_unavailable=policy, **_per_call(call))
        return reserved.drive(StoreIO(client, work, emit=reserved.emitter)).value


def async_frontend(url: str, work: Work, call: dict[str, Any], tmp_path: Path) -> Any:
    async def awork() -> Any:
        try:
            return work()
        except KeyboardInterrupt:
            raise asyncio.CancelledError from None  # how a coroutine's work is stopped

    async def main() -> Any:
        with dibs.Reservations(url, **_client_settings(call)) as client:
            return (await client.aio().compute(KEY, awork, **_per_call(call))).value

    try:
        return asyncio.run(main())
    except asyncio.CancelledError:
        raise KeyboardInterrupt from None


def airflow_frontend(url: str, work: Work, call: dict[str, Any], tmp_path: Path) -> Any:
    _airflow_environment(tmp_path)
    from dibs_provider.operators.reserved import ReservedPythonOperator

    with _dibs_connection(url, call):
        operator = ReservedPythonOperator(
            task_id="t",
            python_callable=work,
            reservation_key=KEY,
            dibs_conn_id="dibs_matrix",
            reservation_deferrable=False,
            reservation_wait_timeout=call.get("timeout"),
            reservation_max_age=call.get("max_age"),
            reservation_refresh=call.get("refresh", False),
        )
        ti = _TaskInstance()
        return operator.execute({"ti": ti, "task_instance": ti, "run_id": "run_1"})  # type: ignore[arg-type]


@contextlib.contextmanager
def _dibs_connection(url: str, call: dict[str, Any]) -> Iterator[None]:
    """The Airflow connection ``dibs_matrix`` on ``url``, with the call's policy and ttl."""
    extra = {"store_url": url, "on_store_unavailable": call.get("policy", "fail")}
    for setting in ("ttl", "outage_patience"):
        if setting in call:
            extra[setting] = call[setting]
    os.environ["AIRFLOW_CONN_DIBS_MATRIX"] = json.dumps({"conn_type": "dibs", "extra": extra})
    try:
        yield
    finally:
        del os.environ["AIRFLOW_CONN_DIBS_MATRIX"]


def airflow_task_frontend(url: str, work: Work, call: dict[str, Any], tmp_path: Path) -> Any:
    """``@task.reserved``: the operator a TaskFlow task decorated with it builds."""
    _airflow_environment(tmp_path)
    from dibs_provider.decorators.reserved import _ReservedDecoratedOperator

    def build() -> Any:
        return work()

    with _dibs_connection(url, call):
        operator = _ReservedDecoratedOperator(
            task_id="t",
            python_callable=build,
            key=KEY,
            conn_id="dibs_matrix",
            deferrable=False,
            wait_timeout=call.get("timeout"),
            max_age=call.get("max_age"),
            refresh=call.get("refresh", False),
        )
        ti = _TaskInstance()
        return operator.execute({"ti": ti, "task_instance": ti, "run_id": "run_1"})  # type: ignore[arg-type]


def lock_frontend(url: str, work: Work, call: dict[str, Any], tmp_path: Path) -> Any:
    """prefect_dibs's ``DibsLockManager`` as Prefect's SERIALIZABLE isolation uses it: take the lock,
    run the work, release it. A lock stores no artifact, and a lock not taken within its timeout is
    ``False`` (here raised as the same ``WaitTimeout`` the other front ends raise, to compare them)."""
    from prefect_dibs import DibsLockManager

    manager = DibsLockManager(url, namespace="default", ttl=call.get("ttl", 30.0))
    if not manager.acquire_lock(KEY, holder=LOCK_HOLDER, acquire_timeout=call.get("timeout")):
        raise dibs.WaitTimeout("the lock was not taken within its acquire_timeout")
    try:
        return work()
    finally:
        manager.release_lock(KEY, holder=LOCK_HOLDER)


def prefect_frontend(url: str, work: Work, call: dict[str, Any], tmp_path: Path) -> Any:
    from prefect_dibs import reserved

    def build() -> Any:
        return work()

    client = dibs.Reservations(url, **_client_settings(call), max_age=call.get("max_age"))
    with client:
        wrapped = reserved(client, key=KEY, timeout=call.get("timeout"), refresh=call.get("refresh", False))(
            build
        )
        return wrapped()


FRONTENDS = {
    "python": python_frontend,
    "python_call": python_call_frontend,
    "async": async_frontend,
    "airflow": airflow_frontend,
    "airflow_task": airflow_task_frontend,
    "prefect": prefect_frontend,
}

#: The scenarios that ask a lock the same question: take it, take it over from a holder that died,
#: see the failure a holder recorded, time out, find the store down. (A lock stores no artifact, so
#: there is no hit, no wait for a value, no refresh; it records no failure of its own: Prefect's
#: rollback releases it.)
LOCK_SCENARIOS = {
    "compute",
    "holder_dies",
    "holder_fails",
    "timeout",
    "store_down_at_first_ask_fail",
}
#: What only a lock is asked: its holder (Prefect's id for a transaction, whatever process runs it)
#: already holds the key, through another manager, and takes it again at once (re-entry; the timeout
#: only bounds a re-entry that would wait instead).
LOCK_ONLY = [Scenario("reenter", COMPUTED, "computed", call={"timeout": 60.0}, cli=False)]


def _client_settings(call: dict[str, Any]) -> dict[str, Any]:
    return {"ttl": call.get("ttl", 30.0), "on_store_unavailable": call.get("policy", "fail")}


def _per_call(call: dict[str, Any]) -> dict[str, Any]:
    names = {"timeout", "refresh", "max_age"}
    return {name: value for name, value in call.items() if name in names}


class _TaskInstance:
    dag_id, run_id, task_id, map_index, try_number = "dag", "run_1", "t", -1, 1

    def __init__(self) -> None:
        self.xcoms: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[key] = value


def _airflow_environment(tmp_path: Path) -> None:
    """Airflow reads its configuration when first imported: give it a throw-away home (as
    tests/airflow/conftest.py does for its own tests), unless it is imported already."""
    pytest.importorskip("airflow.sdk")
    if "airflow" not in sys.modules or "AIRFLOW_HOME" not in os.environ:
        home = Path(tempfile.mkdtemp(prefix="dibs-matrix-airflow-"))
        os.environ.setdefault("AIRFLOW_HOME", str(home))
        os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")


# -- the stores and the other party ---------------------------------------------------------------------
@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    module = importlib.import_module(f"tests.backends.{request.param}")
    with module.isolated_url(tmp_path) as isolated:
        yield isolated


class Stage:
    """Sets a scenario up on the store, and plays the other party when the front end finds KEY busy."""

    def __init__(self, url: str, scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
        self.url, self.scenario = url, scenario
        # Kept open for the whole test: every client of this process shares its store object.
        self.client = dibs.Reservations(url, ttl=30)
        self.held: dibs.Lease | None = None
        self.next: dibs.Lease | None = None
        self.dying: dibs.KeepAlive | None = None
        self.locks: Any = None  # the reenter scenario's other manager (a DibsLockManager)
        name = scenario.name
        if name in {"hit", "refresh", "max_age"}:
            got = self.client.get_or_reserve(KEY, owner=OTHER)
            assert isinstance(got, dibs.Acquired)
            got.lease.complete(VALUE if name == "hit" else {"old": True})
            if name == "max_age":  # until the store's clock says the artifact is older than max_age
                _eventually(lambda: _age(self.client) > scenario.call["max_age"])
        elif name in {"wait", "holder_fails", "timeout"}:
            self.held = self._hold(ttl=30)
        elif name == "refresh_while_busy":
            got = self.client.get_or_reserve(KEY, owner=OTHER)
            assert isinstance(got, dibs.Acquired)
            got.lease.complete({"old": True})
            self.held = self._hold(ttl=30, refresh=True)
        elif name == "reenter":  # the lock's holder took it through another manager (another process)
            from prefect_dibs import DibsLockManager

            self.locks = DibsLockManager(url, namespace="default")
            assert self.locks.acquire_lock(KEY, holder=LOCK_HOLDER)
        elif name == "holder_changes":  # short: a waiter that only asks at its expiry is not slow
            self.held = self._hold(ttl=2.0)
        elif name == "holder_dies":
            # Alive (heartbeating) until the front end finds it busy, however long the front end takes
            # to get there on a busy machine; then it stops, expires, and the waiter takes over.
            self.dying = self._hold(ttl=1.0).keep_alive(interval=0.2)
            self.dying.__enter__()
        elif name.startswith("store_down_at_complete"):

            def unreachable(*args: Any, **kwargs: Any) -> Any:
                raise dibs.StoreUnavailable("the store went away (matrix)")

            monkeypatch.setattr(self.client.store, "complete", unreachable)

    def _hold(self, ttl: float, *, refresh: bool = False) -> dibs.Lease:
        with dibs.Reservations(self.url, ttl=ttl) as short:
            got = short.get_or_reserve(KEY, owner=OTHER, refresh=refresh)
        assert isinstance(got, dibs.Acquired)
        return dibs.Lease(self.client, got.lease.record)

    def on_busy(self) -> None:
        """The front end found KEY busy and is about to wait: the holder completes, fails or dies now."""
        self._die()
        if self.held is None:
            return
        held, self.held = self.held, None
        if self.scenario.name in {"wait", "refresh_while_busy"}:
            held.complete(VALUE)
        elif self.scenario.name == "holder_fails":
            held.release(RuntimeError("the holder failed"))
        elif self.scenario.name == "holder_changes":  # it passes to another worker
            held.release()
            got = self.client.get_or_reserve(KEY, owner=NEXT)
            assert isinstance(got, dibs.Acquired)
            self.next = got.lease

    def on_changed(self) -> None:
        """The front end saw the key pass to the next worker: that one completes it."""
        if self.next is not None:
            self.next.complete(VALUE)
            self.next = None

    def target(self) -> str:
        return UNREACHABLE if self.scenario.name.startswith("store_down_at_first_ask") else self.url

    def _die(self) -> None:
        """The dying holder stops heartbeating (as a killed one does): its lease runs out its ttl."""
        dying, self.dying = self.dying, None
        if dying is not None:
            dying.__exit__(None, None, None)

    def close(self) -> None:
        self._die()
        try:
            if self.locks is not None:  # its heartbeats would outlive the test, and the test's schema
                self.locks.release_all()
        finally:
            self.client.close()


def _heartbeat_threads() -> set[object]:
    """The leases' heartbeat threads running, and the keepers whose thread is still to start (the
    launcher starts it when the first heartbeat is due, a third of a ttl after it began)."""
    from dibs.lease import _LAUNCHER

    with _LAUNCHER._condition:
        pending: set[object] = set(_LAUNCHER._due)
    running = {
        thread
        for thread in threading.enumerate()
        if thread.name.startswith("dibs-heartbeat-") and thread.name != "dibs-heartbeat-launcher"
    }
    return pending | running


def _age(client: dibs.Reservations) -> float:
    state = client.status(KEY)
    assert state.artifact is not None
    return state.now - state.artifact.created_at


def _eventually(condition: Callable[[], bool], what: str = "the store's clock to move on") -> None:
    from tests.cli_harness import eventually

    eventually(condition, what)


def _work(scenario: Scenario) -> Work:
    def work() -> Any:
        if scenario.name == "work_fails":
            raise ValueError("bad day")
        if scenario.name == "stop":
            raise KeyboardInterrupt
        return VALUE

    return work


# -- the matrix -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
@pytest.mark.parametrize("frontend", sorted(FRONTENDS))
def test_every_front_end_reports_the_same_steps_and_ending(
    frontend: str, scenario: Scenario, url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _play(
        FRONTENDS[frontend],
        _frontend_name(frontend),
        scenario,
        expected=scenario.events,
        url=url,
        tmp_path=tmp_path,
        monkeypatch=monkeypatch,
    )


@pytest.mark.parametrize(
    "scenario", [s for s in SCENARIOS if s.name in LOCK_SCENARIOS] + LOCK_ONLY, ids=lambda s: s.name
)
def test_a_prefect_lock_reports_the_same_steps_and_ending(
    scenario: Scenario, url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``DibsLockManager`` drives the same flow: the same events (but the artifact a lock never
    stores) and the same ending."""
    pytest.importorskip("prefect")
    expected = tuple(name for name in scenario.events if name != "artifact_stored")
    _play(
        lock_frontend,
        "prefect",
        scenario,
        expected=expected,
        url=url,
        tmp_path=tmp_path,
        monkeypatch=monkeypatch,
    )


def _play(
    frontend: Callable[[str, Work, dict[str, Any], Path], Any],
    frontend_name: str,
    scenario: Scenario,
    *,
    expected: tuple[str, ...],
    url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    running_before = _heartbeat_threads()
    stage = Stage(url, scenario, monkeypatch)
    heard: list[dibs.Event] = []

    def observe(event: dibs.Event) -> None:
        heard.append(event)
        if isinstance(event, dibs.KeyBusy):
            stage.on_busy()
        elif isinstance(event, dibs.HolderChanged):
            assert (event.previous, event.holder) == (OTHER, NEXT)
            stage.on_changed()

    try:
        with dibs.observe(observe):
            if scenario.raises is None:
                value = frontend(stage.target(), _work(scenario), scenario.call, tmp_path)
                assert value == VALUE
            else:
                with pytest.raises(scenario.raises):
                    frontend(stage.target(), _work(scenario), scenario.call, tmp_path)
    finally:
        stage.close()
    # Every lease's heartbeats end with the call that took it (a thread left heartbeating keeps a
    # lease alive that nobody works under, and outlives its store). A thread that found its lease
    # released and is returning may take a moment to leave ``threading.enumerate()``.
    _eventually(lambda: not (_heartbeat_threads() - running_before), "the call's heartbeats to end")
    assert tuple(event.name for event in heard) == expected
    finished = heard[-1]
    assert isinstance(finished, dibs.Finished) and finished.outcome == scenario.outcome
    assert {event.call for event in heard} == {finished.call}  # one call, one number
    assert {event.frontend for event in heard} == {frontend_name}
    assert {event.store for event in heard} == {stage.target().split(":")[0].split("+")[0]}
    if scenario.name.startswith("store_down_at_complete"):
        assert finished.stored is False
    if scenario.name == "holder_fails":
        (acquired,) = [e for e in heard if isinstance(e, dibs.LeaseAcquired)]
        assert acquired.last_failure == "RuntimeError: the holder failed"
    if scenario.name == "holder_dies":
        assert finished.took_over_from == OTHER
    if scenario.name in {"stop", "work_fails"}:  # a stop is recorded, but is no failure
        (failed,) = [e for e in heard if isinstance(e, dibs.WorkFailed)]
        assert failed.counted is (scenario.name == "work_fails")


def _frontend_name(frontend: str) -> str:
    return {"async": "python", "python_call": "python", "airflow_task": "airflow"}.get(frontend, frontend)


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s.cli], ids=lambda s: s.name)
def test_dibs_run_ends_the_same_way(scenario: Scenario, url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``dibs run`` in its own process: the same scenarios end the same way (its ``--json`` envelope,
    or a failing exit status)."""
    stage = Stage(url, scenario, monkeypatch)
    call = scenario.call
    script = "import sys; sys.exit(3)" if scenario.name == "work_fails" else "print('built')"
    args = ["--json", "-v", "run", "--store", stage.target(), "--key", KEY, "--ttl", str(call.get("ttl", 30))]
    args += ["--timeout", str(call["timeout"])] if "timeout" in call else []
    args += ["--refresh"] if call.get("refresh") else []
    args += ["--max-age", str(call["max_age"])] if "max_age" in call else []
    command = ["--", sys.executable, "-c", script]
    try:
        if scenario.name in {"wait", "holder_fails", "refresh_while_busy"}:
            with running(*args, *command) as waiter:
                waiter.wait_for_line(f'"holder": "{OTHER}"')
                stage.on_busy()
                status, stdout = waiter.finish(), waiter.stdout.decode()
        else:
            stage._die()  # a dying holder: the subprocess is not watched, so it dies now
            result = run_dibs(*args, *command, check=False)
            status, stdout = result.returncode, result.stdout
    finally:
        stage.close()
    if scenario.outcome == "failed":
        assert status != 0
        return
    assert status == 0, stdout
    envelope = json.loads(stdout.splitlines()[-1])
    outcome = "took_over" if envelope["took_over_from"] else envelope["role"]
    assert outcome == scenario.outcome


@pytest.mark.parametrize("policy", ["fail", "run"])
@pytest.mark.parametrize("waiter", ["operator", "sensor"])
def test_a_store_error_in_the_triggerer_ends_the_operator_and_the_sensor_as_the_flow_decides(
    waiter: str, policy: str, tmp_path: Path
) -> None:
    """A deferred operator and a deferred sensor wait in the same trigger. A store it could not reach
    for the connection's ``outage_patience`` ends the wait with the store's error, and the flow decides
    as for any waiter whose outage outlasted its patience: ``on_store_unavailable`` (the operator used
    to ask again whatever the policy, the sensor raised). A sensor has nothing to run: it fails with
    the error under either policy. The store here refuses every connection."""
    pytest.importorskip(
        "psycopg", reason="the unreachable store is a PostgreSQL URL: pip install 'dibs[postgres]'"
    )
    _airflow_environment(tmp_path)
    from dibs_provider.operators.reserved import ReservedPythonOperator
    from dibs_provider.sensors.reservation import ReservationSensor
    from dibs_provider.triggers.reservation import ReservationTrigger

    heard: list[dibs.Event] = []
    with (
        _dibs_connection(UNREACHABLE, {"outage_patience": 0.3, "policy": policy}),
        dibs.observe(heard.append),
    ):
        trigger = ReservationTrigger(
            KEY, dibs_conn_id="dibs_matrix", for_artifact=waiter == "sensor", timeout=600
        )

        async def first() -> dict[str, Any]:
            fired: dict[str, Any] = (await anext(trigger.run())).payload
            return fired

        fired = asyncio.run(first())
        assert (fired["status"], fired["error_type"]) == ("error", "StoreUnavailable")
        task: Any = (
            ReservationSensor(task_id="t", key=KEY, dibs_conn_id="dibs_matrix")
            if waiter == "sensor"
            else ReservedPythonOperator(
                task_id="t", python_callable=lambda: VALUE, reservation_key=KEY, dibs_conn_id="dibs_matrix"
            )
        )
        ti = _TaskInstance()
        context = {"ti": ti, "task_instance": ti, "run_id": "run_1"}
        if waiter == "operator" and policy == "run":
            assert task.execute_complete(context, event=fired) == VALUE
            assert ti.xcoms["dibs_outcome"]["role"] == "unreserved"
            assert [event.name for event in heard][-3:] == ["waited", "ran_unreserved", "finished"]
        else:
            with pytest.raises(dibs.StoreUnavailable, match=r"127\.0\.0\.1"):
                task.execute_complete(context, event=fired)

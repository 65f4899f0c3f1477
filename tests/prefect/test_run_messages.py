"""What a waiting Prefect run tells people, read back from the session's Prefect API: whom it waits on
(a run, not Prefect's random lock holder id), a key that changes hands while it waits, a takeover
and why, waits inside a flow-level transaction, and waiting time that is only waiting.

Every change of holder is made certain, not timed: a waiter's next question to the store is held back
(``gate``) until the test has arranged who holds the key, and an expiry is the store's decision,
awaited by polling.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any
from uuid import UUID

import pytest

pytest.importorskip("prefect")

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId, LogFilterTaskRunId
from prefect.context import FlowRunContext, TaskRunContext
from prefect.exceptions import ObjectNotFound
from prefect.results import ResultStore
from prefect.transactions import IsolationLevel, transaction

import dibs
import prefect_dibs.tasks
from dibs.outcomes import RunReport
from dibs.stores import AcquireRequest
from prefect import flow, task
from prefect_dibs import DibsLockManager, reserved
from tests.prefect.support import wait_until

BOUND = 120.0


def _task_run(task_run_id: UUID) -> Any:
    with get_client(sync_client=True) as api:
        return api.read_task_run(task_run_id)


def _logs(*, task_run_id: UUID | None = None, flow_run_id: UUID | None = None) -> list[str]:
    log_filter = (
        LogFilter(task_run_id=LogFilterTaskRunId(any_=[task_run_id]))
        if task_run_id is not None
        else LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]), task_run_id=None)
    )
    with get_client(sync_client=True) as api:
        return [log.message for log in api.read_logs(log_filter=log_filter)]


def _line(what: str, **run: UUID) -> str:
    """The first log line of the run containing ``what`` (polled: logs reach the API in batches)."""
    lines: list[str] = wait_until(lambda: [m for m in _logs(**run) if what in m], what=repr(what))
    return lines[0]


def _state(task_run_id: UUID, name: str, mentioning: str) -> Any:
    """The task run's state once the API shows it named ``name`` with ``mentioning`` in its message."""

    def shown() -> Any:
        try:
            state = _task_run(task_run_id).state
        except ObjectNotFound:  # the API records a run from its events, a little later
            return None
        return state if state and state.name == name and mentioning in (state.message or "") else None

    return wait_until(shown, what=f"a {name!r} state mentioning {mentioning!r}")


class Gate:
    """Hold back the asks (the store's ``acquire``) of owners starting with ``owner`` that would find
    the key free (its holder's lease gone), until :meth:`open`: the waiter sees that the lease expired,
    but somebody else takes the key over first. The store object is shared per process: other owners,
    and asks that find the key still held, pass."""

    def __init__(self, client: dibs.Reservations, monkeypatch: pytest.MonkeyPatch, owner: str) -> None:
        self._opened = threading.Event()
        self.held = threading.Event()  # set once a call is being held back
        store = client.store
        real = store.acquire

        def gated(key: Any, request: AcquireRequest) -> Any:
            if (
                request.owner.startswith(owner)
                and not self._opened.is_set()
                and store.read(key).live_lease is None
            ):
                self.held.set()
                assert self._opened.wait(BOUND), "the test never opened the gate"
            return real(key, request)

        monkeypatch.setattr(store, "acquire", gated)

    def open(self) -> None:
        self._opened.set()


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    return thread, out


def _locks(url: str) -> DibsLockManager:
    return DibsLockManager(url, ttl=1, heartbeat_interval=0.25)


# -- DibsLockManager ------------------------------------------------------------------------------------
def test_a_lock_wait_names_the_task_run_holding_it_and_follows_a_takeover(
    dibs_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = f"lock-{uuid.uuid4().hex[:8]}"
    holding, waiting, taking_over = _locks(dibs_url), _locks(dibs_url), _locks(dibs_url)
    started, finish = threading.Event(), threading.Event()
    task_runs: dict[str, tuple[UUID, str]] = {}

    def in_transaction(manager: DibsLockManager, name: str) -> None:
        ctx = TaskRunContext.get()
        assert ctx is not None
        task_runs[name] = (ctx.task_run.id, ctx.task_run.name)
        store = ResultStore(lock_manager=manager)
        with transaction(key=key, store=store, isolation_level=IsolationLevel.SERIALIZABLE):
            if name == "hold":
                started.set()
                assert finish.wait(BOUND)

    @task
    def hold() -> None:
        in_transaction(holding, "hold")

    @task
    def wait() -> None:
        in_transaction(waiting, "wait")

    @flow
    def holder_flow() -> None:
        hold()

    @flow
    def waiter_flow() -> None:
        wait()

    holder_thread, _ = _in_thread(holder_flow)
    assert started.wait(BOUND)
    owner = holding.client.status(holding._key(key)).live_lease.owner  # type: ignore[union-attr]
    hold_id, hold_name = task_runs["hold"]
    hold_run = f"prefect-task-run:{hold_name}:{hold_id}"
    assert owner.startswith(f"{hold_run}#")  # the run, then Prefect's holder id

    gate = Gate(waiting.client, monkeypatch, "prefect-task-run:wait-")
    waiter_thread, _ = _in_thread(waiter_flow)
    wait_until(lambda: "wait" in task_runs, what="the waiting task run to start")
    waiter_run, _ = task_runs["wait"]
    state = _state(waiter_run, "Waiting", hold_run)
    assert state.message == f"waiting for the cache lock {key!r} held by {hold_run!r}"  # not the holder id
    assert hold_run in _line("waiting for the cache lock", task_run_id=waiter_run)

    # The holding run freezes (no more heartbeats); another holder takes the lock over at its expiry,
    # while the waiter's next question is held back, so the key changes hands under the waiter.
    holding._held[holding._key(key)].keeper.stop()  # type: ignore[union-attr]
    wait_until(
        lambda: taking_over.acquire_lock(key, holder="new-holder", acquire_timeout=0), what="a takeover"
    )
    gate.open()
    _state(waiter_run, "Waiting", "'new-holder'")
    assert "changed hands: now held by 'new-holder'" in _line("changed hands", task_run_id=waiter_run)

    taking_over.release_lock(key, holder="new-holder")
    waiter_thread.join(BOUND)
    _state(waiter_run, "Completed", "")
    finish.set()
    holder_thread.join(BOUND)
    assert not waiter_thread.is_alive() and not holder_thread.is_alive()
    assert not holding.is_locked(key)


def test_a_flow_level_transaction_says_in_the_flow_run_whom_it_waits_for_and_why_it_took_over(
    dibs_url: str,
) -> None:
    key = f"flow-lock-{uuid.uuid4().hex[:8]}"
    other, ours = _locks(dibs_url), _locks(dibs_url)
    assert other.acquire_lock(key, holder="other-process")
    flow_runs: list[UUID] = []

    @flow
    def guarded() -> str:
        ctx = FlowRunContext.get()
        assert ctx is not None and ctx.flow_run is not None
        flow_runs.append(ctx.flow_run.id)
        with transaction(
            key=key, store=ResultStore(lock_manager=ours), isolation_level=IsolationLevel.SERIALIZABLE
        ):
            return "done"

    thread, result = _in_thread(guarded)
    wait_until(lambda: flow_runs, what="the flow run to start")
    (flow_run,) = flow_runs
    assert "held by 'other-process'" in _line("waiting for the cache lock", flow_run_id=flow_run)
    # The other process freezes: its lock expires after its ttl.
    other._held[other._key(key)].keeper.stop()  # type: ignore[union-attr]
    thread.join(BOUND)
    assert result == ["done"]
    took_over = _line("took over the cache lock", flow_run_id=flow_run)
    assert "from 'other-process': its holder stopped heartbeating, so its lease expired" in took_over
    ours.release_all()


# -- @reserved ------------------------------------------------------------------------------------------
def test_a_reserved_task_follows_a_takeover_while_it_waits(
    dibs_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = f"taken-{uuid.uuid4().hex[:8]}"
    with dibs.Reservations(dibs_url, ttl=1) as short:
        dead = short.get_or_reserve(key, owner="dead-worker")
    assert isinstance(dead, dibs.Acquired)
    # Alive until the task run waits on it, however long the run takes to start on a busy machine; then
    # it stops heartbeating, as a dead worker does, and expires a second later.
    dying = dead.lease.keep_alive(interval=0.2)
    dying.__enter__()
    waiting_client = prefect_dibs.tasks.resolve_client(dibs_url, prefect_dibs.tasks.ClientSettings())
    gate = Gate(waiting_client, monkeypatch, "prefect-task-run:build-")
    task_runs: list[UUID] = []

    @reserved(dibs_url, key=key)
    @task
    def build() -> str:
        raise AssertionError("the new holder computes it, not this run")

    @flow
    def pipeline() -> str:
        future = build.submit()
        task_runs.append(future.task_run_id)
        return future.result()  # type: ignore[no-any-return]

    thread, result = _in_thread(pipeline)
    wait_until(lambda: task_runs, what="the task run to start")
    (run_id,) = task_runs
    _state(run_id, "Waiting", "'dead-worker'")
    dying.__exit__(None, None, None)  # the worker dies
    assert gate.held.wait(BOUND)  # the waiter asks again once the dead worker's lease expired...
    with dibs.Reservations(dibs_url) as new:
        taken = wait_until(  # ...and the new worker takes the key over first
            lambda: isinstance(got := new.get_or_reserve(key, owner="new-worker"), dibs.Acquired) and got,
            what="the new worker's takeover",
        )
        assert taken.took_over_from == "dead-worker"
        gate.open()
        _state(run_id, "Waiting", "'new-worker'")  # the state no longer names the dead worker
        assert "now held by 'new-worker'" in _line("changed hands", task_run_id=run_id)
        taken.lease.complete("built by the new worker")
    thread.join(BOUND)
    assert result == ["built by the new worker"]
    _state(run_id, "Cached", "computed by 'new-worker'")


def test_waiting_time_does_not_count_opening_the_store(
    dibs_url: str, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = f"slow-open-{uuid.uuid4().hex[:8]}"
    holder = client.get_or_reserve(key, owner="holder")
    assert isinstance(holder, dibs.Acquired)
    opening, opened = threading.Event(), threading.Event()
    real_resolve = prefect_dibs.tasks.resolve_client

    def slow_resolve(*args: Any) -> dibs.Reservations:  # opening the store takes a while
        opening.set()
        assert opened.wait(BOUND)
        return real_resolve(*args)

    monkeypatch.setattr(prefect_dibs.tasks, "resolve_client", slow_resolve)
    waiting, reports = threading.Event(), []
    announce, publish = prefect_dibs.tasks._Reservation.announce_wait, prefect_dibs.tasks._Reservation.publish

    def announced(self: Any, *args: Any) -> None:
        announce(self, *args)
        waiting.set()

    def published(self: Any, ctx: Any, report: RunReport, logger: Any) -> None:
        reports.append((report, time.monotonic()))
        publish(self, ctx, report, logger)

    monkeypatch.setattr(prefect_dibs.tasks._Reservation, "announce_wait", announced)
    monkeypatch.setattr(prefect_dibs.tasks._Reservation, "publish", published)

    @reserved(dibs_url, key=key)
    @task
    def build() -> str:
        raise AssertionError("the holder computes it")

    @flow
    def pipeline() -> str:
        return build()  # type: ignore[no-any-return]

    thread, result = _in_thread(pipeline)
    assert opening.wait(BOUND)
    threading.Event().wait(0.3)  # the store takes 0.3 s to open: that is not waiting for the holder
    store_ready = time.monotonic()
    opened.set()
    assert waiting.wait(BOUND)
    holder.lease.complete("value")
    thread.join(BOUND)
    assert result == ["value"]
    ((report, reported_at),) = reports
    assert report.role == "waited" and report.waited_on == "holder"
    assert 0 < report.waited_seconds <= reported_at - store_ready


@pytest.fixture
def client(dibs_url: str) -> Any:
    with dibs.Reservations(dibs_url) as reservations:
        yield reservations

"""What dibs counts in real Prefect runs, through the real OpenTelemetry SDK and Prefect's event feed.

* Prefect's own cache with SERIALIZABLE isolation on ``DibsLockManager``: three runs of one cached
  task are one ``Completed`` and two ``Cached`` in Prefect, and dibs counts one call computed and two
  served (waited or hit), the work each served call was spared, and the same in Prefect's events.
* A ``@reserved`` task whose lease is lost while it works: its value is its run's, not stored, and the
  metric and the event say so, as the log does.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

pytest.importorskip("prefect")
pytest.importorskip("opentelemetry.sdk")

from prefect.cache_policies import INPUTS
from prefect.client.schemas.objects import State

import dibs
from prefect import flow, task
from prefect_dibs import DibsLockManager, reserved
from tests.observability.sdk import Telemetry, observed
from tests.prefect.support import server_events, wait_until


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    with observed() as seen:
        yield seen


def test_prefects_own_cache_on_dibs_locks_counts_one_computed_and_two_served(
    dibs_url: str, tmp_path: Path, telemetry: Telemetry
) -> None:
    manager = DibsLockManager(dibs_url, ttl=30)
    policy = INPUTS.configure(isolation_level="SERIALIZABLE", lock_manager=manager)
    busy = threading.Semaphore(0)
    ran: list[int] = []

    def heard(event: dibs.Event) -> None:
        if isinstance(event, dibs.KeyBusy):
            busy.release()

    @task(cache_policy=policy, persist_result=True, result_storage=tmp_path)
    def features(day: str) -> int:
        ran.append(1)
        for _ in range(2):  # the lock's other two runs wait on it while this one computes
            assert busy.acquire(timeout=120), "a run never found the lock busy"
        return 42

    @flow
    def pipeline(day: str) -> list[State[Any]]:
        futures = [features.submit(day) for _ in range(3)]
        return [future.wait() or future.state for future in futures]  # type: ignore[func-returns-value]

    day = f"2026-12-{uuid.uuid4().hex[:6]}"  # a key of its own: nothing cached yet
    with dibs.observe(heard):
        flow_state = pipeline(day, return_state=True)
    states = flow_state.result()
    manager.release_all()

    # Prefect ran the task once: one Completed, two Cached.
    assert sorted(state.name for state in states) == ["Cached", "Cached", "Completed"] and ran == [1]
    assert all(state.result() == 42 for state in states)
    # dibs counts the same: one computed, two served (they waited on the lock, then Prefect's cache
    # served them), each spared the holder's hold; no lock is held any more.
    outcomes = telemetry.sums("dibs.reservation.outcomes", by="dibs.outcome")
    assert outcomes == {"computed": 1, "waited": 2}, outcomes
    assert telemetry.sums("dibs.compute.saved", by="dibs.frontend")["prefect"] > 0
    assert telemetry.sums("dibs.leases.active", by="dibs.namespace") == {"prefect.locks": 0}
    spans = [span for span in telemetry.spans.get_finished_spans() if span.name == "dibs.reserve"]
    assert sorted(str(span.attributes["dibs.outcome"]) for span in spans) == ["computed", "waited", "waited"]

    # And Prefect's event feed: the same three, with their task runs.
    flow_run = flow_state.state_details.flow_run_id
    assert flow_run is not None

    def three() -> list[dict[str, Any]] | None:
        found = server_events([flow_run], prefix="dibs.reservation.")
        return found if len(found) >= 3 else None

    found = wait_until(three, what="three dibs events in the server's event feed")
    assert sorted(event["event"] for event in found) == [
        "dibs.reservation.computed",
        "dibs.reservation.waited",
        "dibs.reservation.waited",
    ]
    task_runs = {str(state.state_details.task_run_id) for state in states}
    related = {
        link["prefect.resource.id"]
        for event in found
        for link in event["related"]
        if link["prefect.resource.role"] == "task-run"
    }
    assert related == {f"prefect.task-run.{run}" for run in task_runs}
    assert all(e["payload"]["compute_seconds_saved"] > 0 for e in found if e["event"].endswith("waited"))


def test_a_lease_lost_mid_task_is_counted_with_its_value_not_stored(
    dibs_url: str, telemetry: Telemetry
) -> None:
    beat, lost = threading.Event(), threading.Event()

    def heard(event: dibs.Event) -> None:
        if isinstance(event, dibs.HeartbeatSent):
            beat.set()
        elif isinstance(event, dibs.LostLease):
            lost.set()

    key = f"lost-{uuid.uuid4().hex[:8]}"
    with dibs.Reservations(dibs_url, ttl=0.6) as client:

        @reserved(client, key=key)
        @task
        def build() -> int:
            assert beat.wait(60), "no heartbeat"
            client.force_release(key)  # an operator frees the key while the work runs
            assert lost.wait(60), "the lease was never found lost"
            return 7

        @flow
        def pipeline() -> int:
            return build()

        with dibs.observe(heard):
            state = pipeline(return_state=True)
        assert state.result() == 7  # the run keeps its own value
        assert client.status(key).artifact is None  # and nothing was stored

    # The call computed, and says its value was not stored, and why.
    assert telemetry.sums("dibs.reservation.outcomes", by="dibs.outcome") == {"computed": 1}
    assert telemetry.sums("dibs.reservation.not_stored", by="dibs.reason") == {"fenced": 1}
    assert telemetry.sums("dibs.lease.lost", by="dibs.reason") == {"released": 1}
    flow_run: UUID | None = state.state_details.flow_run_id
    assert flow_run is not None

    def two() -> list[dict[str, Any]] | None:
        found = server_events([flow_run], prefix="dibs.reservation.")
        return found if len(found) >= 2 else None

    by_name = {event["event"]: event for event in wait_until(two, what="the dibs events of the run")}
    assert sorted(by_name) == ["dibs.reservation.computed", "dibs.reservation.lease-lost"]
    payload = by_name["dibs.reservation.computed"]["payload"]
    assert (payload["stored"], payload["not_stored"]) == (False, "fenced")
    assert by_name["dibs.reservation.lease-lost"]["payload"]["reason"] == "released"

"""dibs's outcomes in a real Prefect server's event feed: computed, waited, hit, with their runs."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any
from uuid import UUID

import pytest

pytest.importorskip("prefect")

from prefect.client.schemas.objects import State

import dibs
from prefect import flow, task
from prefect_dibs import reserved
from tests.prefect.support import server_events, wait_until


def _events(flow_run_ids: list[UUID]) -> list[dict[str, Any]]:
    return server_events(flow_run_ids)


def _related(event: dict[str, Any], role: str) -> str:
    (found,) = [r["prefect.resource.id"] for r in event["related"] if r["prefect.resource.role"] == role]
    return str(found)


def test_computed_waited_and_hit_reach_the_event_feed_with_their_runs(dibs_url: str) -> None:
    busy = threading.Event()
    key = f"events-{uuid.uuid4().hex[:8]}"

    @reserved(dibs_url, key=key, ttl=30)
    @task
    def build() -> int:
        assert busy.wait(120), "the second run never found the key busy"
        time.sleep(0.2)  # compute for the waiter and the hit to be spared
        return 42

    @flow
    def pipeline() -> State[Any]:
        return build(return_state=True)

    def heard(event: dibs.Event) -> None:
        if isinstance(event, dibs.KeyBusy):
            busy.set()

    states: list[State[Any]] = []
    with dibs.observe(heard):
        threads = [
            threading.Thread(target=lambda: states.append(pipeline(return_state=True))) for _ in range(2)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(180)
    states.append(pipeline(return_state=True))  # after the artifact was stored: a hit
    assert all(state.is_completed() for state in states)
    flow_runs = [state.state_details.flow_run_id for state in states]
    assert None not in flow_runs
    task_runs = {
        str(state.state_details.flow_run_id): state.result().state_details.task_run_id for state in states
    }

    def three() -> list[dict[str, Any]] | None:
        found = _events(flow_runs)  # type: ignore[arg-type]
        return found if len(found) >= 3 else None

    found = wait_until(three, what="three dibs events in the server's event feed")
    assert sorted(event["event"] for event in found) == [
        "dibs.reservation.computed",
        "dibs.reservation.hit",
        "dibs.reservation.waited",
    ]
    by_name = {event["event"]: event for event in found}
    computed = by_name["dibs.reservation.computed"]
    for event in found:
        assert event["resource"]["prefect.resource.id"] == f"dibs.key.default/{key}"
        flow_run = _related(event, "flow-run").removeprefix("prefect.flow-run.")
        assert _related(event, "task-run") == f"prefect.task-run.{task_runs[flow_run]}"
        assert event["payload"]["token"] == 1 and event["payload"]["store"] == "sqlite"
        assert event["payload"]["frontend"] == "prefect"
    for name in ("dibs.reservation.waited", "dibs.reservation.hit"):
        payload = by_name[name]["payload"]
        assert payload["producer"] == computed["payload"]["owner"]
        assert payload["compute_seconds_saved"] >= 0.2  # what the producer's work took, from its artifact
    assert by_name["dibs.reservation.waited"]["payload"]["waited_on"] == computed["payload"]["owner"]


def test_a_takeover_is_told_as_it_happens_and_a_failure_when_it_fails(dibs_url: str) -> None:
    key, failing = f"takeover-{uuid.uuid4().hex[:8]}", f"failing-{uuid.uuid4().hex[:8]}"
    with dibs.Reservations(dibs_url, ttl=0.5) as crashed:  # a holder that never heartbeats: it expires
        assert isinstance(crashed.get_or_reserve(key, owner="crashed-holder"), dibs.Acquired)

    took_over = threading.Event()

    def heard(event: dibs.Event) -> None:
        if isinstance(event, dibs.LeaseAcquired) and event.took_over_from == "crashed-holder":
            took_over.set()

    @reserved(dibs_url, key=key, ttl=30)
    @task
    def build() -> int:
        return 1

    @reserved(dibs_url, key=failing, ttl=30)
    @task
    def broken() -> int:
        raise ValueError("bad partition")

    @flow
    def pipeline() -> State[Any]:
        return build(return_state=True)

    @flow
    def failing_pipeline() -> State[Any]:
        return broken(return_state=True)

    with dibs.observe(heard):
        computed = pipeline(return_state=True)
    assert computed.is_completed() and took_over.is_set()
    failed = failing_pipeline(return_state=True)
    assert failed.is_failed()
    runs = [computed.state_details.flow_run_id, failed.state_details.flow_run_id]

    def three() -> list[dict[str, Any]] | None:
        found = _events(runs)  # type: ignore[arg-type]
        return found if len(found) >= 3 else None

    found = wait_until(three, what="the takeover, the computation and the failure in the event feed")
    by_name = {event["event"]: event for event in found}
    assert sorted(by_name) == [
        "dibs.reservation.computed",
        "dibs.reservation.failed",
        "dibs.reservation.took-over",
    ]
    took = by_name["dibs.reservation.took-over"]
    # Told when the lease was taken over, before the work ran and its computed event came.
    assert took["payload"]["took_over_from"] == "crashed-holder" and took["payload"]["token"] == 2
    assert took["occurred"] <= by_name["dibs.reservation.computed"]["occurred"]
    assert by_name["dibs.reservation.computed"]["payload"]["took_over_from"] == "crashed-holder"
    failure = by_name["dibs.reservation.failed"]["payload"]
    assert "bad partition" in failure["error"] and failure["error_type"] == "ValueError"

"""One way to hold a lease (:class:`dibs.holding.HeldLease`): whoever ends it first, it ends once,
and its heartbeats always stop before the release."""

from __future__ import annotations

import threading

import pytest

import dibs
from dibs.holding import HeldLease


def _acquired(client: dibs.Reservations, owner: str = "alice") -> dibs.Acquired:
    got = client.get_or_reserve("k", owner=owner)
    assert isinstance(got, dibs.Acquired)
    return got


def test_a_lease_let_go_while_its_work_runs_is_released_once_with_that_reason(
    client: dibs.Reservations, caplog: pytest.LogCaptureFixture
) -> None:
    """Airflow's ``on_kill`` (or a released lock): the work's own failure afterwards releases nothing."""
    held = HeldLease(_acquired(client).lease)
    running, let_go = threading.Event(), threading.Event()

    def work() -> None:
        running.set()
        assert let_go.wait(30)
        raise RuntimeError("the command was terminated")

    def kill() -> None:  # what on_kill does, from another thread
        assert running.wait(30)
        held.let_go("stopped: killed")
        let_go.set()

    thread = threading.Thread(target=kill)
    thread.start()
    with caplog.at_level("WARNING", logger="dibs"), pytest.raises(RuntimeError, match="terminated"):
        client.hold(held, work)
    thread.join(30)
    state = client.status("k")
    assert state.lease is None and state.failure is not None
    assert state.failure.error == "stopped: killed" and state.failure.count == 0  # a stop, not counted
    assert held.keeper is not None and held.keeper._stop.is_set()
    assert not [r for r in caplog.records if "release" in r.getMessage()]  # quiet: nothing left to release


def test_a_value_returned_after_a_let_go_is_not_stored(client: dibs.Reservations) -> None:
    held = HeldLease(_acquired(client).lease)

    def work() -> str:
        held.let_go("stopped: killed")
        return "late"

    report = client.hold(held, work)
    assert (report.value, report.stored) == ("late", False)
    assert client.status("k").artifact is None


def test_with_lease_releases_with_the_failure_and_keeps_what_the_block_completed(
    client: dibs.Reservations,
) -> None:
    lease = _acquired(client).lease
    with pytest.raises(ValueError), lease:
        raise ValueError("bad day")
    failure = client.status("k").failure
    assert failure is not None and failure.error == "ValueError: bad day" and failure.count == 1

    lease = _acquired(client, "bob").lease
    with lease:
        lease.complete({"rows": 3})
    state = client.status("k")
    assert state.artifact is not None and state.artifact.producer == "bob" and state.lease is None


def test_a_lease_lost_inside_a_with_block_is_logged_not_raised(
    client: dibs.Reservations, caplog: pytest.LogCaptureFixture
) -> None:
    lease = _acquired(client).lease
    with caplog.at_level("WARNING", logger="dibs"), lease:
        client.force_release("k")
    assert any("already lost when its block ended" in r.getMessage() for r in caplog.records)


def test_a_lock_style_hold_without_heartbeats_ends_once(client: dibs.Reservations) -> None:
    held = HeldLease(_acquired(client).lease, heartbeats=False)
    assert held.keeper is None and held.alive
    held.let_go()
    assert not held.alive
    held.let_go()  # a second release (Prefect releases again after a rollback) does nothing
    assert client.status("k").lease is None

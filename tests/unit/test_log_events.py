"""The Python front end's log lines are an observer of the flow's events: it asks only for the events
whose lines the ``dibs`` logger would write at its level, so the others are never built."""

from __future__ import annotations

import logging

import pytest

import dibs
from dibs import events
from dibs.logs import log_event
from tests.cli_harness import eventually


def test_the_log_asks_only_for_the_events_its_level_writes(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="dibs"):
        assert log_event.kinds == {
            events.LeaseAcquired,
            events.RanUnreserved,
            events.Finished,
            events.StoreUnreachable,
        }
    with caplog.at_level(logging.ERROR, logger="dibs"):
        assert log_event.kinds == {events.Finished}
    with caplog.at_level(logging.INFO, logger="dibs"):
        assert events.ArtifactFound in log_event.kinds


def test_a_hit_is_logged_when_the_level_is_info(caplog: pytest.LogCaptureFixture) -> None:
    client = dibs.Reservations("memory://", namespace="logs", ttl=60)
    client.run("k", lambda: 1)
    with caplog.at_level(logging.WARNING, logger="dibs"):
        assert client.run("k", lambda: 2) == 1
    assert "using the artifact" not in caplog.text
    with caplog.at_level(logging.INFO, logger="dibs"):
        assert client.run("k", lambda: 2) == 1
    assert "using the artifact stored by" in caplog.text


@pytest.mark.usefixtures("no_process_observers")
def test_routine_events_are_not_built_for_the_log_alone(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The log (WARNING and ERROR, on by default) writes a takeover and a failed ending only: a call
    that takes a free key and succeeds builds neither a LeaseAcquired nor a Finished for it."""
    built: list[events.Event] = []
    make = events.Emitter.make

    def counting(self: events.Emitter, kind: type[events.Event], **fields: object) -> events.Event:
        event = make(self, kind, **fields)
        built.append(event)
        return event

    monkeypatch.setattr(events.Emitter, "make", counting)
    # The log alone (no process-wide observer: the fixture), and the dibs logger at its default level.
    caplog.set_level(logging.WARNING, logger="dibs")
    # memory:// is one store per process: a namespace of its own, so every key starts free
    client = dibs.Reservations("memory://", namespace="logs.routine", ttl=60)
    assert client.run("k", lambda: 1) == 1 and client.run("k", lambda: 2) == 1
    assert built == []
    heard: list[events.Event] = []
    assert client.compute("k2", lambda: 3, observer=heard.append).value == 3
    assert [event.name for event in built] == ["asked", "lease_acquired", "artifact_stored", "finished"]
    assert heard == built  # another observer still hears every one
    built.clear()
    with caplog.at_level(logging.WARNING, logger="dibs"):
        lease = client.get_or_reserve("k3", ttl=0.05, max_lease_age=0.05)
        assert isinstance(lease, dibs.Acquired)
        eventually(lambda: client.status("k3").live_lease is None, "the lease to expire (store clock)")
        assert client.run("k3", lambda: 4) == 4
    assert [event.name for event in built] == ["lease_acquired"]
    assert "took over the expired lease of" in caplog.text


def test_the_log_still_hears_a_failed_ending(caplog: pytest.LogCaptureFixture) -> None:
    emitter = events.Emitter(dibs.Key("logs", "k"), "me", "python", (events.Observers(), log_event))
    assert emitter.wants(events.Finished) and not emitter.wants_routine(events.Finished)
    with caplog.at_level(logging.ERROR, logger="dibs"):
        emitter(events.Finished, outcome="failed", seconds=0.0, error="down", error_type="StoreUnavailable")
    assert "not running it (policy 'fail'): down" in caplog.text

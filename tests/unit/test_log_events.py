"""The Python front end's log lines are an observer of the flow's events: it asks only for the events
whose lines the ``dibs`` logger would write at its level, so the others are never built."""

from __future__ import annotations

import logging

import pytest

import dibs
from dibs import calls, events


def test_the_log_asks_only_for_the_events_its_level_writes(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="dibs"):
        assert calls.log_event.kinds == {events.LeaseAcquired, events.RanUnreserved, events.Finished}
    with caplog.at_level(logging.ERROR, logger="dibs"):
        assert calls.log_event.kinds == {events.Finished}
    with caplog.at_level(logging.INFO, logger="dibs"):
        assert events.ArtifactFound in calls.log_event.kinds


def test_a_hit_is_logged_when_the_level_is_info(caplog: pytest.LogCaptureFixture) -> None:
    client = dibs.Reservations("memory://", namespace="logs", ttl=60)
    client.run("k", lambda: 1)
    with caplog.at_level(logging.WARNING, logger="dibs"):
        assert client.run("k", lambda: 2) == 1
    assert "using the artifact" not in caplog.text
    with caplog.at_level(logging.INFO, logger="dibs"):
        assert client.run("k", lambda: 2) == 1
    assert "using the artifact stored by" in caplog.text


def test_a_call_that_succeeds_builds_no_ending_for_the_log_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[events.Finished] = []
    make = events.Emitter.make

    def counting(self: events.Emitter, kind: type[events.Event], **fields: object) -> events.Event:
        event = make(self, kind, **fields)
        if isinstance(event, events.Finished):
            built.append(event)
        return event

    monkeypatch.setattr(events.Emitter, "make", counting)
    client = dibs.Reservations("memory://", namespace="logs", ttl=60)
    assert client.run("k", lambda: 1) == 1 and client.run("k", lambda: 2) == 1
    assert built == []  # the log writes only failed endings (its level: ERROR, on by default)
    heard: list[events.Event] = []
    assert client.compute("k2", lambda: 3, observer=heard.append).value == 3
    assert [event.outcome for event in built] == ["computed"]  # another observer still hears it
    assert [event for event in heard if isinstance(event, events.Finished)] == built


def test_the_log_still_hears_a_failed_ending(caplog: pytest.LogCaptureFixture) -> None:
    emitter = events.Emitter(dibs.Key("logs", "k"), "me", "python", (events.Observers(), calls.log_event))
    assert emitter.wants(events.Finished) and not emitter.wants_success()
    with caplog.at_level(logging.ERROR, logger="dibs"):
        emitter(events.Finished, outcome="failed", seconds=0.0, error="down", error_type="StoreUnavailable")
    assert "not running it (policy 'fail'): down" in caplog.text

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

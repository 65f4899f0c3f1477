"""Fixtures of the unit tests that want a store with a fake clock (modules may define their own)."""

from __future__ import annotations

import pytest

import dibs
from dibs import events
from dibs.stores.memory import MemoryStore


class FakeClock:
    """The store's clock, moved by the test: expiry and age without sleeping."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def client(clock: FakeClock) -> dibs.Reservations:
    return dibs.Reservations(MemoryStore(clock=clock), namespace="unit", ttl=30)


@pytest.fixture
def no_process_observers(monkeypatch: pytest.MonkeyPatch) -> None:
    """No process-wide observer for the test's length: an integration's exporter installs itself
    once per process (``observe_once``: the Airflow StatsD observer, Prefect's events, OpenTelemetry),
    so an earlier test of the same worker may have left one that wants every kind. Every field
    :class:`~dibs.events.Observers` reads is emptied, not only the list: ``kinds`` is what an emitter
    asks."""
    for field, empty in (("_all", ()), ("wanting", ()), ("kinds", frozenset()), ("operations", ())):
        monkeypatch.setattr(events.PROCESS, field, empty)

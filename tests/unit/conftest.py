"""Fixtures of the unit tests that want a store with a fake clock (modules may define their own)."""

from __future__ import annotations

import pytest

import dibs
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

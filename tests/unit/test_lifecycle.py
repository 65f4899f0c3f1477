"""The cache lifecycle through the client: maximum age, refresh, discard and prune (fake clock)."""

from __future__ import annotations

import threading

import pytest

import dibs
from dibs.runtime import runtime
from dibs.stores.memory import MemoryStore
from tests.scale import wait_until
from tests.unit.conftest import FakeClock


def test_an_artifact_older_than_max_age_is_computed_again(clock: FakeClock) -> None:
    client = dibs.Reservations(MemoryStore(clock=clock), ttl=30, max_age=60)
    values = iter(["first", "second"])
    assert client.run("k", lambda: next(values)) == "first"
    clock.now += 59
    assert client.compute("k", lambda: "unused").role == "hit"
    clock.now += 1  # 60 seconds old: too old
    report = client.compute("k", lambda: next(values))
    assert (report.role, report.value, report.token) == ("computed", "second", 2)
    assert client.compute("k", lambda: "unused", max_age=3600).value == "second"
    with pytest.raises(dibs.ConfigurationError, match="max_age"):
        client.compute("k", lambda: 1, max_age=-1)


def test_a_plain_reader_still_gets_the_artifact_a_stricter_one_refuses(clock: FakeClock) -> None:
    store = MemoryStore(clock=clock)
    dibs.Reservations(store).run("k", lambda: "v1")
    clock.now += 100
    strict = dibs.Reservations(store, max_age=50)
    assert isinstance(dibs.Reservations(store).get_or_reserve("k"), dibs.Hit)
    assert isinstance(strict.get_or_reserve("k", owner="strict"), dibs.Acquired)  # stale for it
    assert strict.wait("k", timeout=0, for_artifact=False, max_age=1000) is not None


def test_refresh_computes_again_and_replaces_the_value(clock: FakeClock) -> None:
    client = dibs.Reservations(MemoryStore(clock=clock), ttl=30)
    assert client.run("k", lambda: "old") == "old"
    report = client.compute("k", lambda: "new", refresh=True)
    assert (report.role, report.value, report.token) == ("computed", "new", 2)
    assert client.run("k", lambda: "unused") == "new"


def test_concurrent_refreshes_compute_once_and_share_the_value() -> None:
    client = dibs.Reservations(MemoryStore(), ttl=30)
    client.run("k", lambda: "old")
    started, release = threading.Event(), threading.Event()
    calls: list[str] = []

    def slow() -> str:
        calls.append("slow")
        started.set()
        assert release.wait(30)
        return "fresh"

    first: list[dibs.RunReport] = []
    holder = threading.Thread(target=lambda: first.append(client.compute("k", slow, refresh=True)))
    holder.start()
    assert started.wait(30)
    second: list[dibs.RunReport] = []
    waiter = threading.Thread(
        target=lambda: second.append(client.compute("k", lambda: calls.append("twice") or "x", refresh=True))
    )
    waiter.start()
    hub = runtime().hub(client.store)
    assert hub is not None
    wait_until(lambda: hub.waiters == 1, "the second refresh waits for the first")
    release.set()
    holder.join(30)
    waiter.join(30)
    assert calls == ["slow"]
    assert (first[0].role, second[0].role) == ("computed", "waited")
    assert first[0].value == second[0].value == "fresh"


def test_the_reserved_decorator_takes_max_age_and_refresh(clock: FakeClock) -> None:
    client = dibs.Reservations(MemoryStore(clock=clock), ttl=30)
    runs: list[int] = []

    @client.reserved(key="daily", max_age=10)
    def daily() -> int:
        runs.append(1)
        return len(runs)

    @client.reserved(key="daily", refresh=True)
    def daily_again() -> int:
        runs.append(1)
        return len(runs)

    assert daily() == 1 and daily() == 1
    clock.now += 10
    assert daily() == 2
    assert daily_again() == 3 and daily() == 3


def test_discard_and_prune_through_the_client(clock: FakeClock) -> None:
    client = dibs.Reservations(MemoryStore(clock=clock), ttl=30)
    client.run("done", lambda: 1)
    got = client.get_or_reserve("freed")
    assert isinstance(got, dibs.Acquired)
    got.lease.release()
    assert client.discard("freed") and not client.discard("done")
    assert not client.discard("freed")  # a tombstone already: not counted again
    clock.now += 3600
    assert client.prune(older_than=60) == 1
    assert client.prune(older_than=60) == 0
    assert list(client.list()) == []  # tombstones are not listed ...
    assert [client.status(name).fence for name in ("done", "freed")] == [1, 1]  # ... but keep the fence
    again = client.get_or_reserve("done")
    assert isinstance(again, dibs.Acquired) and again.lease.token == 2  # a pruned key never rewinds


def test_reaping_an_expired_lease_keeps_the_token_rising(clock: FakeClock) -> None:
    """Take, forget, take, force-release and reap, take: the issue's 1, 2, 1 is now 1, 2, 3."""
    client = dibs.Reservations(MemoryStore(clock=clock), ttl=30)
    tokens = []
    first = client.get_or_reserve("k")
    assert isinstance(first, dibs.Acquired)
    tokens.append(first.lease.token)
    first.lease.complete(1)
    assert client.forget("k")
    second = client.get_or_reserve("k")
    assert isinstance(second, dibs.Acquired)
    tokens.append(second.lease.token)
    assert client.force_release("k")
    assert client.reap() == 1
    clock.now += 60
    third = client.get_or_reserve("k")
    assert isinstance(third, dibs.Acquired) and third.lease.attempt == 1  # attempts start again ...
    tokens.append(third.lease.token)
    assert tokens == [1, 2, 3]  # ... the token never does
    third.lease.complete(3)
    expiring = client.get_or_reserve("expiring")
    assert isinstance(expiring, dibs.Acquired)
    clock.now += 31  # past its ttl on the fake clock: nobody took it over
    assert client.reap() == 1
    assert client.status("expiring").fence == 1
    assert [state.key.name for state in client.list()] == ["k"]  # done; the reaped key is a tombstone

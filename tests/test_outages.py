"""Outages that waiting work rides out (contract: "Outages are ridden out where nothing is at stake").

A waiter holds nothing, so while its store cannot be reached it keeps waiting, for ``outage_patience``
at most, never past its own timeout; only the first ask of a call applies ``on_store_unavailable``.
The outage here is real and needs no server: a file store whose folder is replaced by a file, as an
unmounted share would be (every read and write fails with ``NotADirectoryError``), then put back. The
PostgreSQL and Redis restarts of the same scenarios are in ``tests/test_restarts.py``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import dibs
from dibs.errors import StoreUnavailable
from dibs.integration import runtime
from tests.cli_harness import eventually


class Share:
    """A file store's folder that can go away (replaced by a file) and come back."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = f"file://{root}"
        self._away = root.with_name(root.name + ".away")

    def down(self) -> None:
        self.root.rename(self._away)
        self.root.write_text("the share is unmounted")

    def up(self) -> None:
        self.root.unlink()
        self._away.rename(self.root)


@pytest.fixture
def share(tmp_path: Path) -> Iterator[Share]:
    share = Share(tmp_path / "store")
    with dibs.Reservations(share.url) as client:  # creates the folder
        client.status("warm-up")
    yield share
    if share.root.is_file():
        share.up()


def _heard(client: dibs.Reservations) -> tuple[list[dibs.Event], threading.Event]:
    heard: list[dibs.Event] = []
    unreachable = threading.Event()

    def observe(event: dibs.Event) -> None:
        heard.append(event)
        if isinstance(event, dibs.StoreUnreachable):
            unreachable.set()

    client.observe(observe)
    return heard, unreachable


def _names(heard: list[dibs.Event]) -> list[str]:
    return [event.name for event in heard]


def test_a_waiter_rides_out_an_outage_and_gets_the_artifact(share: Share) -> None:
    with dibs.Reservations(share.url, ttl=30) as client:
        holder = client.get_or_reserve("k", owner="holder")
        assert isinstance(holder, dibs.Acquired)
        heard, unreachable = _heard(client)
        busy = threading.Event()
        results: list[Any] = []

        def waiter() -> None:
            def seen(event: dibs.Event) -> None:
                if isinstance(event, dibs.KeyBusy):
                    busy.set()

            results.append(client.compute("k", lambda: "not me", owner="waiter", observer=seen, timeout=60))

        thread = threading.Thread(target=waiter)
        thread.start()
        assert busy.wait(30)
        share.down()
        assert unreachable.wait(30), "the waiter never found its store unreachable"
        share.up()
        holder.lease.complete("the holder's")
        thread.join(30)
    (report,) = results
    assert (report.role, report.value) == ("waited", "the holder's")
    names = _names(heard)
    assert names.count("store_unreachable") == 1 and names.count("store_reachable") == 1
    assert names.index("store_unreachable") < names.index("store_reachable") < names.index("finished")
    assert heard[-1].outcome == "waited"  # type: ignore[attr-defined]


def test_the_first_ask_of_a_call_follows_the_policy_at_once(share: Share) -> None:
    """Nothing is known yet at the first ask, and a store never reached may be a wrong URL: no
    patience there, ``on_store_unavailable`` decides."""
    share.down()
    with dibs.Reservations(share.url) as failing:
        heard, _ = _heard(failing)
        with pytest.raises(StoreUnavailable):
            failing.run("k", lambda: 1)
        assert _names(heard) == ["asked", "finished"]
    with dibs.Reservations(share.url, on_store_unavailable="run") as running:
        assert running.run("k", lambda: 2) == 2


def test_an_outage_longer_than_the_patience_ends_the_wait_by_the_policy(share: Share) -> None:
    with dibs.Reservations(share.url, ttl=30, outage_patience=0.3, on_store_unavailable="run") as client:
        holder = client.get_or_reserve("k", owner="holder")
        assert isinstance(holder, dibs.Acquired)
        heard, _ = _heard(client)

        def work() -> str:
            return "computed unreserved"

        def on_busy(event: dibs.Event) -> None:
            if isinstance(event, dibs.KeyBusy):
                share.down()  # for good: longer than the waiter's patience

        report = client.compute("k", work, owner="waiter", observer=on_busy)
    assert (report.role, report.value) == ("unreserved", "computed unreserved")
    names = _names(heard)
    assert "store_unreachable" in names and "store_reachable" not in names
    waited = next(event for event in heard if isinstance(event, dibs.Waited))
    assert waited.outcome == "unavailable"


def test_acquire_and_wait_ride_an_outage_out_too(share: Share) -> None:
    with dibs.Reservations(share.url, ttl=30) as client:
        holder = client.get_or_reserve("k", owner="holder")
        assert isinstance(holder, dibs.Acquired)
        heard, unreachable = _heard(client)
        results: list[Any] = []
        threads = [
            threading.Thread(target=lambda: results.append(client.acquire("k", owner="a", timeout=60))),
            threading.Thread(target=lambda: results.append(client.wait("k", timeout=60))),
        ]
        for thread in threads:
            thread.start()
        hub = runtime().hub(client.store)
        assert hub is not None
        eventually(lambda: hub.waiters == 2, "both to be waiting (past their first ask)")
        share.down()
        assert unreachable.wait(30)
        share.up()
        holder.lease.complete("done")
        for thread in threads:
            thread.join(30)
    assert len(results) == 2 and all(isinstance(hit, dibs.Hit) and hit.value == "done" for hit in results)
    assert {event.name for event in heard} == {"store_unreachable", "store_reachable"}  # nothing else


def test_a_fresh_wait_says_at_once_that_the_store_is_unreachable_a_resumed_one_rides_it_out(
    share: Share,
) -> None:
    with dibs.Reservations(share.url, ttl=30, outage_patience=0.3) as client:
        share.down()
        with pytest.raises(StoreUnavailable):
            client.wait("k", timeout=30)  # a wrong URL would look the same: said at once
        heard, _ = _heard(client)
        with pytest.raises(StoreUnavailable):
            client.wait("k", timeout=30, resumed=True)  # a continued wait: patience first
        assert _names(heard) == ["store_unreachable"]


def test_an_async_waiter_rides_out_an_outage(share: Share) -> None:
    async def main() -> Any:
        with dibs.Reservations(share.url, ttl=30) as client:
            holder = client.get_or_reserve("k", owner="holder")
            assert isinstance(holder, dibs.Acquired)
            heard, unreachable = _heard(client)
            busy = asyncio.Event()
            loop = asyncio.get_running_loop()

            def seen(event: dibs.Event) -> None:
                if isinstance(event, dibs.KeyBusy):
                    loop.call_soon_threadsafe(busy.set)

            async def work() -> str:
                return "not me"

            waiting = asyncio.create_task(client.aio().compute("k", work, owner="w", observer=seen))
            await asyncio.wait_for(busy.wait(), 30)
            share.down()
            await asyncio.wait_for(asyncio.to_thread(unreachable.wait, 30), 35)
            share.up()
            await asyncio.to_thread(holder.lease.complete, "the holder's")
            return await asyncio.wait_for(waiting, 30), heard

    report, heard = asyncio.run(main())
    assert (report.role, report.value) == ("waited", "the holder's")
    assert "store_reachable" in _names(heard)


def test_the_call_s_own_policy_applies_at_complete(share: Share, monkeypatch: pytest.MonkeyPatch) -> None:
    """``Reservations.call(on_store_unavailable=...)`` overrides the client's for the whole call: its
    first ask and its complete (the complete used to apply the client's)."""
    with dibs.Reservations(share.url, ttl=1.0, on_store_unavailable="fail") as client:

        def work() -> str:
            share.down()  # the store goes away while the work runs: complete cannot reach it
            return "value"

        call = client.call("k", on_store_unavailable="run")
        from dibs.seam import StoreIO

        report = call.drive(StoreIO(client, work, emit=call.emitter))
    assert (report.role, report.value, report.stored) == ("computed", "value", False)

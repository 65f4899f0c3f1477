"""Waiting for an artifact's record only (``wait(decode=False)``): its payload is never opened, and the
waiters that load it and the ones that do not share one watch hub per record store."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import IO

import pytest

import dibs
from dibs.hub import Subscription
from dibs.payloads import ReferencedArtifact, unread
from dibs.payloads.files import FilePayloadStore
from dibs.payloads.references import REFERENCE
from dibs.records import ArtifactRecord
from dibs.runtime import runtime

BIG = b"p" * 200_000  # above the 64 KiB inline limit


class _CountingFiles(FilePayloadStore):
    """A folder payload store that records every payload it opens for reading."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.opened: list[str] = []

    def open(self, sha256: str) -> IO[bytes]:
        self.opened.append(sha256)
        return super().open(sha256)


def test_a_record_only_wait_opens_no_payload_sync_and_async(records_url: str, tmp_path: Path) -> None:
    payloads = _CountingFiles(tmp_path / "payloads")
    with dibs.Reservations(records_url, payloads=payloads, serializer="bytes") as client:
        lease = client.get_or_reserve("k", owner="producer").lease  # type: ignore[union-attr]
        completing = threading.Timer(0.2, lease.complete, (BIG,))  # while both waits wait
        completing.start()

        async def record_only() -> dibs.Hit | None:
            return await client.aio().wait("k", decode=False, timeout=30)

        hit = asyncio.run(record_only())
        completing.join()
        again = client.wait("k", decode=False)
        assert payloads.opened == []
        for found in (hit, again):
            assert found is not None and isinstance(found.value, ReferencedArtifact)
            assert (found.producer, found.token, found.size) == ("producer", lease.token, len(BIG))
        assert hit is not None and client.decode(hit.key, hit.value) == BIG  # read when asked for
        assert len(payloads.opened) == 1


def test_without_a_payload_store_a_record_only_wait_hands_back_the_inline_record(records_url: str) -> None:
    with dibs.Reservations(records_url) as client:
        client.run("k", lambda: {"rows": 3})
        hit = client.wait("k", decode=False)
        assert hit is not None and isinstance(hit.value, ArtifactRecord)
        assert client.decode(hit.key, hit.value) == {"rows": 3}
        assert client.wait("k") == dibs.Hit.of(hit.key, hit.value, {"rows": 3})  # decoded, as before


def test_without_the_payload_store_a_record_only_wait_cannot_check_a_reference(
    records_url: str, tmp_path: Path
) -> None:
    """What docs/payloads.md says: the check that a payload is there is the client's payload store's;
    a client without one ends its record-only wait on the reference record, unchecked, even when the
    payload is gone; the client with the payload store finds it missing (no hit)."""
    payloads = _CountingFiles(tmp_path / "payloads")
    with dibs.Reservations(records_url, payloads=payloads, serializer="bytes") as client:
        client.run("k", lambda: BIG)
        for path in (tmp_path / "payloads").rglob("*"):
            if path.is_file():
                path.unlink()
        assert client.wait("k", decode=False, timeout=0) is None  # checked: missing, so a miss
    with dibs.Reservations(records_url) as without:
        hit = without.wait("k", decode=False, timeout=0)
        assert hit is not None and isinstance(hit.value, ArtifactRecord)
        assert hit.value.serializer == REFERENCE  # unchecked: the payload is gone


def test_decode_must_be_true_or_false(records_url: str) -> None:
    """``decode=None`` (or 0, or "no") is refused, naming the value, sync and async: it would otherwise
    have meant a record-only wait, the opposite of a default."""
    with dibs.Reservations(records_url) as client:
        client.run("k", lambda: 1)
        for wrong in (None, 0, "no"):
            with pytest.raises(dibs.ConfigurationError, match=f"decode must be True or False, got {wrong!r}"):
                client.wait("k", decode=wrong)  # type: ignore[arg-type]

            async def waited(wrong: object = wrong) -> object:
                return await client.aio().wait("k", decode=wrong, timeout=5)  # type: ignore[arg-type]

            with pytest.raises(dibs.ConfigurationError, match="decode must be True or False"):
                asyncio.run(waited())
        assert client.wait("k", decode=True) is not None


def test_one_hub_serves_waiters_that_load_and_waiters_that_only_read_the_record(
    records_url: str, tmp_path: Path
) -> None:
    """Both kinds subscribe through their own view of the records, and one hub (one feed) reads the
    key once for both: the loading view's waiters get the payload loaded (once), the record-only ones
    never see it loaded."""
    payloads = _CountingFiles(tmp_path / "payloads")
    with dibs.Reservations(records_url, payloads=payloads, serializer="bytes") as client:
        twin = unread(client.store, "size")
        hub = runtime().hub(client.store)
        assert hub is not None and runtime().hub(twin) is hub
        lease = client.get_or_reserve("k", owner="producer").lease  # type: ignore[union-attr]
        key = lease.key
        loading = [runtime().subscribe(client.store, key) for _ in range(3)]
        record_only = [runtime().subscribe(twin, key) for _ in range(3)]
        try:
            assert hub.waiters == 6 and hub.watched == 1
            payloads.opened.clear()
            lease.complete(BIG)
            got = [_artifact_when_done(subscription) for subscription in loading + record_only]
        finally:
            for subscription in loading + record_only:
                subscription.close()
        assert all(isinstance(artifact, ReferencedArtifact) for artifact in got)
        assert [artifact.loaded for artifact in got[:3]] == [BIG] * 3  # type: ignore[union-attr]
        assert [artifact.loaded for artifact in got[3:]] == [None] * 3  # type: ignore[union-attr]
        assert len(payloads.opened) == 1  # one load, for the loading view's waiters only


class _SlowFiles(FilePayloadStore):
    """A folder payload store whose every open blocks until the test releases it (a remote file
    system that takes seconds to open a file)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.opening, self.released = threading.Event(), threading.Event()

    def open(self, sha256: str) -> IO[bytes]:
        self.opening.set()
        if not self.released.wait(60):
            raise AssertionError("the test never released the open")
        return super().open(sha256)


def test_a_slow_payload_load_holds_back_no_waiter_that_does_not_load(
    records_url: str, tmp_path: Path
) -> None:
    """The hub hands the record store's own waiters and the record-only ones their state while the
    loading view's load is still blocked in the payload store's open; the loading waiters get theirs
    once it returns."""
    payloads = _SlowFiles(tmp_path / "payloads")
    with dibs.Reservations(records_url, payloads=payloads, serializer="bytes") as client:
        twin = unread(client.store, "size")
        lease = client.get_or_reserve("k", owner="producer").lease  # type: ignore[union-attr]
        key = lease.key
        loading = runtime().subscribe(client.store, key)  # first: the hub meets its view first
        record_only = runtime().subscribe(twin, key)
        plain = runtime().subscribe(client.store.record_store, key)
        try:
            lease.complete(BIG)
            assert payloads.opening.wait(30), "the hub never loaded the payload"
            early = [_artifact_when_done(subscription) for subscription in (plain, record_only)]
            assert not payloads.released.is_set()  # both handed their state during the load
            payloads.released.set()
            late = _artifact_when_done(loading)
        finally:
            payloads.released.set()
            for subscription in (loading, record_only, plain):
                subscription.close()
        assert isinstance(early[1], ReferencedArtifact) and early[1].loaded is None
        assert early[0] is not None and early[0].serializer == REFERENCE  # the record as it is kept
        assert isinstance(late, ReferencedArtifact) and late.loaded == BIG


def _artifact_when_done(subscription: Subscription) -> ArtifactRecord | None:
    """The artifact of the first state the hub hands ``subscription`` that has one."""
    for _ in range(200):
        state = subscription.wait(0.1)
        if state is not None and state.artifact is not None:
            return state.artifact
    raise AssertionError(f"the hub handed {subscription.key} no finished state")


def test_loading_and_record_only_waiters_hold_two_connections_on_postgres(tmp_path: Path) -> None:
    """A triggerer's record-only waiters beside waiters that load (a worker thread, say) in one
    process hold what waiters alone hold, at most two connections (one pooled, one ``LISTEN``): a
    watch hub per view of the records would listen twice (three connections)."""
    from tests.scale import server_connections, tagged_url, wait_until

    with tagged_url("postgres", tmp_path) as (url, tag):
        payloads = _CountingFiles(tmp_path / "payloads")
        with dibs.Reservations(url, payloads=payloads, serializer="bytes", ttl=300) as client:
            lease = client.get_or_reserve("popular", owner="holder").lease  # type: ignore[union-attr]
            loop = asyncio.new_event_loop()
            looping = threading.Thread(target=loop.run_forever, daemon=True)
            looping.start()
            record_only = [
                asyncio.run_coroutine_threadsafe(
                    client.aio().wait("popular", decode=False, timeout=300), loop
                )
                for _ in range(50)
            ]
            loaded: list[object] = []
            loading = [
                threading.Thread(target=lambda: loaded.append(client.wait("popular", timeout=300)))
                for _ in range(5)
            ]
            for thread in loading:
                thread.start()
            try:
                hub = runtime().hub(client.store)
                assert hub is not None
                wait_until(lambda: hub.waiters == 55, "every waiter to subscribe")

                def settled() -> bool:
                    time.sleep(0.2)  # each look is a connection of its own: not too often
                    count = server_connections("postgres", tag)
                    return count is not None and count <= 2

                wait_until(settled, "the waiting process to hold at most 2 connections")
                payloads.opened.clear()
                lease.complete(BIG)
                hits = [future.result(timeout=300) for future in record_only]
                for thread in loading:
                    thread.join(timeout=300)
            finally:
                loop.call_soon_threadsafe(loop.stop)
                looping.join(timeout=30)
                loop.close()
        assert all(hit is not None and isinstance(hit.value, ReferencedArtifact) for hit in hits)
        assert [getattr(hit, "value", None) for hit in loaded] == [BIG] * 5
        assert 1 <= len(payloads.opened) <= 6  # the loading ones: the hub once, each waiter at most once

"""Large artifacts in a payload store: what goes where, readers verify, a bad payload is a miss,
streams, and the lifecycle (forget/prune/reap remove what no record refers to, safely)."""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

import dibs
from dibs.errors import ConfigurationError, LeaseLost
from dibs.payloads import REFERENCE, Freed, PayloadUnavailable, ReferencingStore
from dibs.payloads.files import FilePayloadStore
from dibs.payloads.references import decode
from dibs.records import ArtifactRecord, Granted, KeyState
from dibs.stores import AcquireRequest
from dibs.stores.memory import MemoryStore
from tests.cli_harness import eventually
from tests.payloads.conftest import payload_files, stored_payloads

BIG = 200_000  # above the default 64 KiB inline limit


def _client(records_url: str, payloads_url: str, **kwargs: object) -> dibs.Reservations:
    options: dict[str, object] = {"payload_grace": 0.0, **kwargs}
    return dibs.Reservations(records_url, payloads=payloads_url, serializer="bytes", **options)  # type: ignore[arg-type]


def _raw(client: dibs.Reservations, key: str) -> dibs.records.ArtifactRecord:
    """The artifact as the record store holds it (under the referencing store)."""
    assert isinstance(client.store, ReferencingStore)
    artifact = client.store.records.read(client.key(key)).artifact
    assert artifact is not None
    return artifact


def test_small_values_stay_in_the_record_large_ones_are_referenced(
    records_url: str, payloads_url: str, tmp_path: Path
) -> None:
    with _client(records_url, payloads_url) as client:
        small, big = b"s" * 1000, os.urandom(BIG)
        assert client.run("small", lambda: small) == small
        assert client.run("big", lambda: big) == big
        assert _raw(client, "small").serializer == "bytes" and _raw(client, "small").payload == small
        record = _raw(client, "big")
        assert record.serializer == REFERENCE and len(record.payload) < 1024
        reference, uri = decode(record.payload, "test")
        assert (reference.size, reference.sha256) == (BIG, hashlib.sha256(big).hexdigest())
        (only,) = payload_files(tmp_path)
        assert only.read_bytes() == big and only.as_uri().startswith(uri + ".")  # a copy: <uri>.<stamp>
        # Another client (another process would be the same) reads it back, checked.
        with _client(records_url, payloads_url) as other:
            hit = other.get_or_reserve("big")
            assert isinstance(hit, dibs.Hit) and hit.value == big and hit.size == BIG


def test_the_inline_limit_is_configurable(records_url: str, payloads_url: str, tmp_path: Path) -> None:
    with _client(records_url, payloads_url, payload_inline_limit=10) as client:
        assert client.run("k", lambda: b"eleven byte") == b"eleven byte"
        assert _raw(client, "k").serializer == REFERENCE
    with pytest.raises(ConfigurationError, match="payload_inline_limit"):
        _client(records_url, payloads_url, payload_inline_limit=-1)


def test_json_and_signed_pickle_values_round_trip_through_payloads(
    records_url: str, payloads_url: str
) -> None:
    value = {"rows": list(range(30_000))}
    with dibs.Reservations(records_url, payloads=payloads_url) as client:
        assert client.run("json", lambda: value) == value
        assert _raw(client, "json").serializer == REFERENCE
        assert client.run("json", lambda: None) == value  # a hit
    with dibs.Reservations(
        records_url, payloads=payloads_url, serializer="pickle", signing_key="k" * 32
    ) as client:
        assert client.run("pickle", lambda: value) == value
        assert client.run("pickle", lambda: None) == value


@pytest.mark.parametrize("fault", ["missing", "truncated", "longer", "bit flipped"])
def test_a_bad_payload_is_a_miss_that_computes_again(
    records_url: str, payloads_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture, fault: str
) -> None:
    first, second = os.urandom(BIG), os.urandom(BIG)
    with _client(records_url, payloads_url) as client:
        client.run("k", lambda: first)
        (path,) = payload_files(tmp_path)
        if fault == "missing":
            path.unlink()
        elif fault == "truncated":
            path.write_bytes(first[: BIG // 2])
        elif fault == "longer":
            path.write_bytes(first + b"x")
        else:
            path.write_bytes(bytes([first[0] ^ 1]) + first[1:])
        with caplog.at_level(logging.WARNING, logger="dibs.payloads"):
            report = client.compute("k", lambda: second)
        assert (report.role, report.value) == ("computed", second)
        assert path.as_uri().rpartition(".")[0] in caplog.text and "computes again" in caplog.text
        assert client.run("k", lambda: b"never") == second  # the new artifact is a hit


def test_a_waiter_treats_a_missing_payload_as_a_free_key(
    records_url: str, payloads_url: str, tmp_path: Path
) -> None:
    with _client(records_url, payloads_url) as client:
        client.run("k", lambda: os.urandom(BIG))
        payload_files(tmp_path)[0].unlink()
        assert client.status("k").artifact is None  # a finished key whose payload is gone: nothing to take
        assert client.wait("k", timeout=5) is None  # free: the next ask computes
        with pytest.raises(dibs.WaitTimeout):
            client.wait("k", timeout=0.2, for_artifact=True)


def test_identical_payloads_are_stored_once(records_url: str, payloads_url: str, tmp_path: Path) -> None:
    same = os.urandom(BIG)
    with _client(records_url, payloads_url) as client:
        for key in ("a", "b", "c"):
            client.run(key, lambda: same)
        # One copy per writer, each a hard link of the first: the bytes are stored once.
        assert len(payload_files(tmp_path)) == 3 and len(stored_payloads(tmp_path)) == 1
        # forgetting one key keeps the payload the others still refer to
        assert client.forget("a")
        assert len(stored_payloads(tmp_path)) == 1
        assert client.run("b", lambda: b"never") == same
        assert client.forget("b") and client.forget("c")
        assert payload_files(tmp_path) == []


def test_the_older_copies_of_a_payload_records_refer_to_go_once_the_latest_is_old_enough(
    records_url: str, payloads_url: str, tmp_path: Path
) -> None:
    same = os.urandom(BIG)
    with _client(records_url, payloads_url) as client:
        store = client.store
        assert isinstance(store, ReferencingStore)
        for key in ("a", "b", "c"):
            client.run(key, lambda: same)
        copies = payload_files(tmp_path)
        latest = max(copies, key=lambda path: path.name)
        written = max(found.modified for found in store.payloads.list())
        eventually(lambda: time.time() > written + 0.01, "the clock to pass the copies' times")
        assert store.collect() == Freed(copies=2)  # names of one file: no bytes freed
        assert payload_files(tmp_path) == [latest]
        for key in ("a", "b", "c"):
            assert client.run(key, lambda: b"never") == same


def test_forget_and_prune_remove_payloads_nobody_refers_to(
    records_url: str, payloads_url: str, tmp_path: Path
) -> None:
    with _client(records_url, payloads_url) as client:
        client.run("a", lambda: os.urandom(BIG))
        client.run("b", lambda: os.urandom(BIG))
        assert len(payload_files(tmp_path)) == 2
        client.forget("a")
        assert len(payload_files(tmp_path)) == 1
        store = client.store
        assert isinstance(store, ReferencingStore)
        before = store.freed
        assert client.prune(0) == 2  # b's artifact, and a's record (emptied by forget)
        assert payload_files(tmp_path) == []
        assert (store.freed.payloads - before.payloads, store.freed.bytes - before.bytes) == (1, BIG)


def test_a_payload_written_under_a_live_lease_survives_a_collection(
    records_url: str, payloads_url: str, tmp_path: Path
) -> None:
    # The writer that has uploaded but not yet completed: nothing refers to its payload yet. The
    # grace is small but not 0: a file's mtime comes from the kernel's coarse clock, which may read a
    # few milliseconds behind the time the lease was granted at (the default grace is a minute).
    with _client(records_url, payloads_url, payload_grace=0.05) as client:
        store = client.store
        assert isinstance(store, ReferencingStore)
        got = client.get_or_reserve("k")
        assert isinstance(got, dibs.Acquired)
        uploaded = store.payloads.put(os.urandom(BIG))
        # older than the grace by the payload file's own clock: only the live lease keeps it now
        eventually(lambda: time.time() - payload_mtime(tmp_path) > 0.05, "the payload to outlive the grace")
        assert client.prune(0) == 0 and client.reap() == 0
        assert store.payloads.stat(uploaded.sha256) is not None
        got.lease.complete(uploaded)  # it publishes what it uploaded
        assert client.run("k", lambda: b"never") == store.payloads.open(uploaded.sha256).read()
        assert store.collect().payloads == 0  # referenced


def test_the_grace_keeps_recent_payloads(records_url: str, payloads_url: str, tmp_path: Path) -> None:
    with dibs.Reservations(records_url, payloads=payloads_url, serializer="bytes") as client:  # grace 60 s
        client.run("k", lambda: os.urandom(BIG))
        client.forget("k")
        assert len(payload_files(tmp_path)) == 1  # too recent to tell from a writer about to publish it
    with _client(records_url, payloads_url) as client:
        client.prune(0)
        assert payload_files(tmp_path) == []


def test_a_fenced_out_holder_publishes_nothing_and_its_payload_goes(
    records_url: str, payloads_url: str, tmp_path: Path
) -> None:
    with _client(records_url, payloads_url) as client:
        store = client.store
        assert isinstance(store, ReferencingStore)
        key = client.key("k")
        old = store.acquire(key, AcquireRequest("old", 60))
        assert isinstance(old, Granted)
        client.force_release(key)  # the operator's repair: the old holder is fenced out
        new = client.acquire("k", timeout=0)
        assert isinstance(new, dibs.Acquired)
        new.lease.complete(b"n" * BIG)
        stale = os.urandom(BIG)
        with pytest.raises(LeaseLost):
            dibs.Lease(client, old.lease).complete(stale)
        assert client.run("k", lambda: b"never") == b"n" * BIG
        assert [p.read_bytes() for p in payload_files(tmp_path)] == [b"n" * BIG]  # the stale one is gone


def test_a_candidate_too_recent_to_remove_is_decided_without_listing_the_records(
    records_url: str, payloads_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forget's payload, or a fenced-out writer's, written within the grace: the rule keeps it
    whatever the records say, so nothing lists every record (they may be millions) to decide it."""
    with _client(records_url, payloads_url, payload_grace=60.0) as client:
        store = client.store
        assert isinstance(store, ReferencingStore)
        listings: list[str | None] = []
        real_list = store.records.list

        def listing(namespace: str | None = None) -> Iterable[KeyState]:
            listings.append(namespace)
            return real_list(namespace)

        monkeypatch.setattr(store.records, "list", listing)
        client.run("k", lambda: os.urandom(BIG))
        assert client.forget("k")
        key = client.key("f")
        old = store.acquire(key, AcquireRequest("old", 60))
        assert isinstance(old, Granted)
        client.force_release(key)
        with pytest.raises(LeaseLost):
            dibs.Lease(client, old.lease).complete(os.urandom(BIG))
        assert listings == []
        assert len(payload_files(tmp_path)) == 2  # both kept: too recent to tell from a writer's
        assert store.collect().payloads == 0 and listings == [None]  # a full collection does list


def test_a_payload_store_that_cannot_be_written_is_a_failed_compute_whatever_the_policy(
    records_url: str, payloads_url: str, tmp_path: Path
) -> None:
    # The folder's "partial" directory is a file: every write fails with an OSError, as a full disk
    # or a lost network mount would. The caller keeps what it computed, and the lease is released at
    # once with the failure recorded (as for a value too large for the store), whatever the policy.
    folder = tmp_path / "payloads"
    folder.mkdir()
    (folder / "partial").write_bytes(b"not a folder")
    value = os.urandom(BIG)
    for policy in ("run", "fail"):
        with _client(records_url, payloads_url, ttl=600, on_store_unavailable=policy) as client:
            report = client.compute(f"k-{policy}", lambda: value)
            assert (report.value, report.stored) == (value, False)  # the caller keeps what it computed
            state = client.status(f"k-{policy}")
            assert state.artifact is None and state.live_lease is None  # nothing published, nothing held
            assert state.failure is not None and "writing a payload" in state.failure.error
    (folder / "partial").unlink()  # the disk is fixed: the next call computes and stores
    with _client(records_url, payloads_url, ttl=1.0) as client:
        assert client.run("k-run", lambda: value) == value
        assert client.run("k-run", lambda: b"never") == value


def test_streams_in_and_out(records_url: str, payloads_url: str, tmp_path: Path) -> None:
    source = tmp_path / "export.parquet"
    source.write_bytes(os.urandom(3 * 1024 * 1024 + 5))
    with _client(records_url, payloads_url) as client:
        report = client.compute("file", lambda: client.put_payload(source))
        assert report.role == "computed" and isinstance(report.value, dibs.payloads.Payload)
        with client.open_artifact("file") as stream:
            assert stream.read() == source.read_bytes()
        with client.artifact_path("file") as path:
            assert path.read_bytes() == source.read_bytes()
        assert client.run("file", lambda: b"never") == source.read_bytes()  # a value, for Python callers
        # A payload changed in place: a stream says so at its end, a path is refused before use.
        (stored,) = payload_files(tmp_path)
        data = source.read_bytes()
        stored.write_bytes(bytes([data[0] ^ 0xFF]) + data[1:])  # another first byte, whatever it was
        # A payload changed in place: nothing of it is handed out, neither as a stream nor as a path.
        with pytest.raises(PayloadUnavailable, match="SHA-256"):
            client.open_artifact("file")
        stored.write_bytes(bytes([data[0] ^ 0xFF]) + data[1:])  # damaged again (the first was removed)
        with pytest.raises(PayloadUnavailable), client.artifact_path("file"):
            pass


def test_streaming_needs_a_payload_store_and_a_reference_needs_its_reader_configured(
    records_url: str, payloads_url: str, tmp_path: Path
) -> None:
    with dibs.Reservations(records_url, serializer="bytes") as plain:
        with pytest.raises(ConfigurationError, match="payload store"):
            plain.put_payload(b"x")
        with _client(records_url, payloads_url) as client:
            client.run("big", lambda: os.urandom(BIG))
        with pytest.raises(ConfigurationError, match="payloads="):
            plain.run("big", lambda: b"never")


def test_async_callers_get_large_values_through_the_payload_store(
    records_url: str, payloads_url: str
) -> None:
    import asyncio

    big = os.urandom(BIG)

    async def compute() -> bytes:
        return big

    async def never() -> bytes:
        raise AssertionError("a hit computes nothing")

    async def both() -> tuple[bytes, bytes]:
        with _client(records_url, payloads_url) as client:
            aio = client.aio()
            return await aio.run("k", compute), await aio.run("k", never)

    assert asyncio.run(both()) == (big, big)


def test_a_closed_record_store_closes_its_referencing_stores(tmp_path: Path) -> None:
    """The runtime closes idle record stores: the referencing stores built on one go with it (they
    hold it, and would keep it and their watch hubs alive for the life of the process)."""
    from dibs.payloads import _OPENED, referencing
    from dibs.stores import open_store

    records = open_store(f"sqlite:///{tmp_path / 'records.db'}")
    made = referencing(records, (tmp_path / "payloads").as_uri())
    assert referencing(records, (tmp_path / "payloads").as_uri()) is made  # shared while open
    records.close()
    assert records not in _OPENED.referencing


def test_the_lease_hashes_a_large_payload_once_while_writing_it(
    records_url: str, payloads_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The hand-off's writing side reads the bytes once: the digest comes from the payload store's
    # writer, not from a checksum pass over the serialized value before the write.
    hashed: list[int] = []
    real = dibs.lease.checksum

    def counting(payload: bytes) -> str:
        hashed.append(len(payload))
        return real(payload)

    monkeypatch.setattr(dibs.lease, "checksum", counting)
    big, small = os.urandom(3 * 1024 * 1024 + 7), b"s" * 100  # several chunks: the helper thread runs
    with _client(records_url, payloads_url) as client:
        assert client.run("big", lambda: big) == big
        assert client.run("small", lambda: small) == small
        assert hashed == [len(small)]  # only the inline value was hashed by the lease
        recorded = decode(_raw(client, "big").payload, "test")[0]
        assert (recorded.sha256, recorded.size) == (hashlib.sha256(big).hexdigest(), len(big))
        assert client.run("big", lambda: b"never") == big


class _ReplyLostOnce(MemoryStore):
    """A record store that applies the first complete, then reports the connection as lost."""

    def __init__(self) -> None:
        super().__init__()
        self.completes = 0

    def complete(self, *args: Any, **kwargs: Any) -> ArtifactRecord:
        self.completes += 1
        record = super().complete(*args, **kwargs)
        if self.completes == 1:
            raise dibs.StoreUnavailable("connection reset by peer")
        return record


def test_a_lost_reply_after_an_offloaded_complete_is_recognised_without_writing_again(
    tmp_path: Path,
) -> None:
    records = _ReplyLostOnce()
    payloads = FilePayloadStore(tmp_path / "payloads")
    writers: list[object] = []
    original = payloads.writer
    payloads.writer = lambda: writers.append(1) or original()  # type: ignore[method-assign]
    value = os.urandom(BIG)
    with dibs.Reservations(ReferencingStore(records, payloads), serializer="bytes", ttl=5) as client:
        report = client.compute("k", lambda: value)
        assert (report.role, report.value, report.stored) == ("computed", value, True)
        assert records.completes == 1  # settled by reading: the record's checksum is the writer's digest
        assert len(writers) == 1  # and the payload was written once
        assert client.run("k", lambda: b"never") == value


@pytest.mark.parametrize("name", ["../../etc/passwd", "A" * 64, "a" * 63, "a" * 64 + "\n", ""])
def test_every_payload_store_names_a_payload_only_by_a_sha256(name: str, tmp_path: Path) -> None:
    import fsspec

    from dibs.payloads.fsspec import FsspecPayloadStore

    stores = [
        FilePayloadStore(tmp_path / "files"),
        FsspecPayloadStore(fsspec.filesystem("memory"), "/dibs-names", "memory:///dibs-names"),
    ]
    for store in stores:
        with pytest.raises(ValueError, match="not a SHA-256 in hex"):
            store.uri(name)
    assert FilePayloadStore(tmp_path / "files").uri("a" * 64).endswith("a" * 64)


def payload_mtime(root: Path) -> float:
    """When the newest payload file under ``root`` was last written (the file system's clock)."""
    return max(path.stat().st_mtime for path in payload_files(root))

"""The Azure store's index (:mod:`dibs.stores.azure.index`): a record that holds a lease always has its
``live`` blob, one with an artifact or a failure its ``made`` blob, whatever the interleaving of
holders; what is left behind is swept; reads through it see what a listing of every record would.

Runs against Azurite. The interleavings that matter are played deterministically, by running a second
store's call inside the first one's (between its record write and its index write); then several
processes race on a few keys, one killed with SIGKILL while it holds one, and the index is checked
against the records once they stop.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import json
import multiprocessing
import os
import random
import signal
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("azure.storage.blob")

from azure.core.exceptions import ResourceNotFoundError
from azure.storage.blob import (
    BlobServiceClient,
    ContainerClient,
    ContainerSasPermissions,
    generate_container_sas,
)

from dibs.errors import LeaseLost, StoreUnavailable
from dibs.keys import Key
from dibs.records import Granted, Held, KeyState, LeaseRecord, Present, checksum
from dibs.stores import AcquireRequest, NewArtifact, Store, pages
from dibs.stores.azure import AzureBlobStore, parse_url
from dibs.stores.azure import store as azure_store
from dibs.stores.azure.feed import EtagFeed
from dibs.stores.azure.index import Layout, micros
from dibs.testing.contract import opened_stores
from tests.backends import azure as backend

NAMESPACE = "azure.index"
SPAWN = multiprocessing.get_context("spawn")
#: How long the racing processes may take before the test gives up on them (not a measurement).
GENEROUS = 180.0


@pytest.fixture
def azure_url(tmp_path: Path) -> Iterator[str]:
    with backend.isolated_url(tmp_path) as url:
        yield url


@pytest.fixture
def open_azure(azure_url: str) -> Iterator[Callable[[], AzureBlobStore]]:
    with opened_stores(lambda: AzureBlobStore.from_url(azure_url)) as opener:
        yield opener


@pytest.fixture
def raw(azure_url: str) -> Iterator[ContainerClient]:
    settings = parse_url(azure_url)
    assert settings.connection_string is not None
    with BlobServiceClient.from_connection_string(settings.connection_string) as service:
        yield service.get_container_client(settings.container)


def _granted(outcome: object) -> LeaseRecord:
    assert isinstance(outcome, Granted), outcome
    return outcome.lease


def _index_blobs(raw: ContainerClient, store: AzureBlobStore) -> set[str]:
    try:
        return {blob.name for blob in raw.list_blobs(name_starts_with=f"{store.prefix}index/")}
    except ResourceNotFoundError:  # no container yet
        return set()


def _needed(store: AzureBlobStore, state: KeyState) -> set[str]:
    """The index blobs a record needs (the rules of .index)."""
    layout = Layout(store.prefix)
    names = set()
    if state.lease is not None:
        names.add(layout.live(state.key))
    if state.artifact is not None:
        names.add(layout.made("artifact", state.key, state.artifact.created_at))
    if state.failure is not None:
        names.add(layout.made("failure", state.key, state.failure.at))
    return names


def _payload(data: bytes) -> NewArtifact:
    return NewArtifact("bytes", data, checksum(data))


# --------------------------------------------------------------------------------------------------
# The blobs each write leaves


def test_each_write_leaves_the_index_blobs_its_record_needs_and_no_other(
    open_azure: Callable[[], AzureBlobStore], raw: ContainerClient
) -> None:
    store = open_azure()
    key = Key(NAMESPACE, "daily")

    def index_now() -> set[str]:
        return _index_blobs(raw, store) - {Layout(store.prefix).ready}

    lease = _granted(store.acquire(key, AcquireRequest("first", 60)))
    assert index_now() == _needed(store, store.read(key)) == {Layout(store.prefix).live(key)}
    live = next(iter(raw.list_blobs(name_starts_with=f"{store.prefix}index/live/")))
    store.heartbeat(key, lease.token, 120)  # the same lease: its blob is not written again
    again = next(iter(raw.list_blobs(name_starts_with=f"{store.prefix}index/live/")))
    assert again.etag == live.etag

    store.release(key, lease.token, "ValueError: bad rows")  # a failure, no lease
    failed = store.read(key)
    assert failed.failure is not None and failed.lease is None
    assert index_now() == _needed(store, failed)

    second = _granted(store.acquire(key, AcquireRequest("second", 60)))
    store.release(key, second.token, "ValueError: bad rows again")  # a newer failure replaces it
    assert index_now() == _needed(store, store.read(key))

    third = _granted(store.acquire(key, AcquireRequest("third", 60)))
    store.complete(key, third.token, _payload(b"rows"))  # an artifact; the failure stays recorded
    done = store.read(key)
    assert done.artifact is not None and done.failure is not None
    assert index_now() == _needed(store, done) and len(index_now()) == 2

    assert store.forget(key)  # nothing to show any more: no index blob either
    assert index_now() == set()


def test_a_holder_that_ends_its_lease_late_does_not_remove_the_next_holders_blob(
    open_azure: Callable[[], AzureBlobStore], raw: ContainerClient
) -> None:
    """The release lands, then (before the releasing call deletes the ``live`` blob) another process
    takes the key: the delete is refused, and the new lease stays in the index."""
    first, second = open_azure(), open_azure()
    key = Key(NAMESPACE, "handed-on")
    lease = _granted(first.acquire(key, AcquireRequest("first", 60)))
    taken: list[LeaseRecord] = []
    drop = first._drop_index

    def late_drop(key_: Key | None, name: str, etag: str | None = None) -> None:
        if not taken:
            taken.append(_granted(second.acquire(key, AcquireRequest("second", 60))))
        drop(key_, name, etag)

    first._drop_index = late_drop  # type: ignore[method-assign]
    first.release(key, lease.token)
    assert taken and first.read(key).lease is not None
    assert Layout(first.prefix).live(key) in _index_blobs(raw, first)
    (held,) = second.leases(NAMESPACE, expired=False, limit=10)
    assert held.lease is not None and held.lease.token == taken[0].token


def test_racing_takers_leave_one_blob_that_the_winners_end_removes(
    open_azure: Callable[[], AzureBlobStore], raw: ContainerClient
) -> None:
    """Two processes read the free key and both write its ``live`` blob; the first to swap wins. The
    loser's write came last, so the blob's ETag is the loser's: the winner's end must still remove it
    (an ETag remembered at the take would not match, and the blob would be left for every reader)."""
    winner, loser = open_azure(), open_azure()
    key = Key(NAMESPACE, "contended")
    write = winner._write

    def write_after_the_loser(key_: Key, version: object, new: KeyState) -> Any:
        if new.lease is not None and version is None:
            loser._put_index(key_, Layout(loser.prefix).live(key_))  # the loser's blob, written last
        return write(key_, version, new)

    winner._write = write_after_the_loser  # type: ignore[method-assign]
    lease = _granted(winner.acquire(key, AcquireRequest("winner", 60)))
    assert isinstance(loser.acquire(key, AcquireRequest("loser", 60)), Held)
    winner.complete(key, lease.token, _payload(b"x"))
    live = {name for name in _index_blobs(raw, winner) if "/live/" in name}
    assert live == set()


def test_a_failed_index_write_fails_the_take_and_leaves_the_record_as_it_was(
    open_azure: Callable[[], AzureBlobStore], raw: ContainerClient
) -> None:
    store = open_azure()
    key = Key(NAMESPACE, "no-index")
    store.read(key)
    before = store.read(key)

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise StoreUnavailable("the index could not be written (a test)")

    store._put_index = refuse  # type: ignore[method-assign]
    with pytest.raises(StoreUnavailable, match="index"):
        store.acquire(key, AcquireRequest("nobody", 60))
    assert store.read(key).lease is None and store.read(key).fence == before.fence


# --------------------------------------------------------------------------------------------------
# Reads through the index agree with a listing of every record


def _states_by_listing(store: AzureBlobStore) -> dict[str, Any]:
    """What the reads answer when they read every record (the base class's way)."""
    return {
        "held": Store.leases(store, NAMESPACE, expired=False, limit=100),
        "expired": Store.leases(store, NAMESPACE, expired=True, limit=100),
        "artifacts": Store.latest(store, NAMESPACE, "artifact", limit=100),
        "failures": Store.latest(store, NAMESPACE, "failure", limit=100),
    }


def _keys(states: list[KeyState]) -> list[Key]:
    return [state.key for state in states]


def test_reads_through_the_index_match_a_listing_of_every_record(
    open_azure: Callable[[], AzureBlobStore],
) -> None:
    store = open_azure()
    rng = random.Random(7)
    for i in range(30):
        key = Key(NAMESPACE, f"k-{i:02d}")
        lease = _granted(store.acquire(key, AcquireRequest(f"w-{i}", 0.2 if i % 5 == 0 else 600)))
        roll = rng.random()
        if i % 5 == 0:
            continue  # expires
        if roll < 0.4:
            store.complete(key, lease.token, _payload(str(i).encode()))
        elif roll < 0.6:
            store.release(key, lease.token, f"RuntimeError: {i}")
        elif roll < 0.7:
            store.release(key, lease.token)
    other = Key("azure.index.other", "k-00")  # another namespace: never in this one's answers
    store.complete(other, _granted(store.acquire(other, AcquireRequest("x", 60))).token, _payload(b"o"))
    deadline = time.monotonic() + GENEROUS  # the short leases run out on the store's clock
    while len(Store.leases(store, NAMESPACE, expired=True, limit=100)) < 6:
        assert time.monotonic() < deadline, "the 0.2 s leases did not expire"
        time.sleep(0.05)
    expected = _states_by_listing(store)
    assert _keys(store.leases(NAMESPACE, expired=False, limit=100)) == _keys(expected["held"])
    assert _keys(store.leases(NAMESPACE, expired=True, limit=100)) == _keys(expected["expired"])
    assert _keys(store.latest(NAMESPACE, "artifact", limit=100)) == _keys(expected["artifacts"])
    assert _keys(store.latest(NAMESPACE, "failure", limit=100)) == _keys(expected["failures"])
    assert _keys(store.latest(NAMESPACE, "artifact", limit=3)) == _keys(expected["artifacts"])[:3]
    assert len(expected["held"]) > 2
    page = store.list_page(NAMESPACE, state="held", limit=2)
    assert _keys(list(page.states)) == sorted(_keys(expected["held"]))[:2]
    assert page.after is not None
    following = store.list_page(NAMESPACE, state="held", after=page.after, limit=100)
    assert _keys(list(page.states) + list(following.states)) == sorted(_keys(expected["held"]))
    seen = store.overview(NAMESPACE, leases=100, recent=100)
    counts = Store.count_states(store, NAMESPACE)
    assert seen.counts == counts and seen.at_least == frozenset()  # 32 record blobs: all counted


def test_stale_index_blobs_are_passed_over_by_reads_and_swept_by_reap(
    open_azure: Callable[[], AzureBlobStore], raw: ContainerClient
) -> None:
    """Index blobs whose record no longer needs them (a process killed between its two writes, as
    here by hand): the reads show the records as they are, and reap removes the stale ``live`` blob."""
    store = open_azure()
    layout = Layout(store.prefix)
    done, free = Key(NAMESPACE, "done"), Key(NAMESPACE, "free")
    store.complete(done, _granted(store.acquire(done, AcquireRequest("w", 60))).token, _payload(b"d"))
    store.release(free, _granted(store.acquire(free, AcquireRequest("w", 60))).token)
    made = store.read(done).artifact
    assert made is not None
    stale = [
        layout.live(done),
        layout.live(free),
        layout.made("artifact", done, made.created_at + 1.0),  # newer than the record's own
        layout.made("failure", free, made.created_at),
    ]
    for name in stale:
        raw.get_blob_client(name).upload_blob(b"", overwrite=True)

    assert store.leases(NAMESPACE, expired=False, limit=10) == []
    assert store.leases(NAMESPACE, expired=True, limit=10) == []
    (latest,) = store.latest(NAMESPACE, "artifact", limit=10)
    assert latest.key == done and latest.artifact is not None
    assert micros(latest.artifact.created_at) == micros(made.created_at)
    assert store.latest(NAMESPACE, "failure", limit=10) == []

    etag = raw.get_blob_client(store.record_name(done)).get_blob_properties().etag
    store.reap(NAMESPACE)
    left = _index_blobs(raw, store)
    assert layout.live(done) not in left and layout.live(free) not in left
    # The sweep rewrote the record (a new ETag: a taker that read it before must swap again), unchanged.
    assert raw.get_blob_client(store.record_name(done)).get_blob_properties().etag != etag
    assert store.read(done).artifact == made


def test_a_store_written_without_the_index_is_indexed_by_its_first_read(
    open_azure: Callable[[], AzureBlobStore], raw: ContainerClient, caplog: pytest.LogCaptureFixture
) -> None:
    store = open_azure()
    keys = {name: Key(NAMESPACE, name) for name in ("held", "done", "failed")}
    store.acquire(keys["held"], AcquireRequest("w", 600))
    store.complete(
        keys["done"], _granted(store.acquire(keys["done"], AcquireRequest("w", 60))).token, _payload(b"d")
    )
    store.release(
        keys["failed"], _granted(store.acquire(keys["failed"], AcquireRequest("w", 60))).token, "Err: x"
    )
    for name in _index_blobs(raw, store):  # as an older dibs left the store: records only
        raw.delete_blob(name)

    reader = open_azure()
    with caplog.at_level("INFO", logger="dibs.stores.azure.store"):
        seen = reader.overview(NAMESPACE, leases=10, recent=10)
    assert "building the index" in caplog.text
    assert _keys(seen.held) == [keys["held"]]
    assert _keys(seen.artifacts) == [keys["done"]] and _keys(seen.failures) == [keys["failed"]]
    assert Layout(store.prefix).ready in _index_blobs(raw, store)
    for key in keys.values():
        assert _needed(store, store.read(key)) <= _index_blobs(raw, store)
    assert _assert_every_copy_is_its_record(raw, store) == 1  # the done key's, set by the rebuild

    caplog.clear()
    with caplog.at_level("INFO", logger="dibs.stores.azure.store"):
        assert _keys(open_azure().leases(NAMESPACE, expired=False, limit=10)) == [keys["held"]]
    assert "building the index" not in caplog.text  # once, for every process after it


def test_reads_of_every_namespace_still_list_the_records(open_azure: Callable[[], AzureBlobStore]) -> None:
    """The index is kept per namespace: a read of all of them lists the records, as before."""
    store = open_azure()
    a, b = Key("azure.index.a", "k"), Key("azure.index.b", "k")
    store.acquire(a, AcquireRequest("w", 600))
    store.complete(b, _granted(store.acquire(b, AcquireRequest("w", 60))).token, _payload(b"b"))
    seen = store.overview(None, leases=10, recent=10)
    assert _keys(seen.held) == [a] and _keys(seen.artifacts) == [b] and seen.at_least == frozenset()


def test_a_sweep_between_a_takers_two_writes_does_not_leave_its_lease_out(
    open_azure: Callable[[], AzureBlobStore], raw: ContainerClient
) -> None:
    """A taker wrote the ``live`` blob and has not swapped its record yet when ``reap`` sweeps: the blob
    looks stale (the record holds no lease), but the sweep's rewrite of the record makes the taker's
    swap fail, and its next attempt writes the blob again."""
    taker, reaper = open_azure(), open_azure()
    key = Key(NAMESPACE, "taken-during-a-sweep")
    first = _granted(taker.acquire(key, AcquireRequest("a", 60)))
    taker.release(key, first.token)  # a record that holds no lease
    write = taker._write
    swept: list[int] = []

    def sweep_first(key_: Key, version: object, new: KeyState) -> Any:
        if new.lease is not None and not swept:
            swept.append(reaper._indexed_reads.sweep(NAMESPACE))
        return write(key_, version, new)

    taker._write = sweep_first  # type: ignore[method-assign]
    _granted(taker.acquire(key, AcquireRequest("b", 60)))
    assert swept == [1]  # the sweep did delete the blob it found...
    assert taker.read(key).lease is not None
    assert Layout(taker.prefix).live(key) in _index_blobs(raw, taker)  # ...and the taker wrote it again


def test_a_reap_whose_sweep_fails_still_reports_what_it_reaped(
    open_azure: Callable[[], AzureBlobStore], caplog: pytest.LogCaptureFixture
) -> None:
    store = open_azure()
    key = Key(NAMESPACE, "short")
    store.acquire(key, AcquireRequest("w", 0.2))
    deadline = time.monotonic() + GENEROUS
    while store.read(key).status != "expired":
        assert time.monotonic() < deadline, "the 0.2 s lease did not expire"
        time.sleep(0.05)

    def refuse(*args: Any, **kwargs: Any) -> int:
        raise StoreUnavailable("the listing failed (a test)")

    store._indexed_reads.sweep = refuse  # type: ignore[method-assign]
    with caplog.at_level("WARNING", logger="dibs.stores.azure.store"):
        assert store.reap(NAMESPACE) == 1
    assert "could not sweep the index" in caplog.text
    assert store.read(key).status == "free"


def _complete_at(store: AzureBlobStore, key: Key, at: float) -> None:
    """A key completed at exactly ``at`` on the store's clock (the service's time, pinned)."""
    real = store._now
    store._now = lambda *args, **kwargs: at  # type: ignore[method-assign]
    try:
        lease = _granted(store.acquire(key, AcquireRequest("w", 3600)))
        store.complete(key, lease.token, _payload(key.name.encode()))
    finally:
        store._now = real  # type: ignore[method-assign]


def test_latest_breaks_ties_and_orders_within_a_microsecond_as_a_listing_does(
    open_azure: Callable[[], AzureBlobStore],
) -> None:
    """The service's clock may give several completions the same time (it never leaves the second of
    the ``Date`` header), and a blob's name holds whole microseconds: four keys made at the same
    instant come in key order, and four made within one microsecond in the order of their times."""
    store = open_azure()
    # Times of this size keep a tenth of a microsecond apart (at today's, a float's step is 0.24 µs).
    same = [Key(NAMESPACE, f"same-{i}") for i in range(4)]
    for key in reversed(same):
        _complete_at(store, key, 1_000_100.0)
    base = micros(1_000_000.0) / 1_000_000
    within = [Key(NAMESPACE, f"within-{i}") for i in range(4)]
    for i, key in enumerate(within):
        _complete_at(store, key, base + (i + 1) * 1e-7)
    everything = _keys(Store.latest(store, NAMESPACE, "artifact", limit=8))
    assert everything == [*same, *reversed(within)]  # what a listing of every record answers
    for limit in (1, 2, 5, 8):
        assert _keys(store.latest(NAMESPACE, "artifact", limit=limit)) == everything[:limit]


def test_a_reader_that_may_not_write_reads_by_the_listing(
    azure_url: str,
    open_azure: Callable[[], AzureBlobStore],
    raw: ContainerClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A read-and-list SAS (a dashboard's) cannot build a missing index: it reads by listing instead."""
    writer = open_azure()
    key = Key(NAMESPACE, "held")
    writer.acquire(key, AcquireRequest("w", 600))
    raw.delete_blob(Layout(writer.prefix).ready)  # as a store an older dibs wrote
    settings = parse_url(azure_url)
    assert settings.connection_string is not None
    with BlobServiceClient.from_connection_string(settings.connection_string) as service:
        sas = generate_container_sas(
            service.account_name,
            settings.container,
            account_key=service.credential.account_key,
            permission=ContainerSasPermissions(read=True, list=True),
            expiry=datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1),
        )
        account_url = service.url.rstrip("/")
    query = urllib.parse.urlencode({"account_url": account_url, "sas_token": sas})
    with (
        AzureBlobStore.from_url(
            f"azure://{settings.container}/{writer.prefix.rstrip('/')}?{query}"
        ) as reader,
        caplog.at_level("WARNING", logger="dibs.stores.azure.store"),
    ):
        assert _keys(reader.leases(NAMESPACE, expired=False, limit=10)) == [key]
        assert _keys(reader.overview(NAMESPACE, leases=10, recent=10).held) == [key]
    assert caplog.text.count("could not build the index") == 1  # once per process, then by listing
    assert Layout(writer.prefix).ready not in _index_blobs(raw, writer)


# --------------------------------------------------------------------------------------------------
# Record copies on the artifacts' ``made`` blobs (.copies): the record itself, or none


def _copy_on(raw: ContainerClient, name: str) -> bytes | None:
    """The record a ``made`` blob copies, as bytes (``None``: no copy, or no blob)."""
    try:
        metadata = raw.get_blob_client(name).get_blob_properties().metadata
    except ResourceNotFoundError:
        return None
    encoded = metadata.get("dibs_record")
    return None if encoded is None else base64.urlsafe_b64decode(encoded)


def _record_bytes(raw: ContainerClient, store: AzureBlobStore, key: Key) -> bytes:
    return bytes(raw.get_blob_client(store.record_name(key)).download_blob().readall())


def _copies(raw: ContainerClient, store: AzureBlobStore) -> dict[str, bytes]:
    """Every copy in the store's ``made`` blobs, by blob name."""
    found = {}
    for blob in raw.list_blobs(name_starts_with=f"{store.prefix}index/made/", include=["metadata"]):
        if (encoded := (blob.metadata or {}).get("dibs_record")) is not None:
            found[blob.name] = base64.urlsafe_b64decode(encoded)
    return found


def _assert_every_copy_is_its_record(raw: ContainerClient, store: AzureBlobStore) -> int:
    """Each copy is its key's record byte for byte, on the artifact's own blob; returns how many."""
    layout = Layout(store.prefix)
    copied = _copies(raw, store)
    for name, data in copied.items():
        made = layout.parse_made(name)
        assert made is not None and "/made/a/" in name, name
        doc = json.loads(data)
        state = store.read(Key(doc["namespace"], doc["name"]))
        assert data == _record_bytes(raw, store, state.key), name
        assert state.artifact is not None and state.lease is None
        assert layout.made("artifact", state.key, state.artifact.created_at) == name
    return len(copied)


def _downloads(store: AzureBlobStore) -> list[str]:
    """The records ``store``'s reads download from now on (their blob names)."""
    downloaded: list[str] = []
    download = store._list_entry

    def counted(name: str) -> KeyState | None:
        downloaded.append(name)
        return download(name)

    store._list_entry = counted  # type: ignore[method-assign]
    return downloaded


def test_a_done_keys_made_blob_copies_its_record_only_while_it_is_that_record(
    open_azure: Callable[[], AzureBlobStore], raw: ContainerClient
) -> None:
    store = open_azure()
    layout = Layout(store.prefix)
    key = Key(NAMESPACE, "copied")

    def blob_of(state: KeyState) -> str:
        assert state.artifact is not None
        return layout.made("artifact", key, state.artifact.created_at)

    store.complete(key, _granted(store.acquire(key, AcquireRequest("first", 60))).token, _payload(b"1"))
    first = store.read(key)
    assert _copy_on(raw, blob_of(first)) == _record_bytes(raw, store, key)

    refresh = _granted(store.acquire(key, AcquireRequest("refresh", 60, max_age=0)))
    assert _copy_on(raw, blob_of(first)) is None  # held again: never shown as done
    (shown,) = store.latest(NAMESPACE, "artifact", limit=5)
    assert shown.status == "held"
    store.release(key, refresh.token, "RuntimeError: the refresh failed")  # the artifact stays
    failed = store.read(key)
    assert failed.failure is not None and blob_of(failed) == blob_of(first)
    assert _copy_on(raw, blob_of(failed)) == _record_bytes(raw, store, key)  # with its failure

    again = _granted(store.acquire(key, AcquireRequest("again", 60, max_age=0)))
    store.complete(key, again.token, _payload(b"2"))
    second = store.read(key)
    assert blob_of(second) != blob_of(first)
    assert _copy_on(raw, blob_of(second)) == _record_bytes(raw, store, key)
    assert _assert_every_copy_is_its_record(raw, store) == 1  # the first artifact's blob is gone

    downloaded = _downloads(store)
    (latest,) = store.latest(NAMESPACE, "artifact", limit=5)
    assert second.artifact is not None  # the admin reads leave payloads out
    assert downloaded == [] and latest.key == key
    assert latest.artifact == dataclasses.replace(second.artifact, payload=b"")
    assert latest.failure == second.failure and latest.fence == second.fence
    assert store.forget(key)
    assert _copies(raw, store) == {} and store.latest(NAMESPACE, "artifact", limit=5) == []


def test_the_newest_done_keys_are_read_from_their_copies_as_from_their_records(
    open_azure: Callable[[], AzureBlobStore],
) -> None:
    store = open_azure()
    for i in range(12):
        key = Key(NAMESPACE, f"k-{i:02d}")
        lease = _granted(store.acquire(key, AcquireRequest(f"w-{i}", 60)))
        if i % 4 == 3:
            store.release(key, lease.token, f"RuntimeError: {i}")  # a failure: no artifact, no copy
        else:
            data = str(i).encode()
            store.complete(key, lease.token, NewArtifact("bytes", data, checksum(data), float(i)))
    refreshed = Key(NAMESPACE, "k-00")  # being computed again: downloaded, shown as held
    _granted(store.acquire(refreshed, AcquireRequest("refresh", 60, max_age=0)))
    downloaded = _downloads(store)
    through_copies = store.latest(NAMESPACE, "artifact", limit=20)
    assert downloaded == [store.record_name(refreshed)]
    expected = Store.latest(store, NAMESPACE, "artifact", limit=20)  # every record, downloaded
    assert len(through_copies) == 9
    assert [dataclasses.replace(s, now=0.0) for s in through_copies] == [
        dataclasses.replace(s, now=0.0) for s in expected
    ]
    assert [s.status for s in through_copies].count("held") == 1
    assert all(abs(s.now - expected[0].now) < 60 for s in through_copies)  # the listing's own time


def test_a_copy_set_late_is_refused_once_the_record_has_changed(
    open_azure: Callable[[], AzureBlobStore], raw: ContainerClient
) -> None:
    """The completion lands; before its writer copies the record, another process takes the key for a
    refresh (removing the copy first). The late copy is refused: the key is shown held, not done."""
    first, second = open_azure(), open_azure()
    key = Key(NAMESPACE, "copied-late")
    lease = _granted(first.acquire(key, AcquireRequest("first", 60)))
    copy = first._copy
    taken: list[LeaseRecord] = []

    def late_copy(key_: Key, name: str, metadata: dict[str, str], etag: str) -> None:
        taken.append(_granted(second.acquire(key, AcquireRequest("second", 60, max_age=0))))
        copy(key_, name, metadata, etag)

    first._copy = late_copy  # type: ignore[method-assign]
    first.complete(key, lease.token, _payload(b"x"))
    assert taken and _copies(raw, first) == {}
    (shown,) = first.latest(NAMESPACE, "artifact", limit=5)
    assert shown.status == "held" and shown.lease is not None and shown.lease.token == taken[0].token


def test_a_write_found_landed_by_its_bytes_sets_no_copy(
    open_azure: Callable[[], AzureBlobStore], raw: ContainerClient
) -> None:
    """Two force-releases of a refresh's lease read the same record and make the same change. The
    first lands and copies; a refresh then reads that record, removes the copy and stalls before its
    swap; the second force-release removes the copy again, is refused, and finds its own bytes. Its
    write counts as landed, but it may not copy: the stalled refresh's swap would leave the copy on a
    held record (found in review, 2026-12-03)."""
    first, second, refresher = open_azure(), open_azure(), open_azure()
    key = Key(NAMESPACE, "released-twice")
    first.complete(key, _granted(first.acquire(key, AcquireRequest("w", 60))).token, _payload(b"a"))
    _granted(first.acquire(key, AcquireRequest("refresh-1", 60, max_age=0)))
    stalled, go = threading.Event(), threading.Event()
    refreshed: list[object] = []
    write = refresher._write

    def stall(key_: Key, version: object, new: KeyState) -> Any:
        stalled.set()
        assert go.wait(GENEROUS)
        return write(key_, version, new)

    refresher._write = stall  # type: ignore[method-assign]
    refresh = threading.Thread(
        target=lambda: refreshed.append(refresher.acquire(key, AcquireRequest("refresh-2", 60, max_age=0)))
    )
    uncopy = second._uncopy
    raced: list[bool] = []

    def late_uncopy(key_: Key, name: str) -> str | None:
        if not raced:
            raced.append(first.force_release(key))  # lands and copies
            refresh.start()  # reads that record, removes its copy, stalls before its swap
            assert stalled.wait(GENEROUS)
        return uncopy(key_, name)

    second._uncopy = late_uncopy  # type: ignore[method-assign]
    assert second.force_release(key)  # its bytes, found after the refusal
    go.set()
    refresh.join(GENEROUS)
    assert raced == [True] and isinstance(refreshed[0], Granted)
    assert first.read(key).status == "held"
    assert _copies(raw, first) == {}
    (shown,) = first.latest(NAMESPACE, "artifact", limit=5)
    assert shown.status == "held"


def test_a_writer_killed_between_its_steps_leaves_no_copy_and_the_record_is_read(
    open_azure: Callable[[], AzureBlobStore], raw: ContainerClient
) -> None:
    """Killed (here: stopped by hand) after its record write but before the copy, or after removing the
    copy but before its record write: the blob is left without a copy, and reads download the record."""
    store = open_azure()
    layout = Layout(store.prefix)
    unset, removed = Key(NAMESPACE, "never-copied"), Key(NAMESPACE, "copy-removed")

    store._copy = lambda *args: None  # type: ignore[method-assign,assignment]
    store.complete(unset, _granted(store.acquire(unset, AcquireRequest("w", 60))).token, _payload(b"u"))
    del store._copy
    store.complete(removed, _granted(store.acquire(removed, AcquireRequest("w", 60))).token, _payload(b"r"))
    before = _record_bytes(raw, store, removed)

    def killed(*args: Any) -> Any:
        raise StoreUnavailable("killed before its record write (a test)")

    store._write = killed  # type: ignore[method-assign,assignment]
    with pytest.raises(StoreUnavailable, match="killed"):
        store.forget(removed)
    del store._write
    assert _record_bytes(raw, store, removed) == before and _copies(raw, store) == {}
    downloaded = _downloads(store)
    shown = store.latest(NAMESPACE, "artifact", limit=5)
    assert sorted(downloaded) == sorted(store.record_name(k) for k in (unset, removed))
    assert sorted(_keys(shown)) == sorted([unset, removed]) and {s.status for s in shown} == {"done"}
    assert all(
        layout.made("artifact", s.key, s.artifact.created_at) in _index_blobs(raw, store)
        for s in shown
        if s.artifact is not None
    )


def test_a_rebuild_copies_the_newest_done_keys_of_each_namespace(
    open_azure: Callable[[], AzureBlobStore], raw: ContainerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_azure()
    other = "azure.index.other"
    for namespace in (NAMESPACE, other):
        for i in range(4):
            _complete_at(store, Key(namespace, f"day-{i}"), 1_000_000.0 + i)
    for name in _index_blobs(raw, store):  # as an older dibs left the store: records only
        raw.delete_blob(name)
    monkeypatch.setattr(azure_store, "REBUILD_COPIES", 2)
    store.rebuild_index()
    _assert_every_copy_is_its_record(raw, store)
    copied = {
        json.loads(data)["namespace"] + "/" + json.loads(data)["name"]
        for data in _copies(raw, store).values()
    }
    assert copied == {f"{ns}/day-{i}" for ns in (NAMESPACE, other) for i in (2, 3)}  # the newest two each


def test_a_rebuild_that_cannot_copy_still_completes_the_index(
    open_azure: Callable[[], AzureBlobStore], raw: ContainerClient, caplog: pytest.LogCaptureFixture
) -> None:
    """The copies come after ``index/ready``: an error stops them (once, logged), not the index."""
    store = open_azure()
    for i in range(3):
        _complete_at(store, Key(NAMESPACE, f"day-{i}"), 1_000_000.0 + i)
    for name in _index_blobs(raw, store):
        raw.delete_blob(name)
    calls: list[str] = []

    def down(key: Key, name: str) -> str | None:
        calls.append(name)
        raise StoreUnavailable("the service went away (a test)")

    store._uncopy = down  # type: ignore[method-assign]
    with caplog.at_level("WARNING", logger="dibs.stores.azure.store"):
        assert store.rebuild_index() == 3
    assert Layout(store.prefix).ready in _index_blobs(raw, store) and store._index_ready
    assert _copies(raw, store) == {} and 1 <= len(calls) <= 3
    assert "could not copy the newest records" in caplog.text
    assert _keys(store.latest(NAMESPACE, "artifact", limit=5)) == [
        Key(NAMESPACE, f"day-{i}") for i in (2, 1, 0)
    ]


def test_a_copy_given_again_is_fenced_against_a_writer_that_read_the_record_before(
    open_azure: Callable[[], AzureBlobStore], raw: ContainerClient
) -> None:
    """A process reads the done record and removes its copy, then (before its swap) a rebuild gives the
    key its copy again: the rebuild's unchanged rewrite makes that swap fail, the process reads again
    and removes the copy before it takes the key. Without the rewrite, the copy would outlive the
    record it copies (a held key shown as done)."""
    store, other = open_azure(), open_azure()
    key = Key(NAMESPACE, "rebuilt")
    store.complete(key, _granted(store.acquire(key, AcquireRequest("w", 60))).token, _payload(b"r"))
    for name in _copies(raw, store):
        raw.get_blob_client(name).set_blob_metadata({})  # as a rebuild finds it, before the copy
    write = other._write
    copied: list[bool] = []

    def rebuild_first(key_: Key, version: object, new: KeyState) -> Any:
        if not copied:
            copied.append(store._copy_again(key))
        return write(key_, version, new)

    other._write = rebuild_first  # type: ignore[method-assign]
    refresh = _granted(other.acquire(key, AcquireRequest("refresh", 60, max_age=0)))
    del other._write
    assert copied == [True]  # set, then removed by the refresh's second attempt
    assert _copies(raw, store) == {}
    (shown,) = store.latest(NAMESPACE, "artifact", limit=5)
    assert shown.status == "held"
    assert store._copy_again(key) is False  # held: nothing to copy
    other.release(key, refresh.token)  # done again: the release sets the copy itself
    assert _assert_every_copy_is_its_record(raw, store) == 1
    assert store._copy_again(key) is True
    assert _assert_every_copy_is_its_record(raw, store) == 1


def test_a_record_too_long_for_the_metadata_gets_no_copy_and_is_downloaded(
    open_azure: Callable[[], AzureBlobStore], raw: ContainerClient
) -> None:
    """A failure message of 2,000 characters outside ASCII (escaped in the record's JSON) makes a record
    longer than a blob's 8 KB of metadata: it is left without a copy, and shown all the same."""
    store = open_azure()
    key = Key(NAMESPACE, "long-failure")
    failed = _granted(store.acquire(key, AcquireRequest("w", 60)))
    store.release(key, failed.token, "ValueError: " + "\u00e9\u2603" * 1000)
    store.complete(key, _granted(store.acquire(key, AcquireRequest("w", 60))).token, _payload(b"v"))
    assert len(_record_bytes(raw, store, key)) > 8192 and _copies(raw, store) == {}
    downloaded = _downloads(store)
    (shown,) = store.latest(NAMESPACE, "artifact", limit=5)
    assert downloaded == [store.record_name(key)]
    stored = store.read(key).failure
    assert shown.failure is not None and stored is not None and shown.failure.error == stored.error


# --------------------------------------------------------------------------------------------------
# Processes racing, one killed while it holds a key


def _churn(url: str, worker: int, keys: list[str], rounds: int, seed: int) -> None:
    """Take, refresh, complete, fail, release, forget, force-release and abandon a few keys at random,
    ``rounds`` times."""
    rng = random.Random(seed)
    with AzureBlobStore.from_url(url) as store:
        for _ in range(rounds):
            key = Key(NAMESPACE, rng.choice(keys))
            try:
                refresh = 0.0 if rng.random() < 0.25 else None  # a done key taken again: its copy removed
                ttl = rng.choice([0.3, 30.0])
                outcome = store.acquire(key, AcquireRequest(f"worker-{worker}", ttl, max_age=refresh))
            except StoreUnavailable:
                continue  # heavy contention on one key: another round
            if isinstance(outcome, Present) and rng.random() < 0.5:
                store.forget(key)
                continue
            if isinstance(outcome, Held) and rng.random() < 0.2:
                # An operator's repair racing the holder and the other repairs: the same change made
                # twice is how a write finds its own bytes after a refusal (no copy for it: .copies).
                store.force_release(key)
                continue
            if not isinstance(outcome, Granted):
                continue
            token, roll = outcome.lease.token, rng.random()
            try:
                if roll < 0.4:
                    store.complete(key, token, _payload(f"{worker}".encode()))
                elif roll < 0.6:
                    store.release(key, token, f"RuntimeError: worker {worker}")
                elif roll < 0.8:
                    store.release(key, token)
                # else: abandoned, its lease runs out
            except LeaseLost:
                pass  # a short lease taken over meanwhile


def _hold_until_killed(url: str, key: str, ready: Any) -> None:
    with AzureBlobStore.from_url(url) as store:
        _granted(store.acquire(Key(NAMESPACE, key), AcquireRequest("doomed", 0.5)))
        ready.set()
        time.sleep(GENEROUS)


def test_racing_processes_keep_every_record_in_the_index(azure_url: str, raw: ContainerClient) -> None:
    keys = [f"partition-{i}" for i in range(4)]
    ready = SPAWN.Event()
    doomed = SPAWN.Process(target=_hold_until_killed, args=(azure_url, "killed", ready))
    doomed.start()
    assert ready.wait(GENEROUS), "the holder to kill did not take its key"
    assert doomed.pid is not None
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.join(GENEROUS)
    workers = [SPAWN.Process(target=_churn, args=(azure_url, w, keys, 40, w)) for w in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(GENEROUS)
        if worker.is_alive():
            worker.kill()
    assert [worker.exitcode for worker in workers] == [0] * len(workers)
    # The 0.3 s leases the workers abandoned run out first: one that expired between the reads
    # compared below made a held key show as expired (CI, 2026-12-03). The 30 s ones outlast them.
    time.sleep(0.5)

    with AzureBlobStore.from_url(azure_url) as store:
        every = [Key(NAMESPACE, name) for name in [*keys, "killed"]]
        states = {key: store.read(key) for key in every}
        blobs = _index_blobs(raw, store)
        for key, state in states.items():  # nothing a record needs is missing
            assert _needed(store, state) <= blobs, (key, state)
        _assert_every_copy_is_its_record(raw, store)
        assert states[Key(NAMESPACE, "killed")].status == "expired"
        shown = {s.key for s in store.leases(NAMESPACE, expired=True, limit=100)}
        assert shown == {key for key, state in states.items() if state.status == "expired"}

        store.reap(NAMESPACE)  # clears the expired leases and sweeps what the races left
        states = {key: store.read(key) for key in every}
        live = {name for name in _index_blobs(raw, store) if "/live/" in name}
        assert live == {Layout(store.prefix).live(k) for k, s in states.items() if s.lease is not None}
        newest = [s for s in states.values() if s.artifact is not None]
        newest.sort(key=lambda s: -pages.made_at("artifact")(s))  # type: ignore[operator]
        assert _keys(store.latest(NAMESPACE, "artifact", limit=10)) == _keys(newest)
        _assert_every_copy_is_its_record(raw, store)


def test_many_watched_keys_are_followed_through_their_namespaces_live_blobs(
    open_azure: Callable[[], AzureBlobStore], raw: ContainerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With more keys watched than it asks about one by one, the change feed lists the watched
    namespaces' ``live`` blobs, never ``records/``: a look costs the keys being waited on, not the
    store's history (issue 30). A key's token changes when its lease ends or a new holder takes it,
    not at a heartbeat; a key with no ``live`` blob is followed by its record."""
    store, watcher, newcomer = open_azure(), open_azure(), open_azure()
    for i in range(30):  # history: finished keys nobody waits on
        key = Key(NAMESPACE, f"old-{i}")
        store.complete(key, _granted(store.acquire(key, AcquireRequest("w", 60))).token, _payload(b"o"))
    held = [Key(NAMESPACE, f"held-{i:02}") for i in range(20)]
    leases = {key: _granted(store.acquire(key, AcquireRequest("w", 600))) for key in held}
    feed = watcher.change_feed()
    assert isinstance(feed, EtagFeed)
    listed: list[str | None] = []
    list_blobs = watcher._container.list_blobs

    def counted(*args: Any, **kwargs: Any) -> Any:
        listed.append(kwargs.get("name_starts_with"))
        return list_blobs(*args, **kwargs)

    monkeypatch.setattr(watcher._container, "list_blobs", counted)
    before = dict(feed.tokens(held))
    assert set(before) == {key.digest for key in held}
    assert listed == [Layout(store.prefix).live_prefix(NAMESPACE)]

    done, beating, retaken, legacy = held[:4]
    # A key an older dibs holds: no live blob (deleted here as if never written). Its record is asked.
    raw.delete_blob(Layout(store.prefix).live(legacy))
    legacy_token = dict(feed.tokens(held))[legacy.digest]
    store.complete(done, leases[done].token, _payload(b"d"))
    store.heartbeat(beating, leases[beating].token, 600)
    # Completed, then taken again at once by another client (a refresh), between two looks.
    store.complete(retaken, leases[retaken].token, _payload(b"r"))
    _granted(newcomer.acquire(retaken, AcquireRequest("n", 600, max_age=0)))
    store.complete(legacy, leases[legacy].token, _payload(b"l"))
    after = dict(feed.tokens(held))
    changed = {digest for digest in before if after.get(digest) != before[digest]}
    assert changed == {done.digest, retaken.digest, legacy.digest}, "a token changed, or did not, wrongly"
    assert after[legacy.digest] != legacy_token
    assert all(prefix is not None and "/records/" not in f"/{prefix}" for prefix in listed), listed

    # Before the index is complete its live blobs cannot be trusted to exist: the records are listed.
    raw.delete_blob(Layout(store.prefix).ready)
    unindexed = open_azure()
    monkeypatch.setattr(unindexed._container, "list_blobs", counted)
    listed.clear()
    old_feed = unindexed.change_feed()
    assert isinstance(old_feed, EtagFeed)
    tokens = dict(old_feed.tokens(held))
    assert done.digest in tokens and len(tokens) == len(held)  # every record's ETag
    assert listed == [f"{store.prefix}records/"]


def test_waiters_on_many_keys_are_woken_when_each_holder_finishes(
    open_azure: Callable[[], AzureBlobStore],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Twenty waiters in one process, each on its own key, followed through the ``live`` blobs: each
    is handed the artifact its holder stored. The leases last 600 s, and the feed must neither fail
    nor be reopened (a reopened feed reads every key again, which would hand the artifacts over
    without it)."""
    from dibs.runtime import runtime

    looks: list[int] = []
    live = EtagFeed._live

    def counted(feed: EtagFeed, watched: list[Key]) -> Any:
        looks.append(len(watched))
        return live(feed, watched)

    monkeypatch.setattr(EtagFeed, "_live", counted)
    store, watcher = open_azure(), open_azure()
    keys = [Key(NAMESPACE, f"waited-{i:02}") for i in range(20)]
    leases = {key: _granted(store.acquire(key, AcquireRequest("w", 600))) for key in keys}
    subscriptions = {key: runtime().subscribe(watcher, key) for key in keys}
    try:
        with caplog.at_level("WARNING", logger="dibs.hub"):
            for key, subscription in subscriptions.items():  # each waiter has seen the key held
                state, deadline = None, time.monotonic() + 30
                while (state is None or state.lease is None) and time.monotonic() < deadline:
                    state = subscription.wait(1.0) or state
                assert state is not None and state.lease is not None, f"{key} was never offered held"
            seen = len(looks)
            for key in keys:
                store.complete(key, leases[key].token, _payload(key.name.encode()))
            for key, subscription in subscriptions.items():
                state = None
                deadline = time.monotonic() + 30
                while (state is None or state.artifact is None) and time.monotonic() < deadline:
                    state = subscription.wait(1.0) or state
                assert state is not None and state.artifact is not None, (
                    f"the waiter on {key} was never woken"
                )
                assert state.artifact.verified_payload(key) == key.name.encode()
        assert len(looks) > seen and max(looks) == len(keys), looks
        assert "lost the change feed" not in caplog.text
    finally:
        for subscription in subscriptions.values():
            subscription.close()

"""The Azure store's admin reads come from its blob listing, not a GET of every record (issue 30).

Counted, never timed: every request the SDK sends goes through a counting transport, and a test
says how many record downloads a read made. ``dibs top``'s snapshot (one listing for its five
reads) and a ``list_page`` of 10 make as many downloads at 2,500 keys as at 250 (each shown record
once, plus one listing request per 5,000 blobs); a record written by an older dibs, whose blob
carries no summary, is downloaded and shown as it is. Runs against Azurite; the summary's own format
is checked offline at the top.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("azure.storage.blob")

import requests
from azure.core.exceptions import ServiceRequestError
from azure.core.pipeline.transport import RequestsTransport
from azure.storage.blob import BlobServiceClient, ContainerClient, ContentSettings

import dibs
from dibs._cli.top import render, snapshot
from dibs.errors import ConfigurationError
from dibs.keys import MAX_NAME_LENGTH, Key
from dibs.records import (
    ArtifactRecord,
    FailureRecord,
    Granted,
    KeyState,
    LeaseRecord,
    LeaseToken,
    checksum,
)
from dibs.stores import AcquireRequest, NewArtifact, Store, codec, pages
from dibs.stores.azure import AzureBlobStore, parse_url
from dibs.stores.azure.indexed import OVERVIEW_COUNTED_BLOBS
from dibs.stores.azure.summary import metadata_of, summary_of
from tests.backends import azure as backend
from tests.cli_harness import PATIENCE

NAMESPACE = "azure.history"
#: Metadata is 8 KB per blob, names and values together.
METADATA_LIMIT = 8 * 1024


# --------------------------------------------------------------------------------------------------
# Offline: the summary's format


def _state(name: str, **records: Any) -> KeyState:
    key = Key(NAMESPACE, name)
    return KeyState(key, 0.0, fence=3, attempts=records.pop("attempts", 2), **records)


@pytest.mark.parametrize(
    "name", ["x", "   spaced  ", "naïve ✓ 特征", "s3://b/p=1/part-0.parquet", "𝄞" * 1024]
)
def test_a_summary_reads_back_the_key_and_the_exact_times(name: str) -> None:
    at = 1_764_000_000.123456789  # not a round number of anything: repr must round-trip it exactly
    key = Key(NAMESPACE, name)
    state = _state(
        name,
        lease=LeaseRecord(key, "o", LeaseToken(3, "id"), at, at + 0.1, 60.0, 2),
        artifact=ArtifactRecord("bytes", b"", 0, checksum(b""), "p", 2, at - 1e-6),
        failure=FailureRecord(1, "boom", "o", at / 3),
    )
    metadata = metadata_of(state)
    assert all(value.isascii() and value == value.strip() for value in metadata.values())
    assert sum(len(k) + len(v) for k, v in metadata.items()) < METADATA_LIMIT
    summary = summary_of(metadata, key.digest)
    assert summary is not None and summary.key == key and summary.attempts == 2
    assert (summary.lease_expires_at, summary.artifact_created_at, summary.failure_at) == (
        at + 0.1,
        at - 1e-6,
        at / 3,
    )
    for now in (at, at + 1.0):  # held, then expired (the artifact wins then: done)
        assert summary.skeleton(now).status == dataclasses.replace(state, now=now).status


def test_the_longest_name_fits_the_metadata_limit() -> None:
    state = _state("𝄞" * MAX_NAME_LENGTH)  # four UTF-8 bytes each
    metadata = metadata_of(state)
    assert "dibs_name" in metadata
    assert sum(len(k) + len(v) for k, v in metadata.items()) < METADATA_LIMIT


def test_a_summary_that_cannot_be_trusted_is_not_used() -> None:
    state = _state("a")
    good = metadata_of(state)
    assert summary_of(good, state.key.digest) is not None
    assert summary_of(good, Key(NAMESPACE, "b").digest) is None  # copied to another key's blob
    assert summary_of({"dibs_format": codec.FORMAT, "dibs_namespace": NAMESPACE}, state.key.digest) is None
    for field, value in [
        ("dibs_summary", "2"),
        ("dibs_name", "%%%"),
        ("dibs_attempts", "-1"),
        ("dibs_lease_expires_at", "nan"),
    ]:
        assert summary_of({**good, field: value}, state.key.digest) is None, field
    assert summary_of({k.upper(): v for k, v in good.items()}, state.key.digest) is not None


# --------------------------------------------------------------------------------------------------
# Against Azurite: requests counted


class _Counting(RequestsTransport):  # type: ignore[misc]
    """Sends every request, and keeps the method and path of each."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sent: list[tuple[str, str]] = []

    def send(self, request: Any, **kwargs: Any) -> Any:
        self.sent.append((request.method, request.url))
        return super().send(request, **kwargs)

    def clear(self) -> None:
        self.sent.clear()

    @property
    def record_gets(self) -> int:
        """Downloads of record blobs (a listing is a GET of the container, ``comp=list``)."""
        return sum(1 for method, url in self.sent if method == "GET" and "/records/" in url)

    @property
    def listings(self) -> int:
        return sum(1 for method, url in self.sent if method == "GET" and "comp=list" in url)


@pytest.fixture
def azure_url(tmp_path: Path) -> Iterator[str]:
    with backend.isolated_url(tmp_path) as url:
        yield url


@pytest.fixture
def raw(azure_url: str) -> Iterator[ContainerClient]:
    settings = parse_url(azure_url)
    assert settings.connection_string is not None
    with BlobServiceClient.from_connection_string(settings.connection_string) as service:
        yield service.get_container_client(settings.container)


@pytest.fixture
def counted(azure_url: str) -> Iterator[tuple[AzureBlobStore, _Counting]]:
    transport = _Counting()
    with AzureBlobStore.from_url(azure_url, transport=transport) as store:
        yield store, transport


def _grow(store: AzureBlobStore, raw: ContainerClient, count: int) -> None:
    """``count`` finished keys, one a day back in time, written as this dibs writes them (record and
    metadata) straight into the container: through the store's API it would take a request pair each."""
    now = time.time()

    def put(i: int) -> None:
        key = Key(NAMESPACE, f"day-{i:06d}")
        artifact = ArtifactRecord("bytes", b"", 1, checksum(b"1"), "backfill", 1, now - 86_400.0 * (i + 1))
        state = KeyState(key, now, fence=1, attempts=1, artifact=artifact)
        raw.get_blob_client(store.record_name(key)).upload_blob(
            codec.encode(state),
            metadata=metadata_of(state),
            content_settings=ContentSettings(content_type="application/json"),
        )

    store.acquire(Key(NAMESPACE, "first"), AcquireRequest("setup", 60))  # creates the container
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, range(count)))


def _granted(outcome: object) -> LeaseRecord:
    assert isinstance(outcome, Granted), outcome
    return outcome.lease


def _live(store: AzureBlobStore) -> dict[str, Key]:
    """Keys in every status, through the store's API: two held, one failed, one fresh artifact."""
    keys = {name: Key(NAMESPACE, name) for name in ("held-1", "held-2", "broken", "fresh")}
    for name in ("held-1", "held-2"):
        store.acquire(keys[name], AcquireRequest("worker", 600))
    broken = _granted(store.acquire(keys["broken"], AcquireRequest("flaky", 60)))
    store.release(keys["broken"], broken.token, "ValueError: no rows")
    fresh = _granted(store.acquire(keys["fresh"], AcquireRequest("worker", 60)))
    store.complete(keys["fresh"], fresh.token, NewArtifact("bytes", b"v", checksum(b"v")))
    return keys


@pytest.mark.parametrize("keys", [100, 1_000])
def test_top_and_a_page_download_only_what_they_show_whatever_the_namespace_size(
    counted: tuple[AzureBlobStore, _Counting], raw: ContainerClient, keys: int
) -> None:
    store, transport = counted
    _grow(store, raw, keys)
    live = _live(store)
    store.rebuild_index()  # the grown records were written straight into the container, unindexed
    client = dibs.Reservations(store, namespace=NAMESPACE)

    transport.clear()
    doc = snapshot(client)
    # 2 held + "first" held, 0 expired, 1 failure: each downloaded once. The 10 latest artifacts are
    # read from the copies on their made blobs: set by the completion of "fresh", and by the rebuild
    # that indexed the grown keys (.copies).
    assert transport.record_gets == 3 + 1
    # One listing each: the live leases, the newest artifacts, the newest failures, and the first
    # page of record blobs for the counts, asked for OVERVIEW_COUNTED_BLOBS at most.
    assert transport.listings == 4
    (counting,) = [url for method, url in transport.sent if "comp=list" in url and "records" in url]
    assert f"maxresults={OVERVIEW_COUNTED_BLOBS}" in counting
    held = [row["key"] for row in doc["held"]]  # soonest expiry first: "first" has a 60 s lease
    assert held == [str(Key(NAMESPACE, "first")), str(live["held-1"]), str(live["held-2"])]
    assert doc["recent_artifacts"][0]["key"] == str(live["fresh"])
    assert doc["recent_failures"][0] == {
        "key": str(live["broken"]),
        "owner": "flaky",
        "failures": 1,
        "error": "ValueError: no rows",
        "age_s": doc["recent_failures"][0]["age_s"],
    }
    if keys + 5 <= OVERVIEW_COUNTED_BLOBS:  # every record blob counted: exact
        assert doc["counts"] == {"held": 3, "expired": 0, "done": keys + 1, "failed": 1}
        assert doc["at_least"] == []
    else:  # held and expired exact (the index), done and failed among the first page: lower bounds
        assert {s: doc["counts"][s] for s in ("held", "expired")} == {"held": 3, "expired": 0}
        assert 0 < doc["counts"]["done"] <= OVERVIEW_COUNTED_BLOBS
        assert doc["at_least"] == ["done", "failed"]
        assert f"done {doc['counts']['done']}+" in render(doc, 120)

    transport.clear()
    page = store.list_page(NAMESPACE, state="done", limit=10)  # "broken" sorts first
    assert transport.record_gets == 10
    assert [s.key.name for s in page.states] == [f"day-{i:06d}" for i in range(10)]
    assert all(s.artifact is not None and s.artifact.producer == "backfill" for s in page.states)
    transport.clear()
    following = store.list_page(NAMESPACE, state="done", after=page.after, limit=10)
    assert transport.record_gets == 10
    assert [s.key.name for s in following.states] == [f"day-{i:06d}" for i in range(10, 20)]


def test_top_downloads_a_record_it_shows_twice_once(
    counted: tuple[AzureBlobStore, _Counting], raw: ContainerClient
) -> None:
    """A key being refreshed is held and holds the newest artifact: ``top`` shows it in both lists
    from one download (its five reads share what the snapshot downloaded)."""
    store, transport = counted
    _grow(store, raw, 20)
    key = Key(NAMESPACE, "refreshing")
    first = _granted(store.acquire(key, AcquireRequest("worker", 600)))
    store.complete(key, first.token, NewArtifact("bytes", b"v1", checksum(b"v1")))
    again = _granted(store.acquire(key, AcquireRequest("refresher", 600, max_age=0)))

    transport.clear()
    overview = store.overview(NAMESPACE, leases=5, recent=5)
    assert (key, again.token) in [(s.key, s.lease.token if s.lease else None) for s in overview.held]
    assert overview.artifacts[0].key == key  # the newest artifact, the one the refresh replaces
    lists = (overview.held, overview.expired, overview.artifacts, overview.failures)
    shown = {state.key for states in lists for state in states}
    downloaded = [url for method, url in transport.sent if method == "GET" and "/records/" in url]
    assert len(downloaded) == len(shown)  # each record shown, downloaded once
    assert len(set(downloaded)) == len(downloaded)


def test_a_record_without_a_summary_is_downloaded_and_shown_as_it_is(
    counted: tuple[AzureBlobStore, _Counting], raw: ContainerClient
) -> None:
    store, transport = counted
    _grow(store, raw, 30)
    live = _live(store)
    older = [live["held-1"], live["broken"], Key(NAMESPACE, "day-000000"), Key(NAMESPACE, "day-000007")]
    for key in older:  # as an older dibs wrote them: format and namespace only
        raw.get_blob_client(store.record_name(key)).set_blob_metadata(
            {"dibs_format": codec.FORMAT, "dibs_namespace": NAMESPACE}
        )
    store.rebuild_index()  # reads those four to index them
    for key in older:  # the rebuild's record copies rewrote the done ones, with summaries: as before
        raw.get_blob_client(store.record_name(key)).set_blob_metadata(
            {"dibs_format": codec.FORMAT, "dibs_namespace": NAMESPACE}
        )
    expected = {
        "page": Store.page(
            store, pages.Query(NAMESPACE, limit=1000)
        ).states,  # the default: every record read
        "latest": Store.latest(store, NAMESPACE, "artifact", limit=10),
        "failures": Store.latest(store, NAMESPACE, "failure", limit=10),
        "held": Store.leases(store, NAMESPACE, expired=False, limit=10),
        "counts": Store.count_states(store, NAMESPACE),
    }

    def keys(states: Any) -> list[Key]:
        return [s.key for s in states]

    transport.clear()
    assert store.count_states(NAMESPACE) == expected["counts"]
    assert transport.record_gets == len(older)  # only the blobs without a summary

    transport.clear()
    held = store.leases(NAMESPACE, expired=False, limit=10)
    assert keys(held) == keys(expected["held"])
    assert [s.lease.owner for s in held if s.lease is not None] == ["setup", "worker", "worker"]
    assert transport.record_gets == 3  # the held keys, found through the index, summary or not

    failures = store.latest(NAMESPACE, "failure", limit=10)
    assert keys(failures) == keys(expected["failures"]) == [live["broken"]]
    assert failures[0].failure is not None and failures[0].failure.error == "ValueError: no rows"
    assert keys(store.latest(NAMESPACE, "artifact", limit=10)) == keys(expected["latest"])

    transport.clear()
    page = store.list_page(NAMESPACE, limit=1000)
    assert keys(page.states) == keys(expected["page"])
    assert [s.status for s in page.states] == [s.status for s in expected["page"]]
    assert transport.record_gets == len(expected["page"])  # each shown once, none twice


def test_prune_and_reap_download_only_the_records_they_change(
    counted: tuple[AzureBlobStore, _Counting], raw: ContainerClient
) -> None:
    store, transport = counted
    _grow(store, raw, 300)
    short = _granted(store.acquire(Key(NAMESPACE, "short"), AcquireRequest("gone", 0.1)))
    while store.read(short.key).status != "expired":  # waits on the store's clock; no threshold
        time.sleep(0.05)

    transport.clear()
    assert store.reap(NAMESPACE) == 1
    # The expired lease: read to clear it, read to discard it; then the sweep of the index reads the
    # one key it names, "first", held, so its blob stays.
    assert transport.record_gets == 3
    gone = store.read(short.key)
    assert gone.status == "free" and gone.fence == 1  # a tombstone keeps the fence

    transport.clear()  # the dry run: chosen by the summaries too, and only those shown downloaded
    doomed = store.prunable_page(NAMESPACE, 86_400.0 * 290.5)
    assert [s.key.name for s in doomed.states] == [f"day-{i:06d}" for i in range(290, 300)]
    assert transport.record_gets == 10 and transport.listings == 1 and doomed.after is None
    transport.clear()
    assert store.prune(NAMESPACE, older_than=86_400.0 * 290.5) == 10  # day-000290 .. day-000299
    assert transport.record_gets == 10
    transport.clear()
    assert store.count_states(NAMESPACE)["done"] == 290
    assert transport.record_gets == 0  # the tombstones are known from their summaries


class _Overlapping(RequestsTransport):  # type: ignore[misc]
    """Holds each conditional record write (a ``PUT`` with ``If-Match``: a swap) until ``width`` of
    them are in flight at once, and keeps the most that ever were. A remover that changes one record
    at a time never gets there: its first write is let go after :data:`PATIENCE`, and the rest pass."""

    def __init__(self, width: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.width = width
        self.most = 0
        self.swaps = 0
        self._in_flight = 0
        self._gate = threading.Condition()
        self._open = False

    def send(self, request: Any, **kwargs: Any) -> Any:
        if request.method != "PUT" or "/records/" not in request.url or "If-Match" not in request.headers:
            return super().send(request, **kwargs)
        with self._gate:
            self._in_flight += 1
            self.swaps += 1
            self.most = max(self.most, self._in_flight)
            self._gate.notify_all()
            if not self._open:  # waited once (time enough for concurrent swaps to arrive): never again
                self._gate.wait_for(lambda: self.most >= self.width, PATIENCE)
                self._open = True
        try:
            return super().send(request, **kwargs)
        finally:
            with self._gate:
                self._in_flight -= 1


@pytest.mark.parametrize("action", ["prune", "reap"])
def test_prune_and_reap_swap_max_concurrency_records_at_once(
    azure_url: str, raw: ContainerClient, action: str
) -> None:
    """Removal changes its records ``max_concurrency`` at a time (counted in flight, not timed): each
    still its own read and ETag swap, so every one is changed once and a tombstone keeps its fence."""
    transport = _Overlapping(3)
    with AzureBlobStore.from_url(f"{azure_url}&max_concurrency=3", transport=transport) as store:
        if action == "prune":
            _grow(store, raw, 12)  # twelve old artifacts beside "first", held
            removed = store.prune(NAMESPACE, 3600.0)
            changed = [Key(NAMESPACE, f"day-{i:06d}") for i in range(12)]
        else:
            changed = [Key(NAMESPACE, f"gone-{i:02d}") for i in range(12)]
            for key in changed:
                store.acquire(key, AcquireRequest("gone", 0.1))
            deadline = time.monotonic() + PATIENCE  # on the store's clock; the bound only names a hang
            while store.read(changed[-1]).status != "expired":
                assert time.monotonic() < deadline, "a 0.1 s lease never expired on the service's clock"
                time.sleep(0.05)
            removed = store.reap(NAMESPACE)
        assert removed == 12
        assert transport.most == 3  # as many as max_concurrency in flight together, and no more
        assert transport.swaps == (12 if action == "prune" else 24)  # reap: clear the lease, discard
        for key in changed:
            state = store.read(key)
            assert (state.status, state.fence, state.attempts) == ("free", 1, 0), state


def test_a_removal_wider_than_requests_pool_reuses_its_connections(
    azure_url: str, raw: ContainerClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """With ``max_concurrency`` above requests' 10 connections a host, the swaps in flight together
    each keep a connection, and every one is kept for the next request: none is discarded (urllib3
    warns "Connection pool is full" for each it drops, and opens a new one, a TLS handshake on Azure,
    for the next). Each swap is held, its response in hand and its connection checked out, until
    ``width`` of them are: counted, not timed."""
    width = 16
    gate = threading.Condition()
    in_flight, most, opened = 0, 0, False
    send = requests.adapters.HTTPAdapter.send

    def held_send(adapter: requests.adapters.HTTPAdapter, request: Any, **kwargs: Any) -> Any:
        nonlocal in_flight, most, opened
        response = send(adapter, request, **kwargs)  # the body unread: the connection stays out
        if request.method == "PUT" and "/records/" in request.url and "If-Match" in request.headers:
            with gate:
                in_flight += 1
                most = max(most, in_flight)
                gate.notify_all()
                if not opened:
                    gate.wait_for(lambda: most >= width, PATIENCE)
                    opened = True
                in_flight -= 1
        return response

    with AzureBlobStore.from_url(f"{azure_url}&max_concurrency={width}") as store:
        _grow(store, raw, 2 * width)
        monkeypatch.setattr(requests.adapters.HTTPAdapter, "send", held_send)
        caplog.set_level(logging.WARNING, logger="urllib3.connectionpool")
        assert store.prune(NAMESPACE, 3600.0) == 2 * width
    assert most == width
    discarded = [r.getMessage() for r in caplog.records if "pool is full" in r.getMessage()]
    assert discarded == []


def test_a_bad_argument_is_refused_before_any_request(counted: tuple[AzureBlobStore, _Counting]) -> None:
    store, transport = counted
    transport.clear()
    with pytest.raises(ConfigurationError, match="state='busy'"):
        store.list_page(NAMESPACE, state="busy")
    with pytest.raises(ConfigurationError, match="kind='success'"):
        store.latest(NAMESPACE, "success", limit=5)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="limit=0"):
        store.leases(NAMESPACE, expired=False, limit=0)
    with pytest.raises(ConfigurationError, match="not a listing cursor"):
        store.list_page(NAMESPACE, after="nonsense")
    assert transport.sent == []


class _FailFirstListing(_Counting):
    """The first listing request fails before any response, as a reset connection does: the SDK sends
    it again without the per-call hooks, so that page arrives without the service's time."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.failed = 0

    def send(self, request: Any, **kwargs: Any) -> Any:
        if request.method == "GET" and "comp=list" in request.url and not self.failed:
            self.failed += 1
            raise ServiceRequestError("connection reset by peer (simulated)")
        return super().send(request, **kwargs)


def test_a_listing_page_without_the_services_time_is_read_record_by_record(azure_url: str) -> None:
    transport = _FailFirstListing()
    with AzureBlobStore.from_url(azure_url, transport=transport) as store:
        live = _live(store)
        transport.clear()
        assert store.count_states(NAMESPACE) == {"held": 2, "expired": 0, "done": 1, "failed": 1}
        assert transport.failed == 1
        assert transport.record_gets == len(live)  # no time to judge the summaries by: each downloaded
        transport.clear()
        assert store.count_states(NAMESPACE) == {"held": 2, "expired": 0, "done": 1, "failed": 1}
        assert transport.record_gets == 0

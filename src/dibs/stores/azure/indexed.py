"""The Azure store's reads through its index (:mod:`.index`): the leases from the ``live`` blobs, the
newest artifacts and failures from the ``made`` blobs, each record they name downloaded and trusted
over its index blob (or, for a done key, read from the copy of it its ``made`` blob carries:
:mod:`.copies`); and the sweep of the ``live`` blobs left behind.

They cost what they show: a listing of the namespace's ``live`` blobs and a download of each (the
keys held or expired now), and a page of ``made`` blobs per ``limit`` newest records, with a download
only of those without a copy (a key being computed again, a failure, a writer killed between its
steps). Only ``dibs top``'s counts of finished keys still list record blobs, the first page of them
(see :meth:`IndexedReads.overview`).
"""

from __future__ import annotations

import builtins
import functools
import itertools
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from azure.core.exceptions import ResourceNotFoundError
from azure.storage.blob import BlobProperties

from dibs.errors import CorruptRecord, StoreUnavailable
from dibs.records import KeyState
from dibs.stores import pages
from dibs.stores.azure import copies, index, reads
from dibs.stores.azure.clock import PagedExchanges
from dibs.stores.azure.copies import Echo
from dibs.stores.azure.reads import Entry
from dibs.stores.base import Skipped

if TYPE_CHECKING:
    from dibs.stores.azure.store import AzureBlobStore

__all__ = ["OVERVIEW_COUNTED_BLOBS", "IndexedReads"]

#: The record blobs ``dibs top`` counts the finished keys among: one listing request (see
#: IndexedReads.overview); past them, its counts of done and failed keys are lower bounds.
OVERVIEW_COUNTED_BLOBS = 1000
#: Blobs a listing request returns at most.
_LISTING_PAGE = 5000


class IndexedReads:
    """The reads of one :class:`~dibs.stores.azure.AzureBlobStore` through its index, once the index
    is complete (the store decides: :meth:`AzureBlobStore._indexed`)."""

    def __init__(self, store: AzureBlobStore) -> None:
        self._store = store
        self._layout = index.Layout(store.prefix)

    def listing(
        self, prefix: str, per_page: int, *, hooks: PagedExchanges | None = None
    ) -> Iterator[builtins.list[BlobProperties]]:
        """The index blobs under ``prefix`` in name order, a listing page at a time (each fetched only
        when the caller asks for it). With ``hooks``, with each blob's metadata, and each page's
        exchange in ``hooks`` when it is yielded (see :meth:`_made_pages`)."""
        extra: dict[str, Any] = {}
        if hooks is not None:
            extra = {
                "include": ["metadata"],
                "raw_request_hook": hooks.on_request,
                "raw_response_hook": hooks.on_response,
            }
        listed = self._store._container.list_blobs(
            name_starts_with=prefix, results_per_page=per_page, **extra
        ).by_page()

        def next_page() -> builtins.list[BlobProperties] | None:
            try:
                return builtins.list(next(listed))
            except (StopIteration, ResourceNotFoundError):  # the end, or no container yet
                return None

        while (page := self._store._call("list the index in", None, next_page)) is not None:
            yield page

    def record_of(self, digest: str) -> str:
        return f"{self._store.prefix}records/{digest}"

    def live(self, namespace: str, fetch: reads.Fetch) -> builtins.list[Entry]:
        """The namespace's records that hold a lease, in key order, found through their ``live`` blobs
        and downloaded (each judged on the service's clock of its own read)."""
        prefix = self._layout.live_prefix(namespace)
        names = [
            self.record_of(digest)
            for page in self.listing(prefix, _LISTING_PAGE)
            for blob in page
            if (digest := self._layout.parse_live(blob.name)) is not None
        ]
        entries = [
            Entry(name, state, downloaded=True)
            for name, state in zip(names, fetch(names), strict=True)
            if state is not None and state.lease is not None and state.key.namespace == namespace
        ]
        entries.sort(key=lambda entry: entry.state.key)
        return entries

    def latest(
        self, namespace: str, kind: pages.Kind, limit: int, fetch: reads.Fetch
    ) -> builtins.list[KeyState]:
        """The ``limit`` newest artifacts (or failures) of the namespace, newest first, ties in key
        order (as :func:`~dibs.stores.pages.latest_of` has them): the ``made`` blobs in name order, a
        page of ``limit`` at a time, each record read from the blob's copy or else downloaded, and kept
        only when it still holds what its blob names (a stale blob is passed over). A name holds
        whole microseconds, so the blobs of the last microsecond taken are all read before the exact
        times and keys decide the order."""
        pages.check_limit(limit)
        made = pages.made_at(kind)
        found: builtins.list[KeyState] = []
        shown: set[str] = set()
        last: int | None = None  # the microsecond of the limit-th record found: read all of it
        # A page of one more than asked: past the limit-th record, the next name most often tells
        # that its microsecond is over, with no further request.
        per_page = min(limit + 1, _LISTING_PAGE)
        done = False
        for page, now in self._made_pages(self._layout.made_prefix(kind, namespace), per_page):
            entries = [
                (m, self._copied(blob, m, now))
                for blob in page
                if (m := self._layout.parse_made(blob.name)) is not None
            ]
            while entries and not done:
                if last is None:  # as many as are missing (more only when some turn out stale)
                    batch, entries = entries[: limit - len(found)], entries[limit - len(found) :]
                else:  # the rest of the last microsecond kept; an older name ends the read
                    batch = list(itertools.takewhile(functools.partial(_not_older, last), entries))
                    done, entries = len(batch) < len(entries), []
                fetched = iter(fetch([self.record_of(m.digest) for m, copy in batch if copy is None]))
                for entry, copy in batch:
                    state = copy if copy is not None else next(fetched)
                    at = None if state is None else made(state)
                    if state is None or at is None or entry.digest in shown or index.micros(at) != entry.at:
                        continue
                    if state.key.namespace != namespace:
                        continue
                    shown.add(entry.digest)
                    found.append(state)
                    if last is None and len(found) == limit:
                        last = entry.at
            if done:
                break
        found.sort(key=lambda state: (-(made(state) or 0.0), state.key.namespace, state.key.name))
        return found[:limit]

    def _made_pages(
        self, prefix: str, per_page: int
    ) -> Iterator[tuple[builtins.list[BlobProperties], float | None]]:
        """As :meth:`listing`, with each blob's metadata (the record copies of :mod:`.copies`) and the
        service's time of the page that listed it (``None`` when its response left none to read)."""
        hooks = PagedExchanges()
        for page in self.listing(prefix, per_page, hooks=hooks):
            exchange = hooks.take()  # the page just listed: the next is asked for when we resume
            now = None
            if exchange.received is not None:
                try:
                    now = self._store._now(exchange, "a listing of", self._store._where(prefix))
                except StoreUnavailable:  # no usable Date: its records are downloaded instead
                    now = None
            yield page, now

    def _copied(self, blob: BlobProperties, made: index.Made, now: float | None) -> KeyState | None:
        """The record a listed ``made`` blob copies, when it has a copy to trust (see :mod:`.copies`)."""
        if now is None:
            return None
        return copies.record_in(blob.metadata, made.digest, now, where=self._store._where(blob.name))

    def sweep(self, namespace: str | None) -> int:
        """Delete the ``live`` blobs whose record holds no lease (left by a process killed between its
        two writes, or by a lost swap); returns how many. Each record is rewritten unchanged first (a
        swap on its ETag), so a writer that read it before and is about to take the key fails its swap
        and writes its ``live`` blob again; the delete is ``If-Match`` the listed ETag, refused when a
        writer rewrote the blob since. A blob whose record does not exist is left (a first write that
        never landed): nothing can be swapped to fence its writer out."""
        swept = 0
        for page in self.listing(self._layout.live_prefix(namespace), _LISTING_PAGE):
            for blob in page:
                digest = self._layout.parse_live(blob.name)
                if digest is None:
                    continue
                try:
                    listed = self._store._list_entry(self.record_of(digest))
                except CorruptRecord:
                    continue  # not a record dibs can read: reported by the reads, left alone here
                if listed is None or listed.lease is not None:
                    continue
                state, version = self._store._load(listed.key)
                if state.lease is not None or version is None:
                    continue
                if self._store._write(state.key, version, state) in (True, Echo.SAME):  # written
                    self._store._drop_index(state.key, blob.name, str(blob.etag))
                    swept += 1
        return swept

    def overview(self, namespace: str, *, leases: int, recent: int, up_to: int) -> pages.Overview:
        """``dibs top`` through the index: the leases from the ``live`` blobs, the newest artifacts and
        failures from the ``made`` blobs, each record shown downloaded once. Held and expired are
        counted exactly (from the live records); done and failed among the first
        :data:`OVERVIEW_COUNTED_BLOBS` record blobs of the listing: when the store has more, those two
        counts are lower bounds (:attr:`~dibs.stores.pages.Overview.at_least`), as no listing short of
        every record blob can count them.

        The counting listing, the slowest part (1,000 blobs with their metadata to send and to parse),
        runs in a thread of its own beside the rest, which shares one downloader (a record shown twice
        is downloaded once)."""
        skipped: builtins.list[Skipped] = []
        fetch = self._store._fetcher(skipped)
        with ThreadPoolExecutor(1, thread_name_prefix="dibs-azure-count") as pool:
            counting = pool.submit(self._store._entries_among, namespace, OVERVIEW_COUNTED_BLOBS)
            live = self.live(namespace, fetch)
            held = reads.leases(lambda: live, fetch, expired=False, limit=leases)
            expired = reads.leases(lambda: live, fetch, expired=True, limit=leases)
            artifacts = self.latest(namespace, "artifact", recent, fetch)
            failures = self.latest(namespace, "failure", recent, fetch)
            entries, _, complete = counting.result()
        counts = pages.count_of(
            (entry.state for entry in entries if entry.state.status in ("done", "failed")), up_to
        )
        if not complete:  # a lower bound either way: the larger of the page's and the lists' own
            for status, shown in (("done", artifacts), ("failed", failures)):
                counts[status] = min(up_to, max(counts[status], sum(1 for s in shown if s.status == status)))
        for status, count in pages.count_of((entry.state for entry in live), up_to).items():
            if status in ("held", "expired"):
                counts[status] = count
        return pages.Overview(
            counts=counts,
            held=held,
            expired=expired,
            artifacts=artifacts,
            failures=failures,
            at_least=frozenset() if complete else frozenset({"done", "failed"}),
        )


def _not_older(microsecond: int, entry: tuple[index.Made, KeyState | None]) -> bool:
    return entry[0].at >= microsecond

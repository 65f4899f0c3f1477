"""The Azure Blob store's change feed: one poller per process, following the watched keys by ETags.

A few keys are followed by their records' ETags, a ``HEAD`` each. For many, the feed lists the
``live`` index blobs (:mod:`.index`) of the watched namespaces: a waiter nearly always waits on a key
whose record holds a lease, and every such record has its ``live`` blob, which a write that takes the
lease overwrites (a new ETag) and a write that ends it (a completion, a release, a failure, a reap of
an expired lease) deletes *after* its swap. So a look costs one listing of the live work, where a
listing of ``records/`` read every record the store ever wrote (a history of 100,000 keys is 20
listing requests of 5,000 blobs, on every look, for a triggerer waiting on a few keys). A heartbeat
changes no ``live`` blob, and needs not: a waiter looks again when the lease it saw would expire.

A watched key that has no ``live`` blob (its lease just ended; or it is free or done, watched by a
wait for an artifact; or an older dibs, which writes no index blob, holds it) is followed by its
record's ETag, a ``HEAD``; when more than :attr:`EtagFeed.LIST_ABOVE` of them are, the records are
listed, as they are before the index is complete (no ``index/ready``: a store an older dibs wrote,
not indexed yet).

What a ``live`` blob cannot tell: a holder killed between its swap and the blob's delete (or whose
delete failed) leaves the blob as it was, so its key's token does not change. Its waiters learn of
the completion from their own look at the store (``Backoff.notify_maximum``, 10 s by default), and
``reap`` sweeps the blob.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Protocol, TypeVar

from azure.core.exceptions import ResourceNotFoundError
from azure.storage.blob import ContainerClient

from dibs.keys import Key
from dibs.stores.feeds import PollingFeed
from dibs.stores.name_index import Layout

__all__ = ["INDEX_RECHECK", "Call", "EtagFeed"]

T = TypeVar("T")
#: Seconds between two looks for ``index/ready`` while it is missing.
INDEX_RECHECK = 30.0


class Call(Protocol):
    """``call(action, key, fn)``: run one SDK call, its errors turned into dibs errors naming ``action``."""

    def __call__(self, action: str, key: Key | None, fn: Callable[[], T], /) -> T: ...


class EtagFeed(PollingFeed):
    """Follows the watched keys by ETags: the records' for a few keys; for many, the ``live`` index
    blobs' of their namespaces, and the records' of those that have none (see the module).

    It gets what it needs from the store (the container, how a key's record blob is named, the
    store's prefix, the index's layout, whether the index is complete, and ``call``, which runs an SDK
    call and translates its errors), not the store itself.
    """

    min_interval = 0.05
    max_interval = 1.0
    #: Above this many keys to follow by their records, one listing is cheaper than a ``HEAD`` each.
    LIST_ABOVE = 16
    #: Above this many watched namespaces, the ``live`` blobs of every namespace are listed at once.
    NAMESPACES_APART = 4

    def __init__(
        self,
        container: ContainerClient,
        *,
        record_name: Callable[[Key], str],
        prefix: str,
        layout: Layout,
        indexed: Callable[[], bool],
        call: Call,
    ) -> None:
        super().__init__()
        self._container = container
        self._record_name = record_name
        self._records_prefix = f"{prefix}records/"
        self._layout = layout
        self._indexed = indexed
        self._index_seen, self._index_recheck_at = False, 0.0
        self._call = call

    def tokens(self, keys: Iterable[Key]) -> Mapping[str, Hashable]:
        watched = list(keys)
        if len(watched) <= self.LIST_ABOVE:
            return self._call("follow the records in", None, lambda: self._heads(watched))
        if not self._index_complete():
            return self._call("follow the records in", None, lambda: self._records(watched))
        found = self._call("follow the index in", None, lambda: self._live(watched))
        unleased = [key for key in watched if key.digest not in found]
        if len(unleased) > self.LIST_ABOVE:  # many ended at once, or an older dibs holds them
            return self._call("follow the records in", None, lambda: self._records(watched))
        if unleased:
            found.update(self._call("follow the records in", None, lambda: self._heads(unleased)))
        return found

    def _index_complete(self) -> bool:
        """Whether the index is complete: asked of the store at most every :data:`INDEX_RECHECK`
        seconds until it is (a look must not cost an extra request on a store an older dibs wrote)."""
        if not self._index_seen and time.monotonic() >= self._index_recheck_at:
            self._index_seen = self._indexed()
            self._index_recheck_at = time.monotonic() + INDEX_RECHECK
        return self._index_seen

    def _heads(self, watched: list[Key]) -> dict[str, Hashable]:
        """Each record's ETag, one ``HEAD`` each (a key without a record is left out)."""
        found: dict[str, Hashable] = {}
        for key in watched:
            with contextlib.suppress(ResourceNotFoundError):
                blob = self._container.get_blob_client(self._record_name(key))
                found[key.digest] = ("record", blob.get_blob_properties().etag)
        return found

    def _live(self, watched: list[Key]) -> dict[str, Hashable]:
        """The ETag of each watched key's ``live`` blob (a key holding no lease is left out), from one
        listing of each watched namespace's ``live`` blobs, or of every namespace's when many are."""
        namespaces = sorted({key.namespace for key in watched})
        prefixes = (
            [self._layout.live_prefix(None)]
            if len(namespaces) > self.NAMESPACES_APART
            else [self._layout.live_prefix(namespace) for namespace in namespaces]
        )
        wanted = {key.digest for key in watched}
        found: dict[str, Hashable] = {}
        try:
            for prefix in prefixes:
                for blob in self._container.list_blobs(name_starts_with=prefix):
                    digest = self._layout.parse_live(blob.name)
                    if digest in wanted:
                        found[digest] = ("live", blob.etag)
        except ResourceNotFoundError:  # no container yet: no leases
            return {}
        return found

    def _records(self, watched: list[Key]) -> dict[str, Hashable]:
        """Each record's ETag, from one listing of every record blob."""
        wanted = {self._record_name(key): key.digest for key in watched}
        try:
            return {
                wanted[blob.name]: ("record", blob.etag)
                for blob in self._container.list_blobs(name_starts_with=self._records_prefix)
                if blob.name in wanted
            }
        except ResourceNotFoundError:  # no container yet: no records
            return {}

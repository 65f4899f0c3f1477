"""The Azure Blob store's change feed: one poller per process, following the watched keys by ETags.

A waiter waits only on a key whose record holds a lease, and every such record has its ``live`` index
blob (:mod:`.index`), which each write that takes the lease overwrites (a new ETag) and each write that
ends it deletes *after* its swap. So when many keys are watched, the feed lists the ``live`` blobs of
their namespaces: one request per namespace for as many held keys as it has (live work), where a
listing of ``records/`` read every record the store ever wrote (a history of 100,000 keys is 20
listing requests of 5,000 blobs, on every poll). A completion, a release, a failure, a reap or a
``forget`` deletes the key's ``live`` blob; a new holder overwrites it: each changes the key's token.
A heartbeat does not, and needs not: a waiter looks again when the lease it saw would expire.

Before the index is complete (``index/ready`` missing: a store an older dibs wrote, not read since)
its ``live`` blobs cannot be trusted to exist, and the feed lists ``records/`` as it used to.
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
    """Follows the watched keys by ETags: one ``HEAD`` per record while few keys are watched, else one
    listing of each watched namespace's ``live`` index blobs (or, before the index is complete, of
    every record blob).

    It gets what it needs from the store (the container, how a key's record blob is named, the
    store's prefix, the index's layout, whether the index is complete, and ``call``, which runs an SDK
    call and translates its errors), not the store itself.
    """

    min_interval = 0.05
    max_interval = 1.0
    #: Above this many watched keys one listing is cheaper than a request per record.
    LIST_ABOVE = 16

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
        namespaces = {key.namespace for key in watched}
        if len(namespaces) < len(watched) and self._index_complete():
            return self._call("follow the index in", None, lambda: self._live(watched, namespaces))
        return self._call("follow the records in", None, lambda: self._records(watched))

    def _index_complete(self) -> bool:
        """Whether the index is complete: asked of the store at most every :data:`INDEX_RECHECK`
        seconds until it is (a poll must not cost an extra request on a store an older dibs wrote)."""
        if not self._index_seen and time.monotonic() >= self._index_recheck_at:
            self._index_seen = self._indexed()
            self._index_recheck_at = time.monotonic() + INDEX_RECHECK
        return self._index_seen

    def _heads(self, watched: list[Key]) -> dict[str, Hashable]:
        """Each record's ETag, one ``HEAD`` each."""
        found: dict[str, Hashable] = {}
        for key in watched:
            with contextlib.suppress(ResourceNotFoundError):
                blob = self._container.get_blob_client(self._record_name(key))
                found[key.digest] = blob.get_blob_properties().etag
        return found

    def _live(self, watched: list[Key], namespaces: set[str]) -> dict[str, Hashable]:
        """Each watched key's ``live`` blob's ETag (absent: the key holds no lease), from one listing of
        each namespace's ``live`` blobs."""
        wanted = {key.digest for key in watched}
        found: dict[str, Hashable] = {}
        try:
            for namespace in sorted(namespaces):
                for blob in self._container.list_blobs(name_starts_with=self._layout.live_prefix(namespace)):
                    digest = self._layout.parse_live(blob.name)
                    if digest in wanted:
                        found[digest] = ("live", blob.etag)
        except ResourceNotFoundError:  # no container yet: no records
            return {}
        return found

    def _records(self, watched: list[Key]) -> dict[str, Hashable]:
        """Each record's ETag, from one listing of every record blob."""
        wanted = {self._record_name(key): key.digest for key in watched}
        try:
            return {
                wanted[blob.name]: blob.etag
                for blob in self._container.list_blobs(name_starts_with=self._records_prefix)
                if blob.name in wanted
            }
        except ResourceNotFoundError:  # no container yet: no records
            return {}

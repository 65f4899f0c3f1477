"""Store wrappers: force polling (no watch hub), and count every call a waiter makes.

Both are real :class:`dibs.stores.Store` subclasses, so :class:`dibs.Reservations` uses them exactly
like the store they wrap.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence

from dibs.keys import Key
from dibs.records import ArtifactRecord, KeyState, LeaseRecord, LeaseToken, StoreOutcome
from dibs.stores import AcquireRequest, NewArtifact
from dibs.stores.base import Store
from dibs.stores.feeds import ChangeFeed, PollingFeed

__all__ = ["CountingStore", "DelegatingStore", "PollingStore"]


class DelegatingStore(Store):
    """Forwards every operation to ``inner``."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner

    @property
    def url(self) -> str:
        return self.inner.url

    def read(self, key: Key) -> KeyState:
        return self.inner.read(key)

    def acquire(self, key: Key, request: AcquireRequest) -> StoreOutcome:
        return self.inner.acquire(key, request)

    def heartbeat(self, key: Key, token: LeaseToken, ttl: float) -> LeaseRecord:
        return self.inner.heartbeat(key, token, ttl)

    def complete(self, key: Key, token: LeaseToken, artifact: NewArtifact) -> ArtifactRecord:
        return self.inner.complete(key, token, artifact)

    def release(self, key: Key, token: LeaseToken, error: str | None = None, *, counted: bool = True) -> None:
        self.inner.release(key, token, error, counted=counted)

    def force_release(self, key: Key) -> bool:
        return self.inner.force_release(key)

    def forget(self, key: Key) -> bool:
        return self.inner.forget(key)

    def list(self, namespace: str | None = None) -> Iterator[KeyState]:
        return self.inner.list(namespace)

    def reap(self, namespace: str | None = None) -> int:
        return self.inner.reap(namespace)

    def discard(self, key: Key) -> bool:
        return self.inner.discard(key)

    def prune(self, namespace: str | None, older_than: float) -> int:
        return self.inner.prune(namespace, older_than)

    def read_many(self, keys: Sequence[Key]) -> list[KeyState]:
        return self.inner.read_many(keys)

    def change_feed(self) -> ChangeFeed | None:
        return self.inner.change_feed()

    def close(self) -> None:
        super().close()
        self.inner.close()


class PollingStore(DelegatingStore):
    """The same store without a watch hub: every waiter polls on its own (capped backoff)."""

    def change_feed(self) -> ChangeFeed | None:
        return None


class CountingStore(DelegatingStore):
    """Records the time of every call that reaches the store (``acquire``, ``read``, the hub's
    ``read_many``...), and apart from them its change feed's own looks.

    A feed's looks are one stream per process, whatever the number of waiters: a polling feed's
    ``tokens`` (a versions query, a ``stat`` of each watched record, ETag HEADs or a listing) and its
    ``probe`` (SQLite's ``data_version``, read from shared memory), and among the probes those an
    inotify watch woke (SQLite's ``-wal`` file written, on Linux). Listening feeds (PostgreSQL
    ``LISTEN``, Redis ``PSUBSCRIBE``) send nothing while nothing changes.
    """

    #: Calls that are a request to the store service (a query, a script, an HTTP request, a file read).
    QUERIES = frozenset(
        {
            "read",
            "read_many",
            "acquire",
            "heartbeat",
            "complete",
            "release",
            "force_release",
            "forget",
            "list",
            "reap",
            "discard",
            "prune",
        }
    )

    def __init__(self, inner: Store, *, polling: bool = False) -> None:
        super().__init__(inner)
        self._polling = polling
        self._lock = threading.Lock()
        self.calls: dict[str, list[float]] = collections.defaultdict(list)
        self.feed_keys_looked_at = 0

    def record(self, name: str) -> None:
        with self._lock:
            self.calls[name].append(time.monotonic())

    def query_times(self, start: float, end: float) -> list[float]:
        """When the requests to the store between ``start`` and ``end`` were made, in order."""
        with self._lock:
            return sorted(
                t
                for name, times in self.calls.items()
                if name in self.QUERIES
                for t in times
                if start <= t < end
            )

    def read(self, key: Key) -> KeyState:
        self.record("read")
        return super().read(key)

    def acquire(self, key: Key, request: AcquireRequest) -> StoreOutcome:
        self.record("acquire")
        return super().acquire(key, request)

    def heartbeat(self, key: Key, token: LeaseToken, ttl: float) -> LeaseRecord:
        self.record("heartbeat")
        return super().heartbeat(key, token, ttl)

    def complete(self, key: Key, token: LeaseToken, artifact: NewArtifact) -> ArtifactRecord:
        self.record("complete")
        return super().complete(key, token, artifact)

    def release(self, key: Key, token: LeaseToken, error: str | None = None, *, counted: bool = True) -> None:
        self.record("release")
        super().release(key, token, error, counted=counted)

    def read_many(self, keys: Sequence[Key]) -> list[KeyState]:
        self.record("read_many")
        return super().read_many(keys)

    def change_feed(self) -> ChangeFeed | None:
        feed = None if self._polling else super().change_feed()
        if isinstance(feed, PollingFeed):
            self._count_looks(feed)
        return feed

    def _count_looks(self, feed: PollingFeed) -> None:
        """Count the feed's looks (instance attributes shadow its methods; the feed is this store's own)."""
        tokens = feed.tokens

        def counted_tokens(keys: Iterable[Key]) -> Mapping[str, Hashable]:
            keys = list(keys)
            self.record("feed.tokens")
            with self._lock:
                self.feed_keys_looked_at += len(keys)
            return tokens(keys)

        feed.tokens = counted_tokens  # type: ignore[method-assign]
        if type(feed).probe is not PollingFeed.probe:  # a probe of its own, not just a pause
            probe = feed.probe

            def counted_probe(timeout: float) -> bool:
                before = getattr(feed, "inotify_wakeups", 0)
                changed = probe(timeout)
                self.record("feed.probe")
                if getattr(feed, "inotify_wakeups", 0) != before:  # SQLite's -wal file was written
                    self.record("feed.inotify")
                return changed

            feed.probe = counted_probe  # type: ignore[method-assign]

    def feed_looks(self, start: float, end: float) -> dict[str, int]:
        """How many looks the feed took between ``start`` and ``end``, by kind."""
        with self._lock:
            return {
                name: sum(1 for t in self.calls.get(name, []) if start <= t < end)
                for name in ("feed.tokens", "feed.probe", "feed.inotify")
            }

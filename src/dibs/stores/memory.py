"""An in-process store: the reference implementation of the state machine, with an injectable clock.

It serves tests (a fake clock instead of sleeps) and single-process use. ``memory://NAME`` URLs
name a shared in-process space, so several clients of one process see the same keys. Nothing
survives the process and nothing is shared with other processes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping

from dibs.errors import ConfigurationError
from dibs.keys import Key
from dibs.records import KeyState
from dibs.stores import redact_url
from dibs.stores.base import Listing, RecordStore
from dibs.stores.feeds import ChangeFeed, PollingFeed
from dibs.stores.transitions import empty

__all__ = ["MemoryStore"]


class _Space:
    """The records of one ``memory://NAME``, and a condition that every change notifies."""

    def __init__(self) -> None:
        self.records: dict[str, KeyState] = {}
        self.versions: dict[str, int] = {}
        self.changed = threading.Condition(threading.RLock())
        self.changes = 0


_SPACES: dict[str, _Space] = {}
_SPACES_LOCK = threading.Lock()


class MemoryStore(RecordStore):
    scheme = "memory"
    clock = "this process's clock (or the injected one)"

    def __init__(self, name: str = "", *, clock: Callable[[], float] = time.time) -> None:
        self._name = name
        self._clock = clock
        with _SPACES_LOCK:
            self._space = _SPACES.setdefault(name, _Space()) if name else _Space()
        self._records = self._space.records
        self._lock = self._space.changed

    @classmethod
    def from_url(cls, url: str) -> MemoryStore:
        if not url.startswith("memory://"):
            raise ConfigurationError(
                f"not a memory store URL: {redact_url(url)!r}; expected 'memory://' or 'memory://NAME'"
            )
        return cls(url.removeprefix("memory://"))

    @property
    def url(self) -> str:
        return redact_url(f"memory://{self._name}")

    def _load(self, key: Key) -> tuple[KeyState, object]:
        with self._lock:
            current = self._records.get(key.digest)
            now = self._clock()
            state = empty(key, now) if current is None else _at(current, now)
            return state, current

    def _swap(self, key: Key, version: object, new: KeyState, old: KeyState) -> bool:
        with self._lock:
            if self._records.get(key.digest) is not version:
                return False
            self._records[key.digest] = new
            self._space.versions[key.digest] = self._space.versions.get(key.digest, 0) + 1
            self._space.changes += 1
            self._space.changed.notify_all()
            return True

    def change_feed(self) -> ChangeFeed:
        return _MemoryFeed(self._space)

    def list(self, namespace: str | None = None) -> Listing:
        with self._lock:
            now = self._clock()
            states = [_at(state, now) for state in self._records.values()]
        return Listing(s for s in states if namespace is None or s.key.namespace == namespace)


def _at(state: KeyState, now: float) -> KeyState:
    # Records are immutable snapshots; ``now`` is the only thing that differs between reads.
    return KeyState(state.key, now, state.fence, state.attempts, state.lease, state.artifact, state.failure)


class _MemoryFeed(PollingFeed):
    """Wakes on the space's condition; a record's token is its version (every write counts one up)."""

    min_interval = max_interval = 0.5

    def __init__(self, space: _Space) -> None:
        super().__init__()
        self._space = space
        self._seen = space.changes

    def probe(self, timeout: float) -> bool:
        with self._space.changed:
            self._space.changed.wait_for(lambda: self._space.changes != self._seen, timeout)
            changed = self._space.changes != self._seen
            self._seen = self._space.changes
        return changed

    def tokens(self, keys: Iterable[Key]) -> Mapping[str, Hashable]:
        with self._space.changed:
            return {key.digest: self._space.versions.get(key.digest, 0) for key in keys}

"""Large values kept in the record (no payload store): read in one load a process shares, filled into
one buffer, and a word to whoever stores one.

A record store without a payload store keeps every artifact inside its record: a 200 MB value is a
200 MB column or hash field. Read the way a small record is read, it crossed memory several times (a
PostgreSQL waiter held 9 times the value: libpq's input buffer and result in hex, the unescaped
copy, the bytes object; and a second read when the waiter asked while its watch hub was reading) and
a single call carried it within a bound meant for small answers. A store that can reads such a value
apart from its record, in chunks, each chunk a call of its own bounded for its size, straight into
one buffer of the value's size (:class:`Filling`); threads of the process that need the same value
at the same time share one read (:class:`SharedLoads`), and a read that left a large value out is
made whole, or read again when the record holds another value by now, in one place
(:class:`LargeReads`, :func:`read_settled`); each store brings only its own read of the bytes. And
a ``complete`` of a value this large says once that a payload store would serve it better
(:func:`advise_payload_store`).
"""

from __future__ import annotations

import dataclasses
import io
import logging
import threading
import weakref
from collections.abc import Callable, Hashable
from typing import TypeVar

from dibs.errors import StoreUnavailable
from dibs.keys import Key
from dibs.records import ArtifactRecord, KeyState

__all__ = [
    "CHUNK",
    "LARGE_VALUE",
    "READ_AGAIN",
    "READ_INLINE",
    "Filling",
    "LargeReads",
    "SharedLoads",
    "advise_payload_store",
    "read_settled",
]

log = logging.getLogger("dibs.stores")

T = TypeVar("T")

#: Artifacts up to this size come back in their record's read; a larger one is read apart, in chunks.
READ_INLINE = 1024 * 1024
#: How much of a large value one call reads (memory: about this much beyond the value, per reader).
CHUNK = 8 * 1024 * 1024
#: How many times a read is made again because the record held another artifact by the time its
#: large bytes were read, before the store is called unavailable.
READ_AGAIN = 16
#: Above this size, ``complete`` of an inline value logs once that a payload store should be configured.
LARGE_VALUE = 16 * 1024 * 1024


class Filling:
    """One buffer of a value's final size, filled chunk by chunk, then handed out as ``bytes`` without
    a copy (CPython's ``BytesIO.getvalue`` gives its own buffer when nothing else holds a view of it)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.filled = 0
        self._buffer = io.BytesIO()
        if size:
            self._buffer.seek(size - 1)
            self._buffer.write(b"\0")  # allocated once, at its final size

    def add(self, chunk: bytes | bytearray | memoryview) -> None:
        """Append ``chunk``; :class:`ValueError` past the value's size."""
        view = memoryview(chunk).cast("B")
        end = self.filled + len(view)
        if end > self.size:
            raise ValueError(f"{end:,} bytes read of a value of {self.size:,}")
        with self._buffer.getbuffer() as buffer:
            buffer[self.filled : end] = view
        self.filled = end

    def value(self) -> bytes:
        """The bytes read so far (the whole value once :attr:`filled` is :attr:`size`)."""
        if self.filled != self.size:
            self._buffer.truncate(self.filled)
        return self._buffer.getvalue()


class _Load:
    """One value being read: the threads that want it take turns on ``lock``; the first one reads."""

    __slots__ = ("__weakref__", "lock", "value")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.value: object = None


class SharedLoads:
    """Reads of one large value that overlap in time, done once: a thread that asks for a value another
    thread of the process is reading waits for that read and gets the same object (the watch hub reads
    a finished key for its waiters while one of them asks the store itself: one copy in memory, not
    two). ``identity`` must name the value itself (its record's address, fence and checksum), never a
    state that may have changed. A read that fails is not shared: the next thread reads again."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loads: weakref.WeakValueDictionary[Hashable, _Load] = weakref.WeakValueDictionary()

    def load(self, identity: Hashable, read: Callable[[], T]) -> T:
        with self._lock:
            load = self._loads.get(identity)
            if load is None:
                load = self._loads[identity] = _Load()
        with load.lock:
            if load.value is None:
                load.value = read()
            value: T = load.value  # type: ignore[assignment]
            return value


class LargeReads:
    """A store's large artifacts made whole: a read whose record or row left the bytes out (more than
    :data:`READ_INLINE`) gets them from ``read``, the store's own read of one artifact's bytes, done
    once for every thread of the process that wants them at the same time (the watch hub for its
    waiters, a waiter's own ask). ``read`` returns ``None`` when the record holds another artifact
    by now (other fence or checksum); so do these methods, and the caller reads the key again."""

    def __init__(self, read: Callable[[Key, ArtifactRecord], bytes | None]) -> None:
        self._read = read
        self._loads = SharedLoads()

    def payload(self, key: Key, artifact: ArtifactRecord) -> bytes | None:
        """``artifact``'s bytes, read apart (shared with the threads reading the same artifact)."""
        identity = (key.digest, artifact.fence, artifact.checksum)
        return self._loads.load(identity, lambda: self._read(key, artifact))

    def artifact(self, key: Key, artifact: ArtifactRecord) -> ArtifactRecord | None:
        """``artifact`` with its bytes: itself when its read carried them (or it is small)."""
        if artifact.payload or artifact.size <= READ_INLINE:
            return artifact
        payload = self.payload(key, artifact)
        if payload is None:
            return None
        return dataclasses.replace(artifact, payload=payload)

    def state(self, state: KeyState) -> KeyState | None:
        """``state`` with its artifact's bytes: itself when it has no artifact or its read carried them."""
        artifact = state.artifact
        if artifact is None:
            return state
        whole = self.artifact(state.key, artifact)
        if whole is None:
            return None
        return state if whole is artifact else dataclasses.replace(state, artifact=whole)


def read_settled(key: Key, read: Callable[[], T | None]) -> T:
    """``read()``'s answer, read again while it is ``None`` (the record held another artifact by the
    time its large bytes were read), up to :data:`READ_AGAIN` times; then :class:`StoreUnavailable`
    (the key changes faster than its artifact can be read)."""
    for _ in range(READ_AGAIN):
        answer = read()
        if answer is not None:
            return answer
    raise StoreUnavailable(f"{key} kept changing while reading its artifact", key=str(key))


_advised: set[str] = set()
_advised_lock = threading.Lock()


def advise_payload_store(url: str, size: int) -> None:
    """Say once per store (``url``, redacted) and process that a value of ``size`` bytes, above
    :data:`LARGE_VALUE`, is stored inside its record, where a payload store would keep it apart."""
    if size <= LARGE_VALUE:
        return
    with _advised_lock:
        if url in _advised:
            return
        _advised.add(url)
    log.warning(
        "%s: storing a %s-byte artifact inside its record; every read and write of it carries the whole "
        "value through the database. Configure a payload store for large artifacts (Reservations(..., "
        "payloads='file:///shared/dibs') or DIBS_PAYLOADS_URL; see docs/payloads.md). Said once per store.",
        url,
        f"{size:,}",
    )

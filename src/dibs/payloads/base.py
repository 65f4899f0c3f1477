"""The payload store interface: content-addressed bytes beside the record store.

A payload store keeps the large artifacts out of the coordination path: the record store (SQL, Redis,
a folder, Azure blobs) keeps the lease, the fence and a small *reference*; the bytes live here, named
by their SHA-256. It has no lease logic and no clock of its own that matters: the record store's
fenced ``complete`` decides which payload is published (see :mod:`dibs.payloads.referencing`).

A store does four things:

* **put** a stream under its content address: written to a temporary name while its SHA-256 is
  computed, then moved into place in one step (a rename, an Azure block list commit). Identical
  payloads are stored once: putting bytes that are already there only refreshes their modification
  time, which tells the collector (:mod:`dibs.payloads.collect`) a writer is about to publish them;
* **open** a payload for reading (readers verify size and digest themselves, see :mod:`.verify`);
* **stat** one, to tell cheaply whether it is there whole;
* **delete** one, only if it was not written again since a given time.
"""

from __future__ import annotations

import abc
import dataclasses
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from dibs.errors import ArtifactCorrupted, StoreUnavailable
from dibs.payloads.hashing import Hasher, Ready, digest_beside

__all__ = [
    "CHUNK",
    "Freed",
    "Payload",
    "PayloadDamaged",
    "PayloadStore",
    "PayloadUnavailable",
    "PayloadWriter",
    "StoredPayload",
    "checked_digest",
    "is_digest",
]

#: How much is read or written at once while streaming (memory per stream: about this much).
CHUNK = 1024 * 1024

_DIGEST = re.compile(r"[0-9a-f]{64}")


def is_digest(text: str) -> bool:
    """Whether ``text`` is a SHA-256 as payloads are named by it: 64 lowercase hex digits."""
    return _DIGEST.fullmatch(text) is not None


def checked_digest(sha256: str) -> str:
    """``sha256`` when it is 64 lowercase hex digits, else :class:`ValueError`: a payload's name is
    built from it, so nothing from outside (a path, a separator) ever becomes part of one."""
    if not is_digest(sha256):
        raise ValueError(f"not a SHA-256 in hex: {sha256!r}")
    return sha256


class PayloadUnavailable(ArtifactCorrupted):
    """A referenced payload is missing, truncated or does not match its digest.

    Where dibs can (the ask that would return it as a hit, a waiter's read), this is a *miss*: the key
    computes again and a warning names the payload's URI. It is raised only when the payload went
    bad between that check and the read, or to a caller that opened the payload itself.
    """


class PayloadDamaged(PayloadUnavailable):
    """A payload was read and is not the recorded one: longer than recorded, or of the recorded size
    with another SHA-256.

    Unlike a payload that could not be read (a reset connection, a timeout) or came back short (a
    truncated file, or a stream that ended early: the two look alike), these bytes are known to be
    wrong: they may be removed, so that the next writer puts the right ones.
    """


@dataclasses.dataclass(frozen=True)
class Payload:
    """A payload in a payload store: its SHA-256 (hex), its size, and the serializer that wrote it.

    A work function may *return* one (from :meth:`dibs.Reservations.put_payload`): the lease then
    publishes a reference to these bytes without ever loading them.
    """

    sha256: str
    size: int
    serializer: str = "bytes"

    @property
    def checksum(self) -> str:
        """The digest as dibs records it (``sha256:<hex>``)."""
        return "sha256:" + self.sha256


@dataclasses.dataclass(frozen=True)
class StoredPayload:
    """A payload as listed: its digest, size, and modification time (Unix seconds, the storage's clock)."""

    sha256: str
    size: int
    modified: float


@dataclasses.dataclass(frozen=True)
class Freed:
    """What a collection removed: payloads and bytes."""

    payloads: int = 0
    bytes: int = 0

    def __add__(self, other: Freed) -> Freed:
        return Freed(self.payloads + other.payloads, self.bytes + other.bytes)


class PayloadWriter(abc.ABC):
    """One payload being written: :meth:`write` chunks, then :meth:`commit` (or leave the ``with``
    block by an exception, which discards what was written). Its SHA-256 is computed chunk by chunk
    as it is written, each chunk hashed in a helper thread while this one writes it
    (:mod:`.hashing`: the two passes cost about the longer of the two), and :meth:`commit` names the
    payload by it. A chunk is the caller's again once :meth:`write` returns."""

    def __init__(self) -> None:
        self._hasher = Hasher()
        self._known: str | Callable[[], str] | None = None
        self.size = 0
        self._done = False

    def vouch(self, sha256: str | Callable[[], str]) -> None:
        """The digest of what will be written, computed by the caller from the same bytes: not computed
        again (one SHA-256 pass less on the hand-off's writing side). A callable is asked for it at
        :meth:`commit`, once the bytes are written and flushed (a hash still running beside them)."""
        self._known = sha256

    def write(self, chunk: bytes | bytearray | memoryview) -> int:
        view = memoryview(chunk).cast("B")
        if self._known is None:
            self._hasher.update(view)  # hashed in a helper thread while it is written
        self.size += len(view)
        try:
            self._write(view)
        except OSError as exc:
            raise _unwritable(exc) from exc
        finally:
            self._hasher.wait()
        return len(view)

    def commit(self, serializer: str = "bytes") -> Payload:
        """Move the bytes into place under their digest; a payload with these bytes may already be there."""
        self._done = True
        try:
            self._flush()
            payload = Payload(self._digest(), self.size, serializer)
            self._commit(payload.sha256)
        except OSError as exc:
            raise _unwritable(exc) from exc
        return payload

    def _digest(self) -> str:
        if self._known is None:
            return self._hasher.hexdigest()
        return self._known if isinstance(self._known, str) else self._known()

    def _flush(self) -> None:  # noqa: B027 (most writers make their bytes durable in _commit)
        """Make the written bytes durable before they are named (a vouched digest may still be
        computing meanwhile); on failure, release what the writer holds open."""

    def abort(self) -> None:
        if not self._done:
            self._done = True
            self._abort()

    @abc.abstractmethod
    def _write(self, view: memoryview) -> None: ...

    @abc.abstractmethod
    def _commit(self, sha256: str) -> None: ...

    @abc.abstractmethod
    def _abort(self) -> None: ...

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.abort()


def _unwritable(exc: OSError) -> StoreUnavailable:
    """A payload store's I/O error (a full disk, a permission, a network file system gone) as the store
    failure it is: the hold's rules for a store that fails at ``complete`` then apply (the lease is
    released, the caller keeps its value under ``on_store_unavailable="run"``), not a crash that
    leaves the key held until its ttl runs out."""
    return StoreUnavailable(
        f"writing a payload failed ({type(exc).__name__}: {exc}); check the payload store's free space, "
        "permissions and reachability"
    )


class PayloadStore(abc.ABC):
    """Content-addressed payloads (see the module docstring)."""

    @property
    @abc.abstractmethod
    def url(self) -> str:
        """The store's URL with any secret removed: safe to log and to record in references."""

    @abc.abstractmethod
    def writer(self) -> PayloadWriter:
        """A new payload being written (a temporary name until :meth:`PayloadWriter.commit`)."""

    @abc.abstractmethod
    def open(self, sha256: str) -> IO[bytes]:
        """The payload's bytes as a binary stream; :class:`PayloadUnavailable` if it is not there."""

    @abc.abstractmethod
    def stat(self, sha256: str) -> StoredPayload | None:
        """The payload's size and modification time, ``None`` if it is not there."""

    @abc.abstractmethod
    def delete(self, sha256: str, *, unchanged_since: float) -> int:
        """Remove the payload unless it was written (or put again) at or after ``unchanged_since``;
        returns the bytes freed (0 if it was kept or was not there)."""

    @abc.abstractmethod
    def list(self) -> Iterator[StoredPayload]:
        """Every payload (in no particular order)."""

    def discard_partial(self, *, unchanged_since: float) -> Freed:
        """Remove what writers that died left behind (temporary files) untouched since then."""
        return Freed()

    def local_path(self, sha256: str) -> Path | None:
        """The payload as a local file, where the store is a folder (``None`` elsewhere)."""
        return None

    def uri(self, sha256: str) -> str:
        """Where the payload is, for people (warnings, ``dibs show``)."""
        return f"{self.url.rstrip('/')}/{sha256}"

    def put(
        self, data: bytes | bytearray | memoryview, serializer: str = "bytes", *, sha256: str | None = None
    ) -> Payload:
        """``data`` as a payload (written in chunks: no copy of it is made), its SHA-256 computed in a
        helper thread while it is written and flushed; ``sha256``, when the caller has just computed it
        from ``data``, is used instead."""
        view = memoryview(data).cast("B")
        digest = digest_beside(view) if sha256 is None else Ready(sha256)
        try:
            with self._writer() as writer:
                writer.vouch(digest.result)
                for start in range(0, len(view), CHUNK):
                    writer.write(view[start : start + CHUNK])
                return writer.commit(serializer)
        finally:
            digest.result()  # no thread reads the caller's bytes once this returns (or raises)

    def put_stream(self, source: IO[bytes], serializer: str = "bytes") -> Payload:
        """What ``source`` reads to its end, as a payload (at most :data:`CHUNK` in memory)."""
        with self._writer() as writer:
            while chunk := source.read(CHUNK):
                writer.write(chunk)
            return writer.commit(serializer)

    def _writer(self) -> PayloadWriter:
        try:
            return self.writer()
        except OSError as exc:
            raise _unwritable(exc) from exc

    def settle(self) -> None:  # noqa: B027 (most stores leave nothing behind)
        """Clean up after writers once their payload is published (or the hand-off failed): called by
        :class:`~dibs.payloads.ReferencingStore` after each complete, and by the next writer. A folder
        removes the copies of payloads that were there already, in a helper thread."""

    def close(self) -> None:  # noqa: B027 (most stores hold nothing to close)
        """Release clients and connections."""

"""The payload store interface: content-addressed bytes beside the record store.

A payload store keeps the large artifacts out of the coordination path: the record store (SQL, Redis,
a folder, Azure blobs) keeps the lease, the fence and a small *reference*; the bytes live here, named
by their SHA-256. It has no lease logic and no clock of its own that matters: the record store's
fenced ``complete`` decides which payload is published (see :mod:`dibs.payloads.referencing`).

A payload may be stored as several **copies** (a folder keeps one file per writer, hard links of one
another; Azure keeps one blob). A store does five things:

* **put** a stream under its content address: written to a temporary name while its SHA-256 is
  computed, then moved into place in one step (a rename, an Azure block list commit);
* **open** a payload for reading: only ever a regular file or object, never something that blocks
  (a FIFO) or leads elsewhere (a symlink); readers verify size and digest themselves (:mod:`.verify`);
* **stat** one, to tell cheaply whether it is there whole;
* **list** the copies (all of them, or one payload's), and **remove** one copy.

What makes collection safe (:mod:`dibs.payloads.collect`) is the store's half of the bargain: **a put
never gives back a copy that a remove decided before it may take**. Either the put makes a copy of its
own, which no earlier listing holds (the folder and fsspec stores: a new name for every put, never
reused), or it changes the copy it finds so that a remove decided before refuses it (Azure: the blob's
ETag changes, and the delete is conditional on the one listed). Whatever the interleaving of a writer
and a (paused) collector, the copy a writer's put returned for is there when its reference is
published. :class:`dibs.testing.payloads.PayloadStoreContract` checks it, for dibs's stores and
anyone's.
"""

from __future__ import annotations

import abc
import builtins
import dataclasses
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from dibs.errors import ArtifactCorrupted, SerializationError, StoreUnavailable
from dibs.payloads.hashing import DIGESTS, Hasher, Ready, digest_beside

__all__ = [
    "CHUNK",
    "Freed",
    "Payload",
    "PayloadDamaged",
    "PayloadStore",
    "PayloadUnavailable",
    "PayloadUnwritable",
    "PayloadWriter",
    "StoredPayload",
    "address",
    "checked_address",
    "checked_digest",
    "is_address",
    "is_digest",
    "named_otherwise",
    "split_address",
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


# -- content addresses -------------------------------------------------------------------------------
# A payload is named by its *address*: its SHA-256 in hex (64 digits, as every payload was named
# before BLAKE3, so old references and layouts stay as they are), or ``blake3:<64 hex digits>``. The
# address is what :attr:`Payload.sha256` and :attr:`StoredPayload.sha256` hold (the field keeps its
# name: code written for SHA-256 payloads goes on working), and what every store method takes.


def address(digest: str, hexdigest: str) -> str:
    """The address of a payload whose ``digest`` (``"sha256"``, ``"blake3"``) is ``hexdigest``."""
    return hexdigest if digest == "sha256" else f"{digest}:{hexdigest}"


def split_address(found: str) -> tuple[str, str]:
    """``(digest function, hex digest)`` of an address (see :func:`checked_address`)."""
    digest, colon, hexdigest = checked_address(found).rpartition(":")
    return (digest if colon else "sha256"), hexdigest


def is_address(text: str) -> bool:
    """Whether ``text`` is a payload's address: a SHA-256 in hex, or ``<digest>:<64 hex digits>`` for
    another digest function dibs knows (``blake3``)."""
    digest, colon, hexdigest = text.rpartition(":")
    if not colon:
        return is_digest(text)
    return digest in DIGESTS[1:] and is_digest(hexdigest)


def named_otherwise(found: str) -> bool:
    """Whether ``found`` is the address of a payload named by another digest function than SHA-256:
    a store that names payloads by SHA-256 only (Azure, fsspec) has no such payload, and says it is
    missing (a reference written through a folder store told ``?digest=blake3``, read through
    another store, is a miss that computes again)."""
    return isinstance(found, str) and is_address(found) and not is_digest(found)


def checked_address(found: str) -> str:
    """``found`` when it is a payload's address (:func:`is_address`), else :class:`ValueError`."""
    if not isinstance(found, str) or not is_address(found):
        raise ValueError(f"not a SHA-256 in hex (nor blake3:<64 hex digits>): {found!r}")
    return found


class PayloadUnavailable(ArtifactCorrupted):
    """A referenced payload is missing, truncated or does not match its digest.

    Where dibs can (the ask that would return it as a hit, a waiter's read), this is a *miss*: the key
    computes again and a warning names the payload's URI. It is raised only when the payload went
    bad between that check and the read, or to a caller that opened the payload itself.
    """


class PayloadDamaged(PayloadUnavailable):
    """A payload was read and is not the recorded one: stored shorter or longer than recorded, or of
    the recorded size with another SHA-256.

    Unlike a payload that could not be read (a reset connection, a timeout) or whose stream ended
    early (a size the storage never said), these bytes are known to be wrong: the reader removes the
    copy it read (:meth:`PayloadStore.condemn`), so that the next writer puts the right ones.
    """


class PayloadUnwritable(SerializationError, StoreUnavailable):
    """A payload could not be written to the payload store (a full disk, a permission, a file where a
    folder must be, an unreachable service): the value cannot be stored as its artifact.

    A :class:`~dibs.errors.SerializationError`, as :class:`~dibs.errors.ArtifactTooLarge` is: the
    hold releases the lease at once with this failure recorded, and the work's value is returned to
    its caller only (:mod:`dibs.holding`), instead of leaving the key held until its ttl runs out. A
    :class:`~dibs.errors.StoreUnavailable` too, which is what it is to a caller that writes payloads
    itself (``put_payload``), and what the CLI's exit status says.
    """


@dataclasses.dataclass(frozen=True)
class Payload:
    """A payload in a payload store: its address (``sha256``: the SHA-256 in hex, or
    ``blake3:<hex>`` for a store that names payloads by BLAKE3), its size, and the serializer that
    wrote it.

    A work function may *return* one (from :meth:`dibs.Reservations.put_payload`): the lease then
    publishes a reference to these bytes without ever loading them.
    """

    sha256: str
    size: int
    serializer: str = "bytes"

    @property
    def digest(self) -> str:
        """The digest function the payload is named by: ``"sha256"`` or ``"blake3"``."""
        return self.sha256.partition(":")[0] if named_otherwise(self.sha256) else "sha256"

    @property
    def checksum(self) -> str:
        """The digest as dibs records it, naming its function: ``sha256:<hex>``, ``blake3:<hex>``
        (anything that is no ``blake3:`` address is taken for a SHA-256, as before BLAKE3)."""
        return self.sha256 if named_otherwise(self.sha256) else "sha256:" + self.sha256


@dataclasses.dataclass(frozen=True)
class StoredPayload:
    """A copy of a payload as listed: its address (``sha256``, see :class:`Payload`), size, and when
    it was last written, linked or put again (Unix seconds, the storage's clock).

    ``copy`` tells it from the payload's other copies, in the store's own terms (a file's name, a
    blob's ETag): what :meth:`PayloadStore.remove` takes. Copies of one payload sort by it in about
    the order they were made.
    """

    sha256: str
    size: int
    modified: float
    copy: str = ""


@dataclasses.dataclass(frozen=True)
class Freed:
    """What a collection removed: payloads (whose bytes went), bytes, and copies (names: a folder's
    copies of one payload are hard links, so removing one frees bytes only with the last)."""

    payloads: int = 0
    bytes: int = 0
    copies: int = 0

    def __add__(self, other: Freed) -> Freed:
        return Freed(self.payloads + other.payloads, self.bytes + other.bytes, self.copies + other.copies)


class PayloadWriter(abc.ABC):
    """One payload being written: :meth:`write` chunks, then :meth:`commit` (or leave the ``with``
    block by an exception, which discards what was written). Its digest (``digest``: SHA-256 unless
    the store is told otherwise) is computed chunk by chunk as it is written, each chunk hashed in a
    helper thread while this one writes it (:mod:`.hashing`: the two passes cost about the longer of
    the two), and :meth:`commit` names the payload by it. A chunk is the caller's again once
    :meth:`write` returns."""

    def __init__(self, where: str = "the payload store", digest: str = "sha256") -> None:
        self._hasher = Hasher(digest)
        self._digest_function = digest
        self._known: str | Callable[[], str] | None = None
        self.size = 0
        self._done = False
        self._where = where  # the store's URL (redacted), for errors

    def vouch(self, sha256: str | Callable[[], str]) -> None:
        """The address of what will be written (a SHA-256 in hex, or ``blake3:<hex>``), computed by
        the caller from the same bytes: not computed again (one pass less on the hand-off's writing
        side). A callable is asked for it at :meth:`commit`, once the bytes are written and flushed
        (a hash still running beside them)."""
        self._known = sha256

    def write(self, chunk: bytes | bytearray | memoryview) -> int:
        view = memoryview(chunk).cast("B")
        if self._known is None:
            self._hasher.update(view)  # hashed in a helper thread while it is written
        self.size += len(view)
        try:
            self._write(view)
        except OSError as exc:
            raise unwritable(self._where, exc) from exc
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
            raise unwritable(self._where, exc) from exc
        return payload

    def _digest(self) -> str:
        if self._known is None:
            return address(self._digest_function, self._hasher.hexdigest())
        return checked_address(self._known if isinstance(self._known, str) else self._known())

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


def unwritable(where: str, exc: BaseException, why: str | None = None) -> PayloadUnwritable:
    """A payload store's error while writing (a full disk, a permission, a network file system gone) as
    the failed compute it is (:class:`PayloadUnwritable`), naming the store ``where`` (redacted) and
    what went wrong (``why``; by default the error's type and message)."""
    return PayloadUnwritable(
        f"writing a payload to {where} failed ({why or f'{type(exc).__name__}: {exc}'}); check the "
        "payload store's free space, permissions and reachability",
        remedy="the payload store takes writes again",
    )


def unavailable(where: str, doing: str, exc: BaseException, why: str | None = None) -> StoreUnavailable:
    """A payload store's error while reading, listing or removing, as a dibs error naming the store."""
    return StoreUnavailable(f"{doing} in {where} failed ({why or f'{type(exc).__name__}: {exc}'})")


class PayloadStore(abc.ABC):
    """Content-addressed payloads, in one or more copies each (see the module docstring).

    ``digest`` is the digest function new payloads are named by (``"sha256"``, or ``"blake3"`` for a
    store that supports it and was told so); every store reads payloads named by any of them.

    Every method raises only dibs errors: :class:`PayloadUnavailable` for a payload that is not
    there (or not readable as one), :class:`PayloadUnwritable` for a write that failed,
    :class:`~dibs.errors.StoreUnavailable` for a store that cannot be reached or refused to list or
    remove. Nothing a store does may block on what it finds at a payload's name.
    """

    #: The digest function new payloads are named by (:data:`~dibs.payloads.hashing.DIGESTS`).
    digest: str = "sha256"

    @property
    @abc.abstractmethod
    def url(self) -> str:
        """The store's URL with any secret removed: safe to log and to record in references."""

    @abc.abstractmethod
    def writer(self) -> PayloadWriter:
        """A new payload being written (a temporary name until :meth:`PayloadWriter.commit`). Its
        commit must keep the bargain of the module docstring: a copy of its own, or the copy it finds
        changed so that a remove decided before refuses it."""

    @abc.abstractmethod
    def open(self, sha256: str) -> IO[bytes]:
        """A copy of the payload (the latest made, where there are several) as a binary stream;
        :class:`PayloadUnavailable` if there is none. Only a regular file or object is a copy: a
        FIFO, a directory, a device or a symlink at a payload's name is as good as nothing there
        (and is never opened in a way that could block)."""

    @abc.abstractmethod
    def copies(self, sha256: str) -> builtins.list[StoredPayload]:
        """Every copy of the payload, in :attr:`StoredPayload.copy` order (none: an empty list)."""

    @abc.abstractmethod
    def remove(self, found: StoredPayload) -> Freed:
        """Remove the copy ``found`` (from :meth:`copies` or :meth:`list`), unless it was changed since
        it was listed; returns what went: the copy, and the payload's bytes if it was their last copy
        (nothing if it was kept or was not there any more)."""

    @abc.abstractmethod
    def list(self) -> Iterator[StoredPayload]:
        """Every copy of every payload (in no particular order)."""

    def stat(self, sha256: str) -> StoredPayload | None:
        """The copy :meth:`open` would read (size, time), ``None`` if there is none."""
        found = self.copies(sha256)
        return found[-1] if found else None

    def delete(self, sha256: str, *, unchanged_since: float) -> int:
        """Remove every copy of the payload not written (or put again) at or after ``unchanged_since``;
        returns the bytes freed."""
        going = [found for found in self.copies(sha256) if found.modified < unchanged_since]
        return sum(self.remove(found).bytes for found in going)

    def condemn(self, sha256: str, stream: IO[bytes]) -> int:
        """Remove the copy ``stream`` (from :meth:`open`) was read from, found not to hold the payload
        (:class:`PayloadDamaged`), and every other copy sharing its bytes; returns how many went.
        Only those: a copy a writer made since is left. A store that cannot tell removes nothing."""
        return 0

    def discard_partial(self, *, unchanged_since: float) -> Freed:
        """Remove what writers that died left behind (temporary files), and anything at a payload's
        name that is no payload (a FIFO, a directory), untouched since then."""
        return Freed()

    def spool(self) -> IO[bytes]:
        """A private temporary file (gone once closed) to hold a copy being verified before its first
        byte is handed out (:func:`dibs.payloads.verify.spool_verified`)."""
        return tempfile.TemporaryFile(prefix="dibs-verified-")

    def local_path(self, sha256: str) -> Path | None:
        """The payload as a local file, where the store is a folder (``None`` elsewhere)."""
        return None

    def uri(self, sha256: str) -> str:
        """Where the payload is, for people (warnings, ``dibs show``)."""
        return f"{self.url.rstrip('/')}/{sha256}"

    def put(
        self, data: bytes | bytearray | memoryview, serializer: str = "bytes", *, sha256: str | None = None
    ) -> Payload:
        """``data`` as a payload (written in chunks: no copy of it is made), its digest (the store's
        :attr:`digest`) computed in a helper thread while it is written and flushed; ``sha256``, the
        address of ``data`` when the caller has just computed it, is used instead."""
        view = memoryview(data).cast("B")
        if sha256 is None:
            hexdigest = digest_beside(view, self.digest)
            digest: Callable[[], str] = lambda: address(self.digest, hexdigest.result())  # noqa: E731
        else:
            digest = Ready(sha256).result
        try:
            with self._writer() as writer:
                writer.vouch(digest)
                for start in range(0, len(view), CHUNK):
                    writer.write(view[start : start + CHUNK])
                return writer.commit(serializer)
        finally:
            digest()  # no thread reads the caller's bytes once this returns (or raises)

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
            raise unwritable(self.url, exc) from exc

    def settle(self) -> None:  # noqa: B027 (most stores leave nothing behind)
        """Clean up after writers once their payload is published (or the hand-off failed): called by
        :class:`~dibs.payloads.ReferencingStore` after each complete, and by the next writer. A folder
        removes the writers' files that a hard link to a copy made redundant, in a helper thread."""

    def close(self) -> None:  # noqa: B027 (most stores hold nothing to close)
        """Release clients and connections."""

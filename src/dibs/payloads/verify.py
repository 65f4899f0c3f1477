"""Reading a payload back, checked: its size and digest (SHA-256, or BLAKE3 for a payload named by
it) must be the reference's, or nothing is served.

**No byte leaves dibs before the whole payload was checked.** Three ways, all of them so:

* :func:`read_verified` loads it whole (one copy in memory: the bytes object a ``bytes`` artifact's
  value *is*), handed out once all of it matched;
* :func:`spool_verified` copies it into a private temporary file while checking it, a chunk or two
  in memory at a time, and hands out that file once all of it matched: what a stream of a large
  payload is read from (``open_artifact``, ``dibs wait``, ``dibs run``), so no caller ever reads a
  byte that is later refused, and a copy changed or removed meanwhile changes nothing it reads;
* :func:`copy_verified` writes it to a file of the caller's, which must throw it away on an error.

A copy found damaged (stored at another size, or at its size with another digest) is removed as it is
found (:meth:`~dibs.payloads.PayloadStore.condemn`), so that the key's next writer makes a good one;
a copy that merely could not be read is left, and read once more before giving up.
"""

from __future__ import annotations

import io
import logging
import os
import stat
from collections.abc import Callable, Iterator
from typing import IO, TypeVar

from dibs.errors import ReservationError
from dibs.payloads.base import (
    CHUNK,
    Payload,
    PayloadDamaged,
    PayloadStore,
    PayloadUnavailable,
    address,
    split_address,
)
from dibs.payloads.hashing import Hasher

__all__ = ["check_stream", "copy_out", "copy_verified", "read_verified", "spool_verified"]

log = logging.getLogger("dibs.payloads")

T = TypeVar("T")

#: How much is read at once when a whole payload is read (two such chunks in hand: one being hashed
#: while the next is read); fewer hand-overs to the hashing thread than :data:`CHUNK`.
READ_CHUNK = 4 * CHUNK


def _mismatch(
    uri: str, payload: Payload, size: int, sha256: str | None, *, found: str = "read"
) -> PayloadUnavailable:
    if size < payload.size:
        if found == "stored":  # the storage says so: these bytes are known to be wrong
            return PayloadDamaged(
                f"payload {uri} is truncated: {size:,} bytes stored, {payload.size:,} recorded"
            )
        # A stream that ended early: the bytes are not known bad (a connection may have dropped).
        return PayloadUnavailable(
            f"payload {uri} is truncated: {size:,} bytes read, {payload.size:,} recorded"
        )
    if size > payload.size:
        return PayloadDamaged(
            f"payload {uri} is longer than recorded: {size:,} bytes {found}, {payload.size:,} recorded"
        )
    digest, recorded = split_address(payload.sha256)
    got = sha256.rpartition(":")[2] if sha256 is not None else None
    name = "SHA-256" if digest == "sha256" else digest.upper()
    return PayloadDamaged(f"payload {uri} does not match its recorded {name} ({got} != {recorded})")


def _checked_read(store: PayloadStore, payload: Payload, read: Callable[[IO[bytes]], T]) -> T:
    """``read(stream)`` of a copy of the payload, which raises :class:`PayloadUnavailable` unless the
    bytes are the recorded ones. A damaged copy is removed (:meth:`PayloadStore.condemn`) before the
    error goes on; one that could not be read is tried once more (another copy may be there: an
    object store's copy removed under a long read, as its newer twin is kept)."""
    for attempt in (1, 2):
        with store.open(payload.sha256) as stream:
            try:
                return read(stream)
            except PayloadDamaged:
                _condemn(store, payload, stream)
                raise
            except PayloadUnavailable:
                if attempt == 2:
                    raise
    raise AssertionError("unreachable")  # pragma: no cover


def _condemn(store: PayloadStore, payload: Payload, stream: IO[bytes]) -> None:
    try:
        store.condemn(payload.sha256, stream)
    except ReservationError as exc:  # the damage is what the caller hears of; this is a footnote
        log.warning("could not remove the damaged payload %s: %s", payload.sha256, exc)


def _chunks_checked(stream: IO[bytes], payload: Payload, uri: str) -> Iterator[bytes]:
    """The payload's bytes in chunks, each hashed in a helper thread while the caller uses it and the
    next one is read (:mod:`.hashing`): one pass over the bytes. Ends by raising
    :class:`PayloadUnavailable` naming ``uri`` unless they had the recorded size and digest, so the
    caller must keep everything it was given to itself until the iteration ends."""
    stored = _stored_size(stream)
    if stored is not None and stored != payload.size:
        raise _mismatch(uri, payload, stored, None, found="stored")
    hasher, read = Hasher(payload.digest), 0
    try:
        # Never past the recorded size + 1: one byte more tells a longer payload, and the error then
        # says how far it was read, not that plus the rest of a chunk.
        while chunk := stream.read(min(READ_CHUNK, payload.size - read + 1)):
            hasher.update(chunk)  # a bytes object of its own: it cannot change while it is hashed
            read += len(chunk)
            if read > payload.size:
                break
            yield chunk
    except OSError as exc:
        raise PayloadUnavailable(f"payload {uri} cannot be read: {exc}") from exc
    finally:
        hasher.wait()  # nothing is left hashing once this ends, however it ends
    if read != payload.size:
        raise _mismatch(uri, payload, read, None)
    digest = address(payload.digest, hasher.hexdigest())
    if digest != payload.sha256:
        raise _mismatch(uri, payload, read, digest)


def read_verified(store: PayloadStore, payload: Payload, uri: str) -> bytes:
    """The payload's bytes, checked; :class:`PayloadUnavailable` naming ``uri`` otherwise.

    One pass, one copy in memory: the bytes are read straight into the value's own buffer, each chunk
    hashed in a helper thread while the next is read (:mod:`.hashing`), and the value is handed out
    only once all of it matched. That buffer is allocated at the recorded size only once the stream
    has said it holds as much (a file's size, an fsspec file's or a blob download's): a truncated
    payload is found short without it. A stream that does not say is read chunk by chunk into a
    buffer that grows with what arrives (one copy more per chunk; memory in step with what was read).
    """
    return _checked_read(store, payload, lambda stream: _read_stream(stream, payload, uri))


def _read_stream(stream: IO[bytes], payload: Payload, uri: str) -> bytes:
    stored = _stored_size(stream)
    if stored is None:
        grown = io.BytesIO()
        for chunk in _chunks_checked(stream, payload, uri):
            grown.write(chunk)
        return grown.getvalue()  # the buffer itself, trimmed (no exports are left): not a copy
    if stored != payload.size:
        raise _mismatch(uri, payload, stored, None, found="stored")
    return _read_whole(stream, payload, uri)


def _stored_size(stream: IO[bytes]) -> int | None:
    """How many bytes ``stream`` holds, where it says so without another request: a regular file's
    ``fstat``, the ``size`` of an fsspec file or of a blob download; ``None`` otherwise."""
    try:
        found = os.fstat(stream.fileno())
    except (OSError, AttributeError, ValueError):  # io.UnsupportedOperation is both of the last two
        pass
    else:
        if stat.S_ISREG(found.st_mode):
            return found.st_size
    size = getattr(stream, "size", None)
    return size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None


def _read_whole(stream: IO[bytes], payload: Payload, uri: str) -> bytes:
    """:func:`read_verified` of a stream that holds the recorded size."""
    value = io.BytesIO()
    if payload.size:
        value.seek(payload.size - 1)
        value.write(b"\0")  # the buffer at its final size, allocated once
    hasher, read = Hasher(payload.digest), 0
    try:
        with value.getbuffer() as buffer:
            read = _read_into(stream, buffer, hasher)
        extra = stream.read(1)  # one byte more tells a longer payload
    except OSError as exc:
        raise PayloadUnavailable(f"payload {uri} cannot be read: {exc}") from exc
    finally:
        hasher.wait()  # nothing is left reading the buffer, however this ends
    if read != payload.size or extra:
        raise _mismatch(uri, payload, read + len(extra), None)
    digest = address(payload.digest, hasher.hexdigest())
    if digest != payload.sha256:
        raise _mismatch(uri, payload, read, digest)
    # CPython hands over the buffer itself (no exports are left), not a copy of it.
    return value.getvalue()


def _read_into(stream: IO[bytes], buffer: memoryview, hasher: Hasher) -> int:
    """Fill ``buffer`` from ``stream`` (fewer bytes only at its end), handing each chunk to ``hasher``
    as it arrives; the number of bytes read."""
    readinto = getattr(stream, "readinto", None)
    read = 0
    while read < len(buffer):
        window = buffer[read : read + READ_CHUNK]
        if readinto is not None:
            n = readinto(window)
        else:
            chunk = stream.read(len(window))
            n = len(chunk)
            window[:n] = chunk
        if not n:
            break
        read += n
        # This part of the buffer is not written again; the last one is hashed here and now.
        hasher.update(window[:n], last=read == len(buffer))
    return read


def check_stream(stream: IO[bytes], payload: Payload, uri: str) -> None:
    """Read ``stream`` (a copy of the payload) to its end, a chunk or two in memory:
    :class:`PayloadUnavailable` naming ``uri`` unless it holds the recorded size and digest."""
    for _ in _chunks_checked(stream, payload, uri):
        pass


def copy_verified(store: PayloadStore, payload: Payload, uri: str, out: IO[bytes]) -> int:
    """Write the payload to ``out`` in chunks, checked; returns its size. If the check fails at the
    end, what was written is not the payload: the caller must throw it away (the error says so) and
    must not have handed any of it on."""

    def copy(stream: IO[bytes]) -> int:
        out.seek(0)
        out.truncate()  # a second attempt starts over
        for chunk in _chunks_checked(stream, payload, uri):
            out.write(chunk)
        out.flush()
        return payload.size

    return _checked_read(store, payload, copy)


def spool_verified(store: PayloadStore, payload: Payload, uri: str) -> IO[bytes]:
    """The payload in a private temporary file (the store's :meth:`~PayloadStore.spool`, gone once
    closed), checked to its end before it is handed out, positioned at its start; memory: a chunk or
    two. :class:`PayloadUnavailable` naming ``uri`` otherwise, with nothing handed out."""
    spooled = store.spool()
    try:
        copy_verified(store, payload, uri, spooled)
        spooled.seek(0)
    except BaseException:
        spooled.close()
        raise
    return spooled


def copy_out(spooled: IO[bytes], out: IO[bytes]) -> int:
    """Write a spooled payload (from :func:`spool_verified`) to ``out`` from its start, in chunks; the
    bytes written. Reads by position (``pread``), so threads may share one spool."""
    fd, offset = spooled.fileno(), 0
    while chunk := os.pread(fd, CHUNK, offset):
        out.write(chunk)
        offset += len(chunk)
    return offset

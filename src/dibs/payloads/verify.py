"""Reading a payload back, checked: its size and SHA-256 must be the reference's, or nothing is served.

Two ways: :func:`read_verified` loads it whole (one copy in memory: the bytes object a ``bytes``
artifact's value *is*), and :class:`VerifyingReader` streams it, raising at the end if what it read
was not the payload the reference names (a stream cannot take back what it has handed out, so its
reader must treat the data as unconfirmed until EOF).
"""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Iterator
from typing import IO

from dibs.payloads.base import CHUNK, Payload, PayloadDamaged, PayloadStore, PayloadUnavailable
from dibs.payloads.hashing import Hasher

__all__ = ["VerifyingReader", "copy_verified", "read_verified"]

#: How much is read at once when a whole payload is read (two such chunks in hand: one being hashed
#: while the next is read); fewer hand-overs to the hashing thread than :data:`CHUNK`.
READ_CHUNK = 4 * CHUNK


def _mismatch(
    uri: str, payload: Payload, size: int, sha256: str | None, *, found: str = "read"
) -> PayloadUnavailable:
    if size < payload.size:  # a truncated file, or a stream that ended early: the bytes are not known bad
        return PayloadUnavailable(
            f"payload {uri} is truncated: {size:,} bytes {found}, {payload.size:,} recorded"
        )
    if size > payload.size:
        return PayloadDamaged(
            f"payload {uri} is longer than recorded: {size:,} bytes read, {payload.size:,} recorded"
        )
    return PayloadDamaged(f"payload {uri} does not match its recorded SHA-256 ({sha256} != {payload.sha256})")


def _checked_chunks(store: PayloadStore, payload: Payload, uri: str) -> Iterator[bytes]:
    """The payload's bytes in chunks, each hashed in a helper thread while the caller uses it and the
    next one is read (:mod:`.hashing`): one pass over the bytes. Ends by raising
    :class:`PayloadUnavailable` naming ``uri`` unless they had the recorded size and digest, so the
    caller treats everything it was given as unconfirmed until the iteration ends."""
    with store.open(payload.sha256) as stream:
        yield from _chunks_checked(stream, payload, uri)


def _chunks_checked(stream: IO[bytes], payload: Payload, uri: str) -> Iterator[bytes]:
    """:func:`_checked_chunks` of a stream already open."""
    hasher, read = Hasher(), 0
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
    digest = hasher.hexdigest()
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
    with store.open(payload.sha256) as stream:
        stored = _stored_size(stream)
        if stored is None:
            grown = io.BytesIO()
            for chunk in _chunks_checked(stream, payload, uri):
                grown.write(chunk)
            return grown.getvalue()  # the buffer itself, trimmed (no exports are left): not a copy
        if stored < payload.size:
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
    """:func:`read_verified` of a stream that holds at least the recorded size."""
    value = io.BytesIO()
    if payload.size:
        value.seek(payload.size - 1)
        value.write(b"\0")  # the buffer at its final size, allocated once
    hasher, read = Hasher(), 0
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
    digest = hasher.hexdigest()
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


class VerifyingReader(io.RawIOBase):
    """A payload's stream that checks size and digest as it is read: reading past the recorded size,
    or reaching the end with other bytes than recorded, raises :class:`PayloadUnavailable`. Each
    chunk is hashed in a helper thread while the caller goes on (:mod:`.hashing`)."""

    def __init__(self, stream: IO[bytes], payload: Payload, uri: str) -> None:
        self._stream, self._payload, self._uri = stream, payload, uri
        self._hasher = Hasher()
        self._read = 0
        self._checked = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        view = memoryview(buffer).cast("B")
        try:  # never past the recorded size + 1 (see _chunks_checked)
            chunk = self._stream.read(max(0, min(len(view), self._payload.size - self._read + 1)))
        except OSError as exc:
            raise PayloadUnavailable(f"payload {self._uri} cannot be read: {exc}") from exc
        if not chunk:
            self._check()
            return 0
        n = len(chunk)
        view[:n] = chunk
        self._hasher.update(chunk)  # this reader's own bytes object, not the caller's buffer
        self._read += n
        if self._read > self._payload.size:
            raise _mismatch(self._uri, self._payload, self._read, None)
        return n

    def _check(self) -> None:
        if self._checked:
            return
        self._checked = True
        digest = self._hasher.hexdigest()
        if self._read != self._payload.size or digest != self._payload.sha256:
            raise _mismatch(self._uri, self._payload, self._read, digest)

    def close(self) -> None:
        try:
            self._hasher.wait()
        finally:
            try:
                self._stream.close()  # even if the hashing failed: never leak the payload's handle
            finally:
                super().close()


def copy_verified(store: PayloadStore, payload: Payload, uri: str, out: IO[bytes]) -> int:
    """Write the payload to ``out`` in chunks, checked; returns its size. If the check fails at the
    end, what was written is not the payload: the caller must throw it away (and the error says so)."""
    for chunk in _checked_chunks(store, payload, uri):
        out.write(chunk)
    return payload.size


def check_whole(store: PayloadStore, payload: Payload, uri: str) -> None:
    """Read the payload to its end and check it, a chunk or two at a time in memory:
    :class:`PayloadUnavailable` naming ``uri`` unless it has the recorded size and digest."""
    for _ in _checked_chunks(store, payload, uri):
        pass

"""Reading a payload back, checked: its size and SHA-256 must be the reference's, or nothing is served.

Two ways: :func:`read_verified` loads it whole (one copy in memory: the bytes object a ``bytes``
artifact's value *is*), and :class:`VerifyingReader` streams it, raising at the end if what it read
was not the payload the reference names (a stream cannot take back what it has handed out, so its
reader must treat the data as unconfirmed until EOF).
"""

from __future__ import annotations

import hashlib
import io
from typing import IO

from dibs.payloads.base import CHUNK, Payload, PayloadDamaged, PayloadStore, PayloadUnavailable

__all__ = ["VerifyingReader", "copy_verified", "read_verified"]


def _mismatch(uri: str, payload: Payload, size: int, sha256: str | None) -> PayloadDamaged:
    if size != payload.size:
        return PayloadDamaged(
            f"payload {uri} is {'truncated' if size < payload.size else 'longer than recorded'}: "
            f"{size:,} bytes read, {payload.size:,} recorded"
        )
    return PayloadDamaged(f"payload {uri} does not match its recorded SHA-256 ({sha256} != {payload.sha256})")


def read_verified(store: PayloadStore, payload: Payload, uri: str) -> bytes:
    """The payload's bytes, checked; :class:`PayloadUnavailable` naming ``uri`` otherwise."""
    with store.open(payload.sha256) as stream:
        try:
            data = stream.read(payload.size + 1)  # one allocation; one byte more tells a longer file
        except OSError as exc:
            raise PayloadUnavailable(f"payload {uri} cannot be read: {exc}") from exc
    if len(data) != payload.size:
        raise _mismatch(uri, payload, len(data), None)
    digest = hashlib.sha256(data).hexdigest()
    if digest != payload.sha256:
        raise _mismatch(uri, payload, len(data), digest)
    return data


class VerifyingReader(io.RawIOBase):
    """A payload's stream that checks size and digest as it is read: reading past the recorded size,
    or reaching the end with other bytes than recorded, raises :class:`PayloadUnavailable`."""

    def __init__(self, stream: IO[bytes], payload: Payload, uri: str) -> None:
        self._stream, self._payload, self._uri = stream, payload, uri
        self._hash = hashlib.sha256()
        self._read = 0
        self._checked = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        view = memoryview(buffer).cast("B")
        try:
            chunk = self._stream.read(len(view))
        except OSError as exc:
            raise PayloadUnavailable(f"payload {self._uri} cannot be read: {exc}") from exc
        if not chunk:
            self._check()
            return 0
        n = len(chunk)
        view[:n] = chunk
        self._hash.update(chunk)
        self._read += n
        if self._read > self._payload.size:
            raise _mismatch(self._uri, self._payload, self._read, None)
        return n

    def _check(self) -> None:
        if self._checked:
            return
        self._checked = True
        digest = self._hash.hexdigest()
        if self._read != self._payload.size or digest != self._payload.sha256:
            raise _mismatch(self._uri, self._payload, self._read, digest)

    def close(self) -> None:
        try:
            self._stream.close()
        finally:
            super().close()


def copy_verified(store: PayloadStore, payload: Payload, uri: str, out: IO[bytes]) -> int:
    """Write the payload to ``out`` in chunks, checked; returns its size. If the check fails at the
    end, what was written is not the payload: the caller must throw it away (and the error says so)."""
    with store.open(payload.sha256) as raw, VerifyingReader(raw, payload, uri) as reader:
        while chunk := reader.read(CHUNK):
            out.write(chunk)
    return payload.size


def check_whole(store: PayloadStore, payload: Payload, uri: str) -> None:
    """Read the payload to its end and check it, one chunk at a time in memory:
    :class:`PayloadUnavailable` naming ``uri`` unless it has the recorded size and digest."""
    with store.open(payload.sha256) as raw, VerifyingReader(raw, payload, uri) as reader:
        while reader.read(CHUNK):
            pass

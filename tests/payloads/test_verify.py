"""Reading payloads back checked (dibs.payloads.verify): a payload shorter than recorded is found short
without holding its recorded size in memory, whether or not its stream says how long it is; a longer
one is reported with exactly the bytes read (or, where the storage says its size, with that), by
every reader. A copy the storage says is of another size, or that holds other bytes, is damaged, and
removed as it is found; a stream that merely ended early is not."""

from __future__ import annotations

import hashlib
import io
import os
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO

import pytest

from dibs.payloads import Payload, PayloadDamaged, PayloadUnavailable
from dibs.payloads.files import FilePayloadStore
from dibs.payloads.verify import (
    READ_CHUNK,
    check_stream,
    copy_out,
    copy_verified,
    read_verified,
    spool_verified,
)

MB = 1024 * 1024


class _Unsized:
    """A payload's stream that says nothing of its size (no file number, no ``size``): only ``read``."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream

    def read(self, size: int = -1) -> bytes:
        return self._stream.read(size)

    def close(self) -> None:
        self._stream.close()

    def __enter__(self) -> _Unsized:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()


class _UnsizedStore(FilePayloadStore):
    def open(self, sha256: str) -> IO[bytes]:
        return _Unsized(super().open(sha256))  # type: ignore[return-value]


STORES: dict[str, Callable[[Path], FilePayloadStore]] = {
    "sized": FilePayloadStore,  # a file: its size is known before anything is read
    "unsized": _UnsizedStore,  # a stream that ends early: known only once it ended
}


@pytest.mark.parametrize("kind", STORES)
def test_a_truncated_payload_is_found_short_without_allocating_its_recorded_size(
    tmp_path: Path, kind: str
) -> None:
    store = STORES[kind](tmp_path)
    held = os.urandom(2 * MB)
    payload = store.put(held)
    recorded = Payload(payload.sha256, 256 * MB)  # what a record says of a payload truncated since
    tracemalloc.start()
    try:
        with pytest.raises(PayloadUnavailable, match="is truncated") as caught:
            read_verified(store, recorded, "test")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    if kind == "sized":  # the file says it is short: known damage, and the copy is removed
        assert isinstance(caught.value, PayloadDamaged) and f"{2 * MB:,} bytes stored" in str(caught.value)
        assert store.copies(payload.sha256) == []
    else:  # a stream that ended early is not known damage: a miss, and the copy stays
        assert not isinstance(caught.value, PayloadDamaged) and f"{2 * MB:,} bytes read" in str(caught.value)
        assert len(store.copies(payload.sha256)) == 1
    assert peak < 32 * MB, f"{peak:,} bytes allocated to find {2 * MB:,} of {256 * MB:,} short"


@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize("size", [0, 1, 5 * MB + 3])
def test_a_whole_payload_reads_back_through_either_kind_of_stream(
    tmp_path: Path, kind: str, size: int
) -> None:
    store = STORES[kind](tmp_path)
    data = os.urandom(size)
    payload = store.put(data)
    assert read_verified(store, payload, "test") == data
    out = io.BytesIO()
    assert copy_verified(store, payload, "test", out) == size and out.getvalue() == data
    with spool_verified(store, payload, "test") as spooled:
        printed = io.BytesIO()
        assert copy_out(spooled, printed) == size and printed.getvalue() == data
    _check_stream(store, payload, "test")
    assert hashlib.sha256(data).hexdigest() == payload.sha256


def _check_stream(store: FilePayloadStore, payload: Payload, uri: str) -> None:
    with store.open(payload.sha256) as stream:
        check_stream(stream, payload, uri)


def _spool(store: FilePayloadStore, payload: Payload, uri: str) -> None:
    spool_verified(store, payload, uri).close()


READERS: dict[str, Callable[[FilePayloadStore, Payload, str], object]] = {
    "read_verified": read_verified,
    "copy_verified": lambda store, payload, uri: copy_verified(store, payload, uri, io.BytesIO()),
    "spool_verified": _spool,
    "check_stream": _check_stream,
}


@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize("reader", READERS)
def test_a_payload_longer_than_recorded_is_damaged_and_the_bytes_read_are_said_exactly(
    tmp_path: Path, kind: str, reader: str
) -> None:
    """Reading stops one byte past the recorded size, and the error says so: not that plus whatever
    was left of the chunk being read (up to 4 MB)."""
    store = STORES[kind](tmp_path)
    payload = store.put(os.urandom(2 * MB))
    recorded = Payload(payload.sha256, MB - 10)
    with pytest.raises(PayloadDamaged, match="longer than recorded") as caught:
        READERS[reader](store, recorded, "test")
    if kind == "sized":  # the file says how long it is: nothing needs reading
        assert f": {2 * MB:,} bytes stored, {MB - 10:,} recorded" in str(caught.value)
    else:
        assert f": {MB - 9:,} bytes read, {MB - 10:,} recorded" in str(caught.value)


SPANS = {"one chunk": MB, "chunks, the last one full": 2 * READ_CHUNK, "chunks": 2 * READ_CHUNK + 5}


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("span", SPANS)
@pytest.mark.parametrize("where", ["first byte", "last byte"])
def test_a_payload_changed_in_place_is_damaged_whichever_chunk_holds_the_change(
    tmp_path: Path, reader: str, span: str, where: str
) -> None:
    """Every chunk is hashed, whether in a helper thread or (the last one) in the reader's own."""
    store = FilePayloadStore(tmp_path)
    data = bytearray(os.urandom(SPANS[span]))
    payload = store.put(data)
    data[0 if where == "first byte" else -1] ^= 1
    store.path(payload.sha256).write_bytes(data)
    with pytest.raises(PayloadDamaged, match="does not match its recorded SHA-256"):
        READERS[reader](store, payload, "test")


@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("span", SPANS)
def test_a_payload_stored_short_is_damaged_and_a_stream_cut_short_only_unavailable(
    tmp_path: Path, kind: str, reader: str, span: str
) -> None:
    store = STORES[kind](tmp_path)
    data = os.urandom(SPANS[span])
    payload = store.put(data)
    store.path(payload.sha256).write_bytes(data[:-1])
    with pytest.raises(PayloadUnavailable, match="truncated") as caught:
        READERS[reader](store, payload, "test")
    assert isinstance(caught.value, PayloadDamaged) == (kind == "sized")
    # Only known damage goes, and only a reader of the store's (check_stream is given a stream).
    removed = kind == "sized" and reader != "check_stream"
    assert len(store.copies(payload.sha256)) == (0 if removed else 1)

"""Hashing beside the I/O (dibs.payloads.hashing): the digests are the ones hashlib computes, whatever
the chunking, a writer's caller may reuse its buffer as soon as ``write`` returns, and a forked child
still hashes (the parent's helper threads do not exist there); a last chunk, with nothing to overlap
with, is hashed without a hand-over."""

from __future__ import annotations

import hashlib
import io
import multiprocessing
import os
from multiprocessing.connection import Connection
from pathlib import Path

import pytest

from dibs.payloads import hashing
from dibs.payloads.files import FilePayloadStore
from dibs.payloads.hashing import INLINE, Hasher, digest_beside
from dibs.payloads.verify import READ_CHUNK, check_stream, copy_verified, read_verified, spool_verified

SIZES = [0, 1, INLINE, INLINE + 1, 3 * 1024 * 1024 + 17, 9 * 1024 * 1024]


@pytest.mark.parametrize("size", SIZES)
def test_a_hasher_fed_in_chunks_gives_hashlib_s_digest(size: int) -> None:
    data = os.urandom(size)
    hasher = Hasher()
    for start in range(0, size, 700_001):  # chunks above INLINE (a helper thread) and one below, last
        hasher.update(data[start : start + 700_001])
    assert hasher.hexdigest() == hashlib.sha256(data).hexdigest()
    assert digest_beside(memoryview(data)).result() == hashlib.sha256(data).hexdigest()


def test_a_writer_s_caller_may_reuse_its_buffer_once_write_returns(tmp_path: Path) -> None:
    store = FilePayloadStore(tmp_path)
    chunks = [os.urandom(1024 * 1024) for _ in range(5)]
    buffer = bytearray(1024 * 1024)
    with store.writer() as writer:
        for chunk in chunks:
            buffer[:] = chunk  # the same buffer, overwritten after each write
            writer.write(buffer)
        payload = writer.commit()
    whole = b"".join(chunks)
    assert payload.sha256 == hashlib.sha256(whole).hexdigest()
    assert read_verified(store, payload, "test") == whole


@pytest.mark.parametrize("size", SIZES)
def test_what_is_put_reads_back_whole_by_every_reader(tmp_path: Path, size: int) -> None:
    store = FilePayloadStore(tmp_path)
    data = os.urandom(size)
    payload = store.put(bytearray(data))
    assert (payload.sha256, payload.size) == (hashlib.sha256(data).hexdigest(), size)
    assert store.put_stream(io.BytesIO(data)) == payload
    assert read_verified(store, payload, "test") == data
    out = io.BytesIO()
    assert copy_verified(store, payload, "test", out) == size and out.getvalue() == data
    with spool_verified(store, payload, "test") as spooled:
        assert spooled.read() == data
    with store.open(payload.sha256) as stream:
        check_stream(stream, payload, "test")


def _hash_in_child(data: bytes, conn: Connection) -> None:
    hasher = Hasher()
    hasher.update(data)
    conn.send(hasher.hexdigest())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_forked_child_hashes_with_helper_threads_of_its_own() -> None:
    data = os.urandom(4 * INLINE)
    assert digest_beside(memoryview(data)).result() == hashlib.sha256(data).hexdigest()  # parent's pool up
    fork = multiprocessing.get_context("fork")
    parent_end, child_end = fork.Pipe()
    child = fork.Process(target=_hash_in_child, args=(data, child_end))
    child.start()
    try:
        assert parent_end.poll(60), "the child never finished hashing (a pool inherited from the parent?)"
        assert parent_end.recv() == hashlib.sha256(data).hexdigest()
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()


def _no_hand_over(*args: object) -> None:
    raise AssertionError("a chunk was handed to a helper thread")


@pytest.mark.parametrize("size", [INLINE + 1, 1024 * 1024])
def test_a_last_chunk_is_hashed_in_the_caller_s_thread(monkeypatch: pytest.MonkeyPatch, size: int) -> None:
    data = os.urandom(size)
    monkeypatch.setattr(hashing._pool, "submit", _no_hand_over)
    hasher = Hasher()
    hasher.update(data, last=True)  # nothing follows it to overlap with: no hand-over
    assert hasher.hexdigest() == hashlib.sha256(data).hexdigest()


def test_a_payload_read_in_one_chunk_is_hashed_without_a_hand_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FilePayloadStore(tmp_path)
    data = os.urandom(READ_CHUNK)  # exactly one chunk: its last
    payload = store.put(data)
    monkeypatch.setattr(hashing._pool, "submit", _no_hand_over)
    assert read_verified(store, payload, "test") == data

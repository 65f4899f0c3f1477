"""Payloads on fsspec file systems: its in-memory one (an object store's semantics: no rename, no
hard link) and its local one through a URL; the same round trip, miss, dedup and collection."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import fsspec
import pytest

import dibs
from dibs.payloads import REFERENCE, ReferencingStore
from dibs.payloads.fsspec import FsspecPayloadStore

BIG = 200_000


@pytest.fixture(params=["memory", "local"])
def payloads(request: pytest.FixtureRequest, tmp_path: Path) -> FsspecPayloadStore | str:
    if request.param == "memory":
        root = f"/dibs-test-{uuid.uuid4().hex[:8]}"
        return FsspecPayloadStore(fsspec.filesystem("memory"), root, f"memory://{root}")
    return f"local://{tmp_path / 'payloads'}"


def test_round_trip_dedup_miss_and_collection(payloads: FsspecPayloadStore | str, tmp_path: Path) -> None:
    big, other = os.urandom(BIG), os.urandom(BIG)
    records = f"sqlite:///{tmp_path / 'dibs.db'}"
    with dibs.Reservations(records, payloads=payloads, serializer="bytes", payload_grace=0) as client:
        store = client.store
        assert isinstance(store, ReferencingStore) and isinstance(store.payloads, FsspecPayloadStore)
        assert client.run("a", lambda: big) == big
        assert client.run("b", lambda: big) == big
        raw = store.records.read(client.key("a")).artifact
        assert raw is not None and raw.serializer == REFERENCE
        # Identical: one payload, in a copy per writer (a hard link where the file system has them;
        # elsewhere a copy, which the collection removes once the latest one is old enough).
        copies = list(store.payloads.list())
        assert [p.size for p in copies] == [BIG, BIG] and len({p.sha256 for p in copies}) == 1
        if isinstance(payloads, str):  # local: stored once
            folder = Path(store.payloads._folder(copies[0].sha256))
            assert len({(folder / p.copy).stat().st_ino for p in copies}) == 1
        store.collect()
        assert [p.copy for p in store.payloads.list()] == [max(p.copy for p in copies)]  # the latest kept
        assert client.run("a", lambda: b"never") == big

        source = tmp_path / "file.bin"
        source.write_bytes(other)
        client.run("file", lambda: client.put_payload(source))
        with client.open_artifact("file") as stream:
            assert stream.read() == other
        (found,) = [p for p in store.payloads.list() if p.size == BIG and p.sha256 != raw.checksum[7:]]
        path = f"{store.payloads._folder(found.sha256)}/{found.copy}"
        store.payloads.fs.pipe(path, other[:10])  # truncated behind dibs' back
        assert client.compute("file", lambda: b"again" * 50_000).role == "computed"

        # The truncated copy was found damaged (the storage says its size) and removed as it was read.
        assert 10 not in [p.size for p in store.payloads.list()]
        for key in ("a", "b", "file"):
            client.forget(key)
        assert list(store.payloads.list()) == []

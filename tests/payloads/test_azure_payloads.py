"""The Azure payload store against Azurite: the same round trip, miss and collection as the folder's."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import dibs
from dibs.payloads import REFERENCE, Payload, PayloadUnavailable, ReferencingStore
from dibs.payloads.azure import AzurePayloadStore
from dibs.payloads.verify import read_verified
from tests import azurite
from tests.backends import azure as azure_backend

BIG = 300_000


@pytest.fixture
def azure_url() -> Iterator[str]:
    connection_string = azure_backend.emulator_connection_string()
    container = azure_backend.fresh_container()
    try:
        yield azure_backend.url_for(connection_string, container, "dibs/test")
    finally:
        azure_backend.delete_container(connection_string, container)


def test_payloads_on_azure_round_trip_miss_and_collect(azure_url: str, tmp_path: Path) -> None:
    records = f"sqlite:///{tmp_path / 'dibs.db'}"
    big, other = os.urandom(BIG), os.urandom(BIG)
    with dibs.Reservations(records, payloads=azure_url, serializer="bytes", payload_grace=0) as client:
        store = client.store
        assert isinstance(store, ReferencingStore) and isinstance(store.payloads, AzurePayloadStore)
        assert azurite.DEV_KEY not in store.payloads.url  # the URL recorded and logged has no secret
        assert client.run("a", lambda: big) == big
        assert client.run("b", lambda: big) == big  # identical: stored once
        raw = store.records.read(client.key("a")).artifact
        assert raw is not None and raw.serializer == REFERENCE
        assert [p.size for p in store.payloads.list()] == [BIG]
        assert client.run("a", lambda: b"never") == big  # a hit, read back and checked

        source = tmp_path / "file.bin"
        source.write_bytes(other)
        assert client.compute("file", lambda: client.put_payload(source)).role == "computed"
        with client.open_artifact("file") as stream:
            assert stream.read() == other
        with client.artifact_path("file") as path:
            assert path.read_bytes() == other

        # A payload deleted behind dibs' back is a miss: the key computes again.
        sha = store.payloads.stat(hashlib.sha256(other).hexdigest())
        assert sha is not None
        store.payloads.delete(sha.sha256, unchanged_since=float("inf"))
        assert client.compute("file", lambda: b"again" * 20_000).role == "computed"

        client.forget("a")
        assert len(list(store.payloads.list())) == 2  # b still refers to it
        client.forget("b")
        client.forget("file")
        assert list(store.payloads.list()) == []


def test_a_streamed_payload_creates_the_container_and_arrives_whole(azure_url: str) -> None:
    # The fixture's container does not exist yet: the first upload finds it missing, creates it and
    # sends the spooled stream again from its start (dibs.stores.azure.blobs.with_container).
    data = os.urandom(BIG)
    store = AzurePayloadStore.from_url(azure_url)
    try:
        with store.writer() as writer:
            for start in range(0, BIG, 65_536):
                writer.write(data[start : start + 65_536])
            payload = writer.commit()
        assert payload.sha256 == hashlib.sha256(data).hexdigest()
        with store.open(payload.sha256) as stream:
            assert stream.size == BIG  # type: ignore[attr-defined]  # read_verified's size check uses it
            assert stream.read() == data
        # A record saying more than the blob holds is found short from that size, before any reading.
        with pytest.raises(PayloadUnavailable, match=f"truncated: {BIG:,} bytes stored"):
            read_verified(store, Payload(payload.sha256, 100 * BIG), "test")
    finally:
        store.close()

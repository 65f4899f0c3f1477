"""What ``Lease.complete`` takes: a compute time that a record can keep, and any bytes-like payload."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

import dibs
from dibs.errors import ConfigurationError


class ArraySerializer:
    """A user's serializer that returns a bytearray, as ``Serializer.dumps`` callers may."""

    name = "array"

    def dumps(self, value: Any) -> bytes:
        return bytearray(value.encode())  # type: ignore[return-value]

    def loads(self, payload: bytes) -> Any:
        return bytes(payload).decode()


@pytest.fixture
def client(tmp_path: Path) -> dibs.Reservations:
    return dibs.Reservations(f"sqlite:///{tmp_path / 'dibs.db'}", namespace="unit", ttl=30)


def _lease(client: dibs.Reservations) -> dibs.Lease:
    got = client.get_or_reserve("k", owner="alice")
    assert isinstance(got, dibs.Acquired)
    return got.lease


@pytest.mark.parametrize("seconds", [math.inf, math.nan, -1.0])
def test_a_compute_time_no_record_can_keep_is_refused_and_the_lease_stays(
    client: dibs.Reservations, seconds: float
) -> None:
    lease = _lease(client)
    with pytest.raises(ConfigurationError, match=rf"compute_seconds must be .*got {seconds!r}"):
        lease.complete("value", compute_seconds=seconds)
    # Nothing was written: the lease is still held, the key readable, and a corrected call stores.
    assert client.status("k").status == "held"
    assert lease.complete("value", compute_seconds=2.5).compute_seconds == 2.5
    assert client.status("k").artifact is not None


def test_a_bytearray_payload_is_stored_and_returned_as_the_bytes_a_read_gives(tmp_path: Path) -> None:
    client = dibs.Reservations(
        f"sqlite:///{tmp_path / 'dibs.db'}", namespace="unit", serializer=ArraySerializer()
    )
    stored = _lease(client).complete("value")
    read = client.status("k").artifact
    assert read is not None
    assert type(stored.payload) is bytes and stored.payload == read.payload == b"value"
    assert stored.size == read.size == 5

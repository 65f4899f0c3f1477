"""The DibsStore block's ``payloads_url``: large results apart from the store's records."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("prefect")

from pydantic import ValidationError

from dibs.payloads import REFERENCE, ReferencingStore
from prefect_dibs import DibsStore
from prefect_dibs._clients import resolve_client


def test_a_block_with_payloads_url_keeps_large_results_in_the_payload_store(tmp_path: Path) -> None:
    payloads = (tmp_path / "payloads").as_uri()
    block = DibsStore(url=f"sqlite:///{tmp_path / 'b.db'}", payloads_url=payloads, serializer="bytes")
    big = os.urandom(100_000)
    with block.get_client() as client:
        assert isinstance(client.store, ReferencingStore) and client.store.payloads.url == payloads
        assert client.run("big", lambda: big) == big
        raw = client.store.records.read(client.key("big")).artifact
        assert raw is not None and raw.serializer == REFERENCE
    shared = resolve_client(block)  # what @reserved and the lock manager use
    assert isinstance(shared.store, ReferencingStore) and shared.run("big", lambda: b"never") == big


def test_a_payloads_url_with_a_secret_or_without_a_scheme_is_refused() -> None:
    with pytest.raises(ValidationError, match="contains a secret") as caught:
        DibsStore(payloads_url="azure://c/p?connection_string=AccountKey%3Dhunter2")
    assert "hunter2" not in str(caught.value)
    with pytest.raises(ValidationError, match="not a payload store URL"):
        DibsStore(payloads_url="shared/dibs")

"""The embedded SQLite default keeps large artifacts in the folder ``payloads`` beside its database file,
unless ``payloads=`` or ``DIBS_PAYLOADS_URL`` names a payload store (issue 30)."""

from __future__ import annotations

from pathlib import Path

import pytest

import dibs
from dibs.payloads import ReferencingStore
from dibs.payloads.files import FilePayloadStore
from tests.payloads.conftest import stored_payloads

BIG = b"\x01" * 100_000  # over the 64 KiB inline limit


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DIBS_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DIBS_STORE_URL", raising=False)
    monkeypatch.delenv("DIBS_PAYLOADS_URL", raising=False)
    return tmp_path / "home"


def _folder(client: dibs.Reservations) -> Path:
    store = client.store
    assert isinstance(store, ReferencingStore)
    assert isinstance(store.payloads, FilePayloadStore)
    return store.payloads.root


def test_the_default_store_keeps_a_large_value_beside_its_database(home: Path) -> None:
    with dibs.Reservations(serializer="bytes") as client:
        assert _folder(client) == home / "payloads"
        assert client.run("big", lambda: BIG) == BIG
        record = client.store.records.read(client.key("big")).artifact
        assert record is not None and len(record.payload) < 1024  # the record holds a reference
    assert len(stored_payloads(home)) == 1  # home/payloads/sha256/...
    # Named by its URL, the same database keeps the same folder: every process that shares it agrees.
    with dibs.Reservations(f"sqlite:///{home / 'dibs.db'}", serializer="bytes") as client:
        assert _folder(client) == home / "payloads"
        assert client.run("big", lambda: b"never") == BIG


def test_a_payload_store_named_wins_and_other_stores_keep_values_in_their_records(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with dibs.Reservations(payloads=(tmp_path / "given").as_uri()) as client:
        assert _folder(client) == tmp_path / "given"
    monkeypatch.setenv("DIBS_PAYLOADS_URL", (tmp_path / "env").as_uri())
    with dibs.Reservations() as client:
        assert _folder(client) == tmp_path / "env"
    monkeypatch.delenv("DIBS_PAYLOADS_URL")
    with dibs.Reservations(f"sqlite:///{tmp_path / 'other.db'}") as client:
        assert not isinstance(client.store, ReferencingStore)

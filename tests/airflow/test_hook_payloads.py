"""The ``dibs`` connection's ``payloads_url``: large results apart from the store's records."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("airflow")

from airflow.sdk import Connection

from dibs import ConfigurationError
from dibs.payloads import REFERENCE, ReferencingStore
from dibs_provider.hooks.dibs import settings_from_connection


def _conn(extra: dict[str, object]) -> Connection:
    return Connection(conn_id="dibs_test", conn_type="dibs", extra=json.dumps(extra))


def test_a_connection_with_payloads_url_keeps_large_results_in_the_payload_store(tmp_path: Path) -> None:
    payloads = (tmp_path / "payloads").as_uri()
    settings = settings_from_connection(
        _conn({"store_url": f"sqlite:///{tmp_path}/d.db", "payloads_url": payloads})
    )
    big = os.urandom(100_000).hex()
    with settings.client() as client:
        assert isinstance(client.store, ReferencingStore) and client.store.payloads.url == payloads
        assert client.run("big", lambda: big) == big
        raw = client.store.records.read(client.key("big")).artifact
        assert raw is not None and raw.serializer == REFERENCE


def test_without_payloads_url_results_stay_in_the_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DIBS_PAYLOADS_URL", raising=False)
    settings = settings_from_connection(
        _conn({"store_url": f"sqlite:///{tmp_path}/d.db", "payloads_url": ""})
    )
    with settings.client() as client:
        assert not isinstance(client.store, ReferencingStore)


def test_a_bad_payloads_url_names_the_field() -> None:
    with pytest.raises(ConfigurationError, match=r"extra 'payloads_url'.*file:///shared/dibs"):
        settings_from_connection(_conn({"store_url": "sqlite:////x.db", "payloads_url": "shared/dibs"}))

"""Fixtures of the payload tests: an isolated record store (SQLite and PostgreSQL) and a payload folder."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(params=["sqlite", "postgres"])
def records_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An isolated record store URL (the payloads sit beside records of either kind alike)."""
    module = importlib.import_module(f"tests.backends.{request.param}")
    with module.isolated_url(tmp_path) as url:
        yield url


@pytest.fixture
def payloads_url(tmp_path: Path) -> str:
    return (tmp_path / "payloads").as_uri()


def payload_files(tmp_path: Path) -> list[Path]:
    """The payloads in the folder of :func:`payloads_url` (not the partial ones)."""
    return sorted(p for p in (tmp_path / "payloads" / "sha256").rglob("*") if p.is_file())

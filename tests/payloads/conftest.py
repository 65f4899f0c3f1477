"""Fixtures of the payload tests: an isolated record store (SQLite and PostgreSQL) and a payload folder."""

from __future__ import annotations

import importlib
import os
import time
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
    """The payloads' copies in the folder of :func:`payloads_url` (not the partial ones): one file per
    writer, hard links of each other where the payload was there already."""
    return sorted(p for p in (tmp_path / "payloads" / "sha256").rglob("*") if p.is_file())


def stored_payloads(tmp_path: Path) -> list[Path]:
    """One copy of each payload stored (files that are hard links of each other count once)."""
    seen: dict[int, Path] = {}
    for path in payload_files(tmp_path):
        seen.setdefault(path.stat().st_ino, path)
    return sorted(seen.values())


def age(path: Path, seconds: float) -> Path:
    """Make the copy ``path`` look ``seconds`` old to a collection, as it would be that much later: its
    modification time, and the time in its stamp (``<sha256>.<stamp>``, see dibs.payloads.files)."""
    then = time.time() - seconds
    os.utime(path, (then, then))
    digest, dot, stamp = path.name.partition(".")
    if not dot:
        return path
    older = path.with_name(f"{digest}.{int(then * 1e9):016x}{stamp[16:]}")
    path.rename(older)
    return older

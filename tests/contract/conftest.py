"""The contract suite's stores: every backend (``tests/conftest.py``), and the Redis topologies."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.backends import CONTRACT_BACKENDS
from tests.conftest import _isolated


@pytest.fixture(params=CONTRACT_BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An isolated URL on every store the contract runs on (the shared fixture, and the topologies)."""
    yield from _isolated(request.param, tmp_path)

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dibs.stores import Store, open_store
from dibs.testing.contract import opened_stores
from tests.backends import BACKENDS, PROCESS_BACKENDS
from tests.postgres_servers import ThrowawayPostgres, throwaway_postgres


def _isolated(name: str, tmp_path: Path) -> Iterator[str]:
    try:
        module = importlib.import_module(f"tests.backends.{name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"tests.backends.{name}":
            pytest.skip(f"no test backend module for the {name!r} store yet")
        raise
    with module.isolated_url(tmp_path) as url:
        yield url


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An isolated URL on every store (the contract suite runs once per store)."""
    yield from _isolated(request.param, tmp_path)


@pytest.fixture(params=PROCESS_BACKENDS)
def process_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An isolated URL on every store that several OS processes can share."""
    yield from _isolated(request.param, tmp_path)


@pytest.fixture
def open_isolated_store(store_url: str) -> Iterator[Callable[[], Store]]:
    """Opens stores on one isolated space; all are closed after the test."""
    with opened_stores(lambda: open_store(store_url)) as opener:
        yield opener


@pytest.fixture
def store(open_isolated_store: Callable[[], Store]) -> Store:
    return open_isolated_store()


@pytest.fixture(scope="module")
def restartable_postgres() -> Iterator[ThrowawayPostgres]:
    """A PostgreSQL server of the test module's own (tests/postgres_servers.py), which a test may stop,
    start and restart with N seconds down (``restartable_postgres.outage(5.0)`` in the background,
    ``.restart(5.0)`` in the test's thread): the shared server is never stopped. A test that leaves it
    stopped should start it again for the next one (``if not server.running: server.start()``)."""
    with throwaway_postgres() as server:
        yield server

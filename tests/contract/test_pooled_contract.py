"""The store contract (:mod:`dibs.testing.contract`) on PostgreSQL through PgBouncer, in transaction
and in session mode, with stock settings (issue 29: every call failed there, or a prepared statement
met another client's session). A file of its own, so that it runs beside the contract suite of the
other stores (each test file is one xdist worker's), and records only: a payload store beside the
records changes nothing between dibs and the pooler.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.backends.pgbouncer import POOLED_BACKENDS

from dibs.stores import Store, open_store
from dibs.testing.contract import StoreContract, opened_stores


class TestPooledStoreContract(StoreContract):
    @pytest.fixture(params=POOLED_BACKENDS)
    def open_isolated_store(
        self, request: pytest.FixtureRequest, tmp_path: Path
    ) -> Iterator[Callable[[], Store]]:
        backend = importlib.import_module(f"tests.backends.{request.param}")
        with backend.isolated_url(tmp_path) as url, opened_stores(lambda: open_store(url)) as opener:
            yield opener

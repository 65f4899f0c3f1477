"""The store contract (:mod:`dibs.testing.contract`, the suite dibs ships) on every store of
``tests/backends``: the ``store_url`` fixture (``tests/conftest.py``) is parametrized over them, so
a new store joins by adding its backend module.

Every store runs it twice: as it is, and with a payload store beside it. With a payload store
(:class:`dibs.payloads.ReferencingStore`, inline limit 0), every non-empty artifact the tests store
goes to a folder of payloads and the record keeps only a reference: the same tests then check that a
record store and its payload store together still keep the contract.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dibs.payloads import ReferencingStore
from dibs.payloads.files import FilePayloadStore
from dibs.stores import Store, open_store
from dibs.testing.contract import StoreContract, opened_stores


class TestStoreContract(StoreContract):
    @pytest.fixture(params=["records", "payloads"])
    def open_isolated_store(
        self, request: pytest.FixtureRequest, store_url: str, tmp_path: Path
    ) -> Iterator[Callable[[], Store]]:
        """Opens stores on one isolated space (and one payload folder); all are closed after the test."""
        payloads = FilePayloadStore(tmp_path / "payloads")
        with opened_stores(lambda: open_store(store_url)) as open_records:
            if request.param == "records":
                yield open_records
            else:
                yield lambda: ReferencingStore(open_records(), payloads, inline_limit=0, grace=0.0)

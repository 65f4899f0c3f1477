"""The SQL store's compare-and-swap writes the lease columns :func:`lease_columns` names.

``SQLStore._swap`` writes a granted lease's columns out by hand rather than through
``lease_columns`` (it runs for every lease granted: issue 20). A column added to one and not the
other would be written as NULL, or not at all, without any other test noticing: this one compares
the values each sends, for a first lease (an insert) and a takeover (a swap of an existing row), on
SQLite. PostgreSQL's first lease goes through ``_read_or_insert_first`` instead, not covered here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dibs.keys import Key
from dibs.records import Granted
from dibs.stores import AcquireRequest, open_store
from dibs.stores.sql.schema import lease_columns
from dibs.stores.sql.store import SQLStore
from tests.cli_harness import eventually


class _Recording:
    """Stands in for a prepared statement: records the values, then runs the real one."""

    def __init__(self, real: Any, sent: list[dict[str, Any]]) -> None:
        self._real, self._sent = real, sent
        self.columns = real.columns

    def execute(self, cursor: Any, values: dict[str, Any]) -> int:
        self._sent.append(dict(values))
        return int(self._real.execute(cursor, values))


def test_swap_writes_every_lease_column_with_its_value(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'dibs.db'}")
    assert isinstance(store, SQLStore)
    sent: list[dict[str, Any]] = []
    key = Key("swap", "k")
    try:
        store.read(key)  # the schema is checked and the statements prepared
        store._insert_new = _Recording(store._insert_new, sent)  # type: ignore[assignment]
        store._swap_row = _Recording(store._swap_row, sent)  # type: ignore[assignment]
        first = store.acquire(key, AcquireRequest("first", 0.05))
        assert isinstance(first, Granted)
        # the first lease (ttl 50 ms) expires by the store's clock: the next ask takes the key over
        eventually(lambda: store.read(key).live_lease is None, "the first lease to expire")
        second = store.acquire(key, AcquireRequest("second", 60.0))
        assert isinstance(second, Granted)
    finally:
        store.close()
    assert len(sent) == 2, sent  # the insert of the first lease, the swap of the takeover
    for values, lease in zip(sent, (first.lease, second.lease), strict=True):
        expected = {f"p_{name}": value for name, value in lease_columns(lease).items()}
        written = {name: value for name, value in values.items() if name in expected}
        assert written == expected

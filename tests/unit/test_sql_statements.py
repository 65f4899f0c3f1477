"""The SQL store's hot statements carry only the values of the call (issue 20).

Every reservation runs ``read_state``/``read_or_insert``, ``insert_new`` and ``complete``: a constant
bound as a parameter (``version + 1``, ``owner = NULL``, ``version < MAX_FENCE``) is one more value the
driver sends or SQLite binds on every call, and one more value merged into every call's parameters.
So the statements write their constants into their SQL, and ``complete`` returns only what the caller
cannot know. Compiled for each dialect without a database.
"""

from __future__ import annotations

import pytest
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import Dialect

from dibs.stores.sql.schema import tables
from dibs.stores.sql.statements import Prepared, Statements, server_now

_DIALECTS: dict[str, Dialect] = {
    "sqlite": sqlite.pysqlite.dialect(),
    "postgresql": postgresql.psycopg.dialect(),
    "mysql": mysql.pymysql.dialect(),
}


def _statements(backend: str) -> Statements:
    _, table, _ = tables("dibs_reservations", None, backend)
    return Statements(table, server_now(backend), _DIALECTS[backend], backend)


@pytest.mark.parametrize("backend", sorted(_DIALECTS))
def test_every_statement_binds_only_the_values_of_the_call(backend: str) -> None:
    prepared = {
        name: value for name, value in vars(_statements(backend)).items() if isinstance(value, Prepared)
    }
    assert {"read_state", "insert_new", "swap_row", "complete", "heartbeat", "release"} <= set(prepared)
    for name, statement in prepared.items():
        assert statement._fixed == {}, f"{name} binds constants: {statement._fixed}"
        positions = statement._positions or ()
        assert all(position.startswith("p_") for position in positions), (name, positions)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_complete_returns_only_what_the_caller_cannot_know(backend: str) -> None:
    complete = _statements(backend).complete
    assert complete.columns == ("producer", "created_at")
    returned = complete.sql.rsplit(" RETURNING ", 1)[1].replace("dibs_reservations.", "")
    assert returned == "producer, created_at"


def test_mysql_complete_returns_nothing_and_keeps_the_two_in_session_variables() -> None:
    statements = _statements("mysql")
    assert statements.complete.columns == ()
    assert "@dibs_producer" in statements.complete.sql and "@dibs_created_at" in statements.complete.sql


@pytest.mark.parametrize("backend", sorted(_DIALECTS))
def test_a_read_row_is_named_and_read_by_position_alike(backend: str) -> None:
    read = _statements(backend).read_state
    row = tuple(range(len(read.columns)))
    named = read.named(row)
    assert all(named[column] == row[read.position(column)] for column in read.columns)

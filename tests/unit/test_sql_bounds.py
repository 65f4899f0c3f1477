"""How long the schema check's connection may wait, against the server's own lock wait.

An ``ALTER`` that waits for another session's lock must end with the server's clean lock error (the
store then opens without the new column and the next process adds it), not with the client's bound
cutting the connection: that needs the bound to outlast the lock wait by a margin a loaded client
host can absorb (a reply read a few hundred milliseconds late).
"""

from __future__ import annotations

import pytest
from sqlalchemy.engine import make_url

from dibs.stores.sql.engine import (
    ALTER_MARGIN,
    mysql_lock_wait,
    postgres_lock_wait,
    schema_bound,
    server_bounds,
)


@pytest.mark.parametrize("timeout", [0.5, 1.0, 1.25, 2.0, 10.0, 30.0])
def test_the_schema_check_outlasts_a_postgres_lock_wait_by_the_margin(timeout: float) -> None:
    assert schema_bound("postgresql", timeout) >= postgres_lock_wait(timeout) + ALTER_MARGIN
    assert schema_bound("postgresql", timeout) >= timeout


@pytest.mark.parametrize("timeout", [0.5, 1.0, 1.25, 2.0, 10.0, 30.0])
def test_the_schema_check_outlasts_a_mysql_lock_wait_by_the_margin(timeout: float) -> None:
    for backend in ("mysql", "mariadb"):
        assert schema_bound(backend, timeout) >= mysql_lock_wait(timeout) + ALTER_MARGIN
        assert schema_bound(backend, timeout) >= timeout


def test_sqlite_has_no_server_lock_wait_to_outlast() -> None:
    assert schema_bound("sqlite", 2.0) == 2.0


@pytest.mark.parametrize(("timeout", "milliseconds"), [(2.0, 1600), (1.0, 800), (0.3, 240), (10.0, 8000)])
def test_the_postgres_lock_timeout_is_the_lock_wait_allowed_for(timeout: float, milliseconds: int) -> None:
    options = server_bounds(make_url("postgresql+psycopg://u@h/d"), timeout)["options"]
    assert f"lock_timeout={milliseconds}" in options
    assert postgres_lock_wait(timeout) * 1000 == pytest.approx(milliseconds)

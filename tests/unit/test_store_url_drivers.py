"""Store URLs without a driver name get the driver of the matching extra, not SQLAlchemy's default.

SQLAlchemy's default driver for ``mysql://`` and ``mariadb://`` is MySQLdb (mysqlclient), while
``pip install 'dibs[mysql]'`` installs PyMySQL: without the mapping, following the install hint of the
error leads straight back to the same error.
"""

from __future__ import annotations

import pytest

from dibs.stores import open_store


@pytest.mark.parametrize(
    ("url", "dialect"),
    [
        ("mysql://root@127.0.0.1:1/test", "mysql"),
        ("mariadb://root@127.0.0.1:1/test", "mariadb"),
        ("mysql+pymysql://root@127.0.0.1:1/test", "mysql"),
    ],
)
def test_a_bare_mysql_url_uses_pymysql_the_driver_of_the_mysql_extra(url: str, dialect: str) -> None:
    pytest.importorskip("pymysql", reason="the mysql extra is not installed")
    store = open_store(url)  # nothing is sent to the server before the first operation
    try:
        assert (store.engine.dialect.name, store.engine.dialect.driver) == (dialect, "pymysql")  # type: ignore[attr-defined]
    finally:
        store.close()

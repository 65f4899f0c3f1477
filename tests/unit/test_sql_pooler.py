"""The PostgreSQL URL's ``?pooler=`` and ``?listen_url=``, checked before anything is sent, and what a
store decides from an error that says a prepared statement met another server session (issue 29).

Connecting through a real PgBouncer, in both pool modes, is tests/test_pgbouncer.py's.
"""

from __future__ import annotations

import logging
import re

import psycopg
import pytest

from dibs.errors import ConfigurationError
from dibs.stores.sql import SQLStore
from dibs.stores.sql.engine import split_options
from dibs.stores.sql.pooler import ServerEnd, check_mode, refused_options

BASE = "postgresql+psycopg://dibs:hunter22@db.invalid:6432/pipelines"


@pytest.mark.parametrize(
    ("given", "mode"),
    [
        (None, None),
        ("transaction", "transaction"),
        ("Session", "session"),
        ("none", "none"),
        ("statement", "transaction"),
    ],
)
def test_the_pooler_option_names_a_pool_mode(given: str | None, mode: str | None) -> None:
    assert check_mode(given) == mode


def test_an_unknown_pooler_mode_is_refused_with_the_modes_there_are() -> None:
    with pytest.raises(ConfigurationError, match=r"pooler='pgbouncer'.*pooler=transaction.*pooler=session"):
        SQLStore(f"{BASE}?pooler=pgbouncer")


@pytest.mark.parametrize("option", ["pooler=transaction", "listen_url=postgresql://db/x"])
def test_only_a_postgres_url_takes_the_pooler_options(option: str) -> None:
    name = option.split("=", 1)[0]
    with pytest.raises(ConfigurationError, match=f"{name}= is an option of PostgreSQL store URLs only"):
        split_options(f"mysql+pymysql://root:secret-pw@db/x?{option}")


@pytest.mark.parametrize(
    ("listen_url", "says"),
    [
        ("redis://cache:6379/0", "must be a postgresql:// URL"),
        ("not a url", "is not a URL"),
        ("postgresql://db/x?timeout=3", "dibs's own option(s) timeout"),
        ("postgresql://u:p@ss@db/x", "percent-encode an '@'"),
    ],
)
def test_a_listen_url_that_cannot_be_the_listener_is_refused(listen_url: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(says)):
        split_options(f"{BASE}?listen_url={listen_url}")


def test_the_listen_url_password_stays_out_of_the_store_url_and_its_errors() -> None:
    store = SQLStore(
        f"{BASE}?pooler=transaction&listen_url=postgresql://dibs:listener-secret@db-primary:5432/pipelines"
    )
    try:
        assert "listener-secret" not in store.url and "hunter22" not in store.url
        error = store._unavailable(
            psycopg.OperationalError("password authentication failed: listener-secret")
        )
        assert "listener-secret" not in str(error)
        assert store.change_feed() is not None
    finally:
        store.close()


def test_a_pooler_that_refuses_startup_options_is_told_from_other_connection_failures() -> None:
    assert refused_options(
        psycopg.OperationalError(
            'connection failed: connection to server at "127.0.0.1", port 6432 failed: FATAL:  '
            "unsupported startup parameter: options"
        )
    )
    assert not refused_options(psycopg.OperationalError("connection refused"))
    assert not refused_options(psycopg.OperationalError("FATAL: unsupported startup parameter: search_path"))


MIXED = [
    psycopg.errors.InvalidSqlStatementName('prepared statement "_pg3_2" does not exist'),
    psycopg.errors.DuplicatePreparedStatement('prepared statement "_pg3_0" already exists'),
    psycopg.errors.ProtocolViolation(
        'bind message supplies 8 parameters, but prepared statement "_pg3_2" requires 1'
    ),
]


@pytest.mark.parametrize("error", MIXED, ids=lambda error: type(error).__name__)
def test_a_prepared_statement_in_another_session_stops_the_preparing(
    error: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    """Found out at the first connection (the options arrived), or taken as the server: the store stops
    preparing and warns once, and the statement, which never ran, is repeated by the caller."""
    end = ServerEnd(None, "postgresql+psycopg://dibs:***@db:6432/pipelines")
    end.pooled = False  # what the first connection found (its startup options reached the server)
    assert end.prepares and end.sessions_mixed(error)
    with caplog.at_level(logging.WARNING, logger="dibs.stores.sql"):
        assert end.stop_preparing(error) is None
        assert end.stop_preparing(error) is None  # a second connection's failure: said once
    assert not end.prepares and end.pooled
    assert not end.sessions_mixed(error)  # nothing prepared any more: such an error is not this
    (warning,) = [record for record in caplog.records if record.levelno == logging.WARNING]
    assert "?pooler=transaction" in warning.getMessage()


@pytest.mark.parametrize("declared", ["none", "session"])
def test_a_url_that_said_sessions_are_kept_is_refused_when_they_are_not(declared: str) -> None:
    end = ServerEnd(declared, "postgresql+psycopg://dibs:***@db:6432/pipelines")
    assert end.prepares and end.sessions_mixed(MIXED[0])
    refusal = end.stop_preparing(MIXED[0])
    assert isinstance(refusal, ConfigurationError)
    assert f"pooler={declared}" in str(refusal) and "Use pooler=transaction" in str(refusal)


def test_a_transaction_pooler_never_prepares_nor_sends_startup_options() -> None:
    end = ServerEnd("transaction", "postgresql+psycopg://dibs:***@db:6432/pipelines")
    assert not end.prepares and not end.sends_options
    assert not end.sessions_mixed(MIXED[0])
    session = ServerEnd("session", "postgresql+psycopg://dibs:***@db:6432/pipelines")
    assert session.prepares and not session.sends_options
    unknown = ServerEnd(None, "postgresql+psycopg://dibs:***@db:5432/pipelines")
    assert not unknown.prepares and unknown.sends_options  # the first connection tries, and finds out


def test_an_error_that_names_no_psycopg_statement_is_not_a_mixed_session() -> None:
    end = ServerEnd("none", "postgresql+psycopg://dibs:***@db:5432/pipelines")
    assert not end.sessions_mixed(
        psycopg.errors.InvalidSqlStatementName('prepared statement "mine" does not exist')
    )
    assert not end.sessions_mixed(psycopg.errors.ProtocolViolation("invalid frontend message type 0"))

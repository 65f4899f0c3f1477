"""How the SQL store reaches its database: the URL and its options, the engine and its pool, and the
bounds each database's driver is given (SQLAlchemy 2 Core).

URL options (removed before SQLAlchemy sees the URL): ``table`` (default ``dibs_reservations``, at
most 50 ASCII letters, digits and ``_``; lower case on SQLite, which ignores the case of table names;
never a name the databases reserve, ``pg_*`` or ``sqlite_*``; a table that exists must be dibs's own),
``schema`` (PostgreSQL/MySQL schema to create the table in,
at most 63), ``synchronous`` and ``busy_timeout`` (seconds, at most a day, SQLite), ``pool_size``
(PostgreSQL/MySQL connections per process, default 3), ``timeout`` (seconds, PostgreSQL/MySQL: how
long one call may wait for the server, default 10), ``max_artifact_size`` (bytes: a limit below the
database's own, for every database) and ``watch_interval`` (seconds, MySQL/MariaDB only: the longest
pause between two looks of the process's watch hub at the watched rows, default 0.025; see
:class:`~dibs.stores.sql.feed.VersionsFeed`), and for PostgreSQL ``pooler`` (what the URL reaches:
``none``, ``session`` or ``transaction``; found out at the first connection when not given, see
:mod:`dibs.stores.sql.pooler`) and ``listen_url`` (a ``postgresql://`` URL of the server itself for
the watch hub's one ``LISTEN`` connection, which a transaction pooler cannot carry; see
:class:`~dibs.stores.sql.feed.ListenFeed`).

SQLite is opened in WAL mode with a busy timeout, by many processes of one machine at once. Its
durability trade-off: ``synchronous=NORMAL`` (the default here) survives a crash of any process but
may lose the last transactions on power loss, which costs at worst a recomputation; add
``?synchronous=FULL`` to the URL to fsync every commit (about 10x slower per acquire, measured).

PostgreSQL and MySQL/MariaDB get a bounded pool (:class:`~dibs.stores.sql.bounds.PatientPool`) and
server-side bounds on lock waits and connection attempts (:func:`server_bounds`); the client-side
bound on each call is :mod:`dibs.stores.sql.bounds`. A PostgreSQL connection is opened through the
store's :class:`~dibs.stores.sql.pooler.ServerEnd`, which leaves out what a pooler refuses.
"""

from __future__ import annotations

import math
import os
import weakref
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.engine.url import URL

from dibs.backoff import Backoff, Retrying
from dibs.config import validate_seconds
from dibs.errors import ConfigurationError
from dibs.stores import redact_url
from dibs.stores.sql.bounds import PatientPool
from dibs.stores.sql.pooler import ServerEnd, check_mode

#: The URL's own options (see the module docstring): taken out of the query before SQLAlchemy sees it.
_OPTIONS = (
    "table",
    "schema",
    "synchronous",
    "busy_timeout",
    "pool_size",
    "timeout",
    "max_artifact_size",
    "watch_interval",
    "pooler",
    "listen_url",
)
#: Options only a PostgreSQL URL takes.
_POSTGRES_OPTIONS = ("pooler", "listen_url")
#: Connections per store and process for PostgreSQL and MySQL (``?pool_size=``). The store object is
#: shared by every client of the process (dibs.runtime) and PostgreSQL's watch hub adds one listening
#: connection, so a process holds at most DEFAULT_POOL_SIZE + 1, however many tasks wait in it.
DEFAULT_POOL_SIZE = 3
#: Seconds one PostgreSQL/MySQL call may wait for the server (``?timeout=``); see Limits in
#: :mod:`dibs.stores.sql`.
DEFAULT_TIMEOUT = 10.0
#: Seconds between two looks of a MySQL/MariaDB process's watch hub at its watched rows, at the most
#: (``?watch_interval=``): a change reaches the process's waiters within about this long (issue 20).
DEFAULT_WATCH_INTERVAL = 0.025
_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
# Identifiers are at most 63 characters in PostgreSQL (64 in MySQL); the longest name derived from the
# table is its index, "ix_<table>_namespace" (13 more), then "<table>_notify" and "<table>_meta".
MAX_TABLE_NAME = 50
MAX_SCHEMA_NAME = 63
#: Table names the databases keep for themselves (PostgreSQL's catalogs come first on the search path,
#: SQLite refuses to create them, MySQL's are in its own schemas): never a dibs table.
_RESERVED_TABLE_PREFIXES = ("pg_", "sqlite_", "mysql_", "information_schema")


def split_options(url: str | URL) -> tuple[URL, dict[str, str]]:
    """The URL SQLAlchemy is given, and dibs's own options taken out of it, each checked."""
    try:
        parsed = make_url(url)
    except (sa_exc.ArgumentError, ValueError) as exc:
        # Not chained: SQLAlchemy's message quotes the whole URL, password included. A bad port is
        # a ValueError whose message names the port ("invalid literal for int() ...: 'x'").
        why = f" ({exc})" if isinstance(exc, ValueError) and not isinstance(exc, sa_exc.ArgumentError) else ""
        raise ConfigurationError(
            f"cannot parse SQL store URL {redact_url(str(url))!r}{why}; expected e.g. "
            "'sqlite:///path/dibs.db' or 'postgresql+psycopg://user:password@host:5432/db'"
        ) from None
    if parsed.host is not None and "@" in parsed.host:
        # SQLAlchemy ends the password at its first '@': the rest would reach the driver as a host
        # name, and its "cannot resolve host" message would show the password's tail.
        raise ConfigurationError(
            f"SQL store URL {redact_url(str(url))!r} has an '@' in its host part: percent-encode an '@' "
            "in the user name or password as %40 (the password is not shown)"
        )
    options = {name: str(parsed.query[name]) for name in _OPTIONS if name in parsed.query}
    parsed = parsed.difference_update_query(_OPTIONS)
    if parsed.get_backend_name() == "postgres":
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() == "postgresql" and parsed.get_driver_name() in ("", "psycopg2"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() == "sqlite" and parsed.database in (None, "", ":memory:"):
        raise ConfigurationError(
            f"SQLite store URL {redact_url(str(url))!r} names no file; an in-memory SQLite database cannot "
            "be shared between processes. Use e.g. 'sqlite:////var/lib/dibs/dibs.db' (or memory:// for one "
            "process)"
        )
    synchronous = options.get("synchronous", "NORMAL").upper()
    if synchronous not in _SYNCHRONOUS:
        raise ConfigurationError(
            f"synchronous={options['synchronous']!r} is not a SQLite synchronous mode; "
            f"use one of {_SYNCHRONOUS}"
        )
    options["synchronous"] = synchronous
    for name, longest in (("table", MAX_TABLE_NAME), ("schema", MAX_SCHEMA_NAME)):
        value = options.get(name)
        if value is not None and not (value.replace("_", "").isalnum() and value.isascii()):
            raise ConfigurationError(f"{name}={value!r} must be ASCII letters, digits and '_' only")
        if value is not None and len(value) > longest:
            raise ConfigurationError(
                f"{name}={value[:20]!r}... is {len(value)} characters long; at most {longest} are allowed "
                "(the names dibs derives from it must fit PostgreSQL's and MySQL's 63-character limit)"
            )
    table = options.get("table")
    if table is not None and table.lower().startswith(_RESERVED_TABLE_PREFIXES):
        raise ConfigurationError(
            f"table={table!r} starts with a prefix the databases reserve for their own tables "
            f"({', '.join(_RESERVED_TABLE_PREFIXES)}); give dibs a table of its own, e.g. "
            "?table=dibs_reservations"
        )
    if table is not None and parsed.get_backend_name() == "sqlite" and table != table.lower():
        # SQLite compares table names without case: 'Abc' and 'abc' would silently be one table.
        raise ConfigurationError(
            f"table={table!r}: SQLite ignores the case of table names, so this would be the same table "
            f"as {table.lower()!r}; write it in lower case (?table={table.lower()})"
        )
    for name in _POSTGRES_OPTIONS:
        if name in options and parsed.get_backend_name() != "postgresql":
            raise ConfigurationError(
                f"{name}= is an option of PostgreSQL store URLs only (what a pooler in front of the server "
                f"allows), not of {redact_url(str(url))!r}"
            )
    if "pooler" in options:
        options["pooler"] = check_mode(options["pooler"]) or ""
    if "listen_url" in options:
        options["listen_url"] = listen_conninfo(options["listen_url"])
    return parsed, options


def listen_conninfo(text: str) -> str:
    """``?listen_url=`` checked: the libpq URL of the watch hub's ``LISTEN`` connection.

    It names the PostgreSQL server itself (or a session pooler), for the one connection that must
    keep its session; e.g. ``?listen_url=postgresql://dibs:secret@db-primary:5432/pipelines``, its
    own options percent-encoded (``%3F``, ``%26``) or left out.
    """
    try:
        parsed = make_url(text)
    except (sa_exc.ArgumentError, ValueError):
        raise ConfigurationError(
            f"listen_url={redact_url(text)!r} is not a URL; give the PostgreSQL server's own URL, e.g. "
            "listen_url=postgresql://user:password@db-host:5432/dbname"
        ) from None
    if parsed.get_backend_name() not in ("postgresql", "postgres"):
        raise ConfigurationError(
            f"listen_url={redact_url(text)!r} must be a postgresql:// URL (of the server the store's URL "
            "reaches through its pooler)"
        )
    if parsed.host is not None and "@" in parsed.host:
        raise ConfigurationError(
            f"listen_url={redact_url(text)!r} has an '@' in its host part: percent-encode an '@' in the "
            "user name or password as %40 (the password is not shown)"
        )
    ours = sorted(name for name in _OPTIONS if name in parsed.query)
    if ours:
        raise ConfigurationError(
            f"listen_url={redact_url(text)!r} has dibs's own option(s) {', '.join(ours)}: those belong to "
            "the store's URL; the listen URL only says where the LISTEN connection goes"
        )
    return parsed.set(drivername="postgresql").render_as_string(hide_password=False)


def seconds_option(options: Mapping[str, str], name: str, default: float) -> float:
    text = options.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ConfigurationError(
            f"{name}={text!r} must be a number of seconds (default {default:g})"
        ) from None
    seconds = validate_seconds(name, value, maximum=86400)
    assert seconds is not None
    return seconds


def bytes_option(options: Mapping[str, str], name: str) -> int | None:
    text = options.get(name)
    if text is None:
        return None
    if not text.isdigit() or int(text) < 1:
        raise ConfigurationError(f"{name}={text!r} must be a whole number of bytes, 1 or more")
    return int(text)


def mysql_lock_wait(timeout: float) -> int:
    """MySQL/MariaDB: the seconds a lock wait may take (``innodb_lock_wait_timeout``, and
    ``lock_wait_timeout`` for an ``ALTER``): 0.8 ``timeout``, but whole seconds, at least 1."""
    return max(1, int(timeout * 0.8))


#: Seconds the schema check's connection is bounded beyond an ``ALTER``'s lock wait, so that the wait
#: ends with the server's clean lock error, not with the bound cutting the connection. MySQL's lock
#: wait (whole seconds, at least 1) would otherwise outlast a ``timeout`` of 1.25 s or less; on
#: PostgreSQL, 0.2 ``timeout`` between ``lock_timeout`` and the bound is too little for a client
#: host under load (the reply is read late), and so was 1 s on a 2-core machine running the test
#: suite on three workers (2026-12-03). The margin costs nothing while the table is free, and never
#: lengthens the lock wait itself (the server ends it), so the queries it stalls are not held longer.
ALTER_MARGIN = 3.0


def postgres_lock_wait(timeout: float) -> float:
    """PostgreSQL: the seconds a lock wait may take (``lock_timeout``): 0.8 ``timeout``."""
    return timeout * 0.8


def schema_bound(backend: str, timeout: float) -> float:
    """Seconds the schema check's connection may wait for the server (see :data:`ALTER_MARGIN`)."""
    if backend in ("mysql", "mariadb"):
        return max(timeout, mysql_lock_wait(timeout) + ALTER_MARGIN)
    if backend == "postgresql":
        return max(timeout, postgres_lock_wait(timeout) + ALTER_MARGIN)
    return timeout


def server_bounds(url: URL, timeout: float) -> dict[str, Any]:
    """Connection arguments that bound, on the server's side too, how long one call may take.

    PostgreSQL: a lock wait ends with a clean error after 0.8 ``timeout`` (``lock_timeout``), before
    the client's bound shuts the connection (a long write is bounded by the keeper alone), libpq gives up a
    connection attempt after ``timeout``, and TCP keepalives and ``tcp_user_timeout`` notice a peer
    that vanished. MySQL/MariaDB: ``innodb_lock_wait_timeout`` ends a lock wait (error 1205, which is
    retried) within 0.8 ``timeout``; PyMySQL's ``connect_timeout`` bounds the connection attempt.
    """
    seconds = max(1, math.ceil(timeout))
    backend = url.get_backend_name()
    if backend == "postgresql":
        # lock_timeout, not statement_timeout: a complete writing a large artifact may rightly take
        # longer than a lock wait should (the keeper's bound grows with its size; this would not).
        options = f"-c lock_timeout={round(postgres_lock_wait(timeout) * 1000)}"
        if url.query.get("options"):
            options = f"{url.query['options']} {options}"
        return {
            "connect_timeout": max(2, seconds),  # libpq takes no less than 2
            "options": options,
            "keepalives": 1,
            "keepalives_idle": seconds,
            "keepalives_interval": max(1, seconds // 3),
            "keepalives_count": 3,
            "tcp_user_timeout": int(timeout * 1000),
        }
    if backend in ("mysql", "mariadb"):
        return {
            "connect_timeout": seconds,
            # PyMySQL's connect_timeout covers only the TCP connect: these bound the handshake too.
            # Once connected, they are lifted (_lift_socket_timeouts) and the keeper bounds each call.
            "read_timeout": seconds,
            "write_timeout": seconds,
            "init_command": f"SET SESSION innodb_lock_wait_timeout = {mysql_lock_wait(timeout)}",
        }
    return {}


def _connect_through(engine: Engine, server_end: ServerEnd) -> None:
    """Every new connection of ``engine`` is opened by ``server_end`` (startup options left out for a
    pooler, prepared statements off where they would be mixed up)."""

    @sa.event.listens_for(engine, "do_connect")
    def _connect(dialect: Any, _record: Any, cargs: list[Any], cparams: dict[str, Any]) -> Any:
        return server_end.connect(lambda params: dialect.connect(*cargs, **params), cparams)


def _lift_socket_timeouts(dbapi_connection: Any, _record: Any) -> None:
    """A connected PyMySQL connection: its calls are bounded by the keeper (dibs.stores.sql.bounds),
    whose bound grows with the artifact a ``complete`` sends, not by one fixed socket timeout."""
    for name in ("_read_timeout", "_write_timeout"):
        if hasattr(dbapi_connection, name):
            setattr(dbapi_connection, name, None)


def make_engine(
    url: URL,
    options: dict[str, str],
    engine_kwargs: dict[str, Any],
    timeout: float,
    server_end: ServerEnd | None = None,
) -> Engine:
    """The store's engine; a PostgreSQL one opens its connections through ``server_end``."""
    kwargs: dict[str, Any] = {"isolation_level": "AUTOCOMMIT", **engine_kwargs}
    if kwargs["isolation_level"] == "AUTOCOMMIT":
        # No transaction is ever left open, so there is nothing to reset when a connection goes back
        # to the pool; the default reset would cost PyMySQL a ROLLBACK round trip per operation.
        kwargs.setdefault("pool_reset_on_return", None)
    # An error's text reaches logs, events and spans: without this it carries the statement's
    # parameters, among them the lease id a holder proves itself with.
    kwargs.setdefault("hide_parameters", True)
    backend = url.get_backend_name()
    try:
        if backend == "sqlite":
            try:
                busy_seconds = float(options.get("busy_timeout", "30"))
            except ValueError as exc:
                raise ConfigurationError(
                    f"busy_timeout={options['busy_timeout']!r} must be a number of seconds"
                ) from exc
            # SQLite takes it in milliseconds as a 32-bit int: a day is plenty, NaN and inf are not.
            busy_seconds = (
                validate_seconds("busy_timeout", busy_seconds, allow_zero=True, maximum=86400) or 0.0
            )
            assert url.database is not None
            directory = os.path.dirname(os.path.abspath(url.database))
            if not os.path.isdir(directory):
                raise ConfigurationError(
                    f"the folder of the SQLite store {url.database!r} does not exist; "
                    f"create {directory!r} first"
                )
            kwargs.setdefault("connect_args", {"timeout": busy_seconds, "check_same_thread": False})
            engine = sa.create_engine(url, **kwargs)
            _configure_sqlite(engine, int(busy_seconds * 1000), options["synchronous"])
            return engine
        pool_size = options.get("pool_size", str(DEFAULT_POOL_SIZE))
        if not pool_size.isdigit() or not 1 <= int(pool_size) <= 1000:
            raise ConfigurationError(
                f"pool_size={pool_size!r} must be a whole number of connections from 1 to 1000 (default "
                f"{DEFAULT_POOL_SIZE})"
            )
        kwargs.setdefault("pool_size", int(pool_size))
        kwargs.setdefault("connect_args", server_bounds(url, timeout))
        # Last in, first out: a process that makes one call at a time keeps reusing one connection,
        # and the others stay idle until the keeper closes them (dibs.stores.sql.bounds).
        kwargs.setdefault("pool_use_lifo", True)
        kwargs.setdefault("poolclass", PatientPool)  # opens another connection only when one is needed
        # Bounded: a caller that finds every connection busy waits for one (up to pool_timeout),
        # instead of opening more until the server refuses every client of the database.
        kwargs.setdefault("max_overflow", 0)
        kwargs.setdefault("pool_timeout", 30)
        kwargs.setdefault("pool_recycle", 1800)
        engine = sa.create_engine(url, **kwargs)
        if backend in ("mysql", "mariadb"):
            sa.event.listen(engine, "connect", _lift_socket_timeouts)
        if server_end is not None:
            _connect_through(engine, server_end)
        return engine
    except ImportError as exc:
        extra = "postgres" if backend == "postgresql" else "mysql"
        raise ConfigurationError(
            f"the {backend} store needs its driver ({exc.name}); install it with: pip install 'dibs[{extra}]'"
        ) from exc
    except sa_exc.NoSuchModuleError as exc:
        raise ConfigurationError(f"unknown SQL dialect in {redact_url(str(url))!r}: {exc}") from exc


def _configure_sqlite(engine: Engine, busy_ms: int, synchronous: str) -> None:
    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {busy_ms}")
            _switch_to_wal(cursor, busy_ms / 1000)
            cursor.execute(f"PRAGMA synchronous = {synchronous}")
        finally:
            cursor.close()


#: Pauses between two tries at switching to WAL: 5 ms growing to 0.1 s, spread widely (processes that
#: collided once must not try again in step).
_WAL_PAUSES = Backoff(initial=0.005, maximum=0.1, notify_maximum=0.1, jitter=0.6)


def _switch_to_wal(cursor: Any, patience: float) -> None:
    """Put the database in WAL mode, waiting up to ``patience`` seconds for processes doing the same.

    The busy timeout does not cover this: when several processes open a new database at once, the
    switch (which needs the database to itself) fails at once with "database is locked" in all but
    one of them, as SQLite gives up rather than risk a deadlock. So it is retried here, after pauses
    with jitter (processes that collided once must not retry in step and collide again). Once the
    file is in WAL mode (it stays so), the switch is a read that never conflicts.
    """
    import sqlite3

    retrying = Retrying(_WAL_PAUSES, patience)
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            contended = "locked" in str(exc) or "busy" in str(exc)
            if not contended or not retrying.sleep():
                raise


#: Every engine of the process, disposed of in a forked child (see :func:`dispose_in_forked_children`).
_ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()


def dispose_in_forked_children(engine: Engine) -> None:
    """A forked child must not reuse its parent's pooled connections (they share one socket/file)."""
    if not _ENGINES:
        os.register_at_fork(after_in_child=_dispose_all_in_child)
    _ENGINES.add(engine)


def _dispose_all_in_child() -> None:
    for engine in list(_ENGINES):
        engine.dispose(close=False)

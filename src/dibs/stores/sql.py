"""The SQL store (SQLAlchemy 2 Core): SQLite as the embedded default, PostgreSQL for deployments,
MySQL/MariaDB as well.

One row per key. How each operation stays atomic and cheap:

* ``acquire`` *reads first* (one ``SELECT`` that also returns the database's clock), decides with the
  shared state machine (:mod:`dibs.stores.transitions`) and writes only when it can win: a waiter that
  finds a live lease writes nothing, because in PostgreSQL even a losing conditional upsert locks the
  row, writes WAL and flushes. The write is a single compare-and-swap statement on the row's
  ``version`` (``INSERT ... ON CONFLICT DO NOTHING`` for a new key), so taking over an expired lease
  or re-entering one's own is one atomic statement; a lost swap re-reads and decides again.
* ``heartbeat``, ``complete`` and ``release`` are one token-checked ``UPDATE`` each (fence and random
  lease id in the ``WHERE``); only when it matches no row is the row read again, to explain who has
  the key now.
* A row is never deleted: ``discard``, ``prune`` and ``reap`` clear it to a tombstone (fence and
  version kept, a few hundred bytes) with an ``UPDATE`` guarded by the version they read, so a row's
  version never repeats and no delayed statement can match a newer state of the row.
* Every statement runs in autocommit mode: SQLAlchemy's default transaction would add ``BEGIN`` and
  ``COMMIT`` round trips to statements that are atomic on their own (and, with PyMySQL, a
  ``ROLLBACK`` when the connection goes back to the pool, so the pool does not reset connections).
* The hot operations (``read``, ``acquire``, ``heartbeat``, ``complete``, ``release``) build and
  compile their SQLAlchemy statements once per store and then run the compiled SQL on a pooled
  DBAPI cursor: building, caching and executing a Core statement costs 40 to 150 microseconds of
  Python per call, several times an SQLite statement or a PostgreSQL round trip (measured in
  ``benchmarks/``). Where the database has ``UPDATE ... RETURNING`` (PostgreSQL, SQLite 3.35+),
  ``complete`` returns the stored artifact in the same statement instead of reading it back.
* Expiry is judged by the database's clock (``clock_timestamp()``, ``julianday('now')``,
  ``NOW(6)``), never the client's. Times are stored as Unix seconds (double precision). SQLite is
  the exception that proves the rule: it runs inside each calling process, so ``julianday('now')``
  is that process's clock. All processes of one machine share it, but a process whose clock is
  shifted (as the reliability suite does with libfaketime) judges expiry wrongly, exactly like the
  file store; ``RELIABILITY.md`` shows it.
* PostgreSQL wakes waiters with ``LISTEN``/``NOTIFY``: a trigger notifies when a lease ends or an
  artifact appears, so no extra round trip is spent by writers; the process's one listening
  connection hears every key.

SQLite is opened in WAL mode with a busy timeout, by many processes of one machine at once. Its
durability trade-off: ``synchronous=NORMAL`` (the default here) survives a crash of any process but
may lose the last transactions on power loss, which costs at worst a recomputation; add
``?synchronous=FULL`` to the URL to fsync every commit (about 10x slower per acquire, measured).

URL options (removed before SQLAlchemy sees the URL): ``table`` (default ``dibs_reservations``, at
most 50 ASCII letters, digits and ``_``; lower case on SQLite, which ignores the case of table names;
never a name the databases reserve, ``pg_*`` or ``sqlite_*``; a table that exists must be dibs's own),
``schema`` (PostgreSQL/MySQL schema to create the table in,
at most 63), ``synchronous`` and ``busy_timeout`` (seconds, at most a day, SQLite), ``pool_size``
(PostgreSQL/MySQL connections per process, default 3), ``timeout`` (seconds, PostgreSQL/MySQL: how
long one call may wait for the server, default 10) and ``max_artifact_size`` (bytes: a limit below the
database's own, for every database).

One store object serves every client of a process (:mod:`dibs.runtime`): one bounded pool, one
schema check (a single read when the tables exist; nothing is sent before the first operation),
and one watch hub, whose feed is a ``LISTEN`` connection on PostgreSQL, a ``data_version`` probe on
SQLite and a versions query on MySQL (:mod:`dibs.stores.feeds`).

Hostile and careless input, and a server that goes away:

* Rows are read by the shared decoder (:mod:`dibs.stores.decoder`), so a damaged row is the same
  :class:`~dibs.errors.CorruptRecord` as on every store; ``force_release``, ``forget`` and ``reap``
  read and decode the row before changing it (compare-and-swap on its version), so they never
  rewrite a damaged one, and ``list``/``reap`` skip (and count) rows they cannot read.
* MySQL/MariaDB tables are created ``utf8mb4`` with a binary collation, whatever the database's
  default (under latin1, keys were stored as ``?``). A statement longer than the server's
  ``max_allowed_packet`` is refused before it is sent (:class:`~dibs.errors.ArtifactTooLarge`): the
  server would drop the connection, which looks like a network failure.
* When the server has ended a pooled connection (a restart, ``pg_terminate_backend``), the whole
  pool is dropped, and the operations that are safe to repeat (``read``, ``list``, ``acquire``,
  ``heartbeat``) run once more on a fresh connection; ``complete`` and ``release`` are not repeated.
* A MySQL/MariaDB deadlock (1213) or lock wait timeout (1205) is an answer, not a lost reply: the
  server rolled the statement back, so every operation (``complete`` and ``release`` too) runs again,
  a few times, before it is reported.

Limits, checked or enforced by the client, so that no call outlives what the lease can wait:

* **Value size.** Each database's limit on one write is known before anything is sent: SQLite's
  ``SQLITE_LIMIT_LENGTH`` of the connection (a row, 1,000,000,000 bytes by default), PostgreSQL's
  1 GB for a ``bytea`` value, MySQL's ``max_allowed_packet`` for the whole statement, or a lower
  ``?max_artifact_size=``. A larger artifact is :class:`~dibs.errors.ArtifactTooLarge`; the client
  then releases the lease and returns the value to its own caller.
* **Time.** Every call on a pooled PostgreSQL/MySQL connection is bounded on the client
  (:mod:`dibs.stores.sql_bounds`) by ``timeout`` seconds, plus a second per
  :data:`BYTES_PER_SECOND` of an artifact being stored; past it the connection is shut and the call
  is :class:`~dibs.errors.StoreUnavailable`. The server ends lock waits at 0.8 ``timeout``
  (PostgreSQL's ``lock_timeout``, MySQL's ``innodb_lock_wait_timeout``), so they end there cleanly
  first (a clean error, retried where safe), and new connections give up after ``timeout``
  (``connect_timeout``). Keep the ttl several times
  ``timeout``: a heartbeat that times out is retried until the lease would expire.
* **Connections.** Pooled connections beyond one are closed after two idle seconds, so a process
  that only waits holds one pooled connection, plus PostgreSQL's listener: two. A server that
  refuses more clients gets an error that says what to change.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import logging
import math
import os
import random
import threading
import time
import weakref
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar, cast

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Dialect, Engine, make_url
from sqlalchemy.engine.url import URL
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ColumnElement

from dibs.config import validate_seconds
from dibs.errors import ConfigurationError, CorruptRecord, StoreUnavailable
from dibs.keys import Key
from dibs.records import (
    MAX_COUNT,
    MAX_FENCE,
    ArtifactRecord,
    KeyState,
    LeaseRecord,
    LeaseToken,
    StoreOutcome,
)
from dibs.stores import decoder, hide_secrets, redact_url, sql_fork, transitions, url_secrets
from dibs.stores.base import Listing, Skipped, Store, refuse_too_large, skip
from dibs.stores.feeds import ChangeFeed, PollingFeed
from dibs.stores.requests import AcquireRequest, NewArtifact
from dibs.stores.sql_bounds import Keeper, PatientPool

__all__ = ["SCHEMA_VERSION", "SQLStore"]

log = logging.getLogger(__name__)

T = TypeVar("T")

SCHEMA_VERSION = 1
#: Nullable columns added to the version 1 table since its release, in order. Old dibs ignores them
#: (so the version stays 1: a mixed fleet keeps working); a table that lacks them gets them with
#: ``ALTER TABLE ... ADD COLUMN`` on the first use, keeping every row. The ``_meta`` row ``columns``
#: records how many are in place, so a process checks with the one read it makes anyway. A user who
#: may not alter the table (an administrator's role owns it) works without them: one warning names
#: the statement to run, and what they would hold is not kept (read as unknown) until it has run.
_ADDED_COLUMNS = ("compute_seconds",)
NOTIFY_CHANNEL = "dibs_changes"
_OPTIONS = ("table", "schema", "synchronous", "busy_timeout", "pool_size", "timeout", "max_artifact_size")
#: Connections per store and process for PostgreSQL and MySQL (``?pool_size=``). The store object is
#: shared by every client of the process (dibs.runtime) and PostgreSQL's watch hub adds one listening
#: connection, so a process holds at most DEFAULT_POOL_SIZE + 1, however many tasks wait in it.
DEFAULT_POOL_SIZE = 3
#: Seconds one PostgreSQL/MySQL call may wait for the server (``?timeout=``); see the module docstring.
DEFAULT_TIMEOUT = 10.0
#: The slowest transfer a ``complete`` is allowed: its bound grows by a second per this many bytes.
BYTES_PER_SECOND = 1024 * 1024  # a slow link: a generous bound, never a cut of a healthy write
#: PostgreSQL's largest ``bytea`` value (1 GB less its 4-byte header): the payload's limit there.
POSTGRES_MAX_BYTEA = 0x3FFFFFFF - 4
#: What a row holds besides the payload and the texts complete writes (numbers, digests, a failure).
_ROW_OVERHEAD = 16 * 1024
#: MySQL/MariaDB errors that mean the statement was rolled back by the server, so it may run again:
#: 1213 deadlock, 1205 lock wait timeout. How often, before the error is reported.
_ROLLED_BACK = (1213, 1205)
_ROLLED_BACK_ATTEMPTS = 5
#: The gate of the stores that need none (every server store): a context manager that does nothing.
_NO_GATE: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
# Identifiers are at most 63 characters in PostgreSQL (64 in MySQL); the longest name derived from the
# table is its index, "ix_<table>_namespace" (13 more), then "<table>_notify" and "<table>_meta".
MAX_TABLE_NAME = 50
# The bytes older PyMySQL (and mysqlclient) write as two when they inline bytes as an escaped string.
_MYSQL_ESCAPED = (b"\0", b"\\", b"\n", b"\r", b"\x1a", b"'", b'"')
MAX_SCHEMA_NAME = 63
#: Table names the databases keep for themselves (PostgreSQL's catalogs come first on the search path,
#: SQLite refuses to create them, MySQL's are in its own schemas): never a dibs table.
_RESERVED_TABLE_PREFIXES = ("pg_", "sqlite_", "mysql_", "information_schema")


def _tables(
    name: str, schema: str | None, dialect: str, added: Collection[str] = _ADDED_COLUMNS
) -> tuple[sa.MetaData, sa.Table, sa.Table]:
    """The tables' definitions; of :data:`_ADDED_COLUMNS`, only those in ``added`` (the ones the
    database's table has, when it cannot be given the others)."""
    metadata = sa.MetaData(schema=schema)
    # MySQL/MariaDB: the tables' own character set, whatever the database's default. Under a latin1
    # database, keys and owners outside latin1 were stored as '?', and the key then read as corrupt
    # (its row named another key). utf8mb4_bin also compares exactly (no case folding, no padding).
    charset: dict[str, Any] = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}
    payload_type: Any = sa.LargeBinary()
    if dialect in ("mysql", "mariadb"):  # imported only here: the MySQL dialect takes ~50 ms to import
        from sqlalchemy.dialects import mysql

        payload_type = payload_type.with_variant(mysql.LONGBLOB(), "mysql", "mariadb")
    reservations = sa.Table(
        name,
        metadata,
        sa.Column("key_hash", sa.String(64), primary_key=True),
        sa.Column("namespace", sa.String(200), nullable=False, index=True),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("version", sa.BigInteger, nullable=False),
        sa.Column("fence", sa.BigInteger, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        # the lease, when there is one
        sa.Column("owner", sa.Text),
        sa.Column("lease_id", sa.String(64)),
        sa.Column("acquired_at", sa.Double),
        sa.Column("expires_at", sa.Double),
        sa.Column("max_expires_at", sa.Double),
        sa.Column("ttl", sa.Double),
        sa.Column("attempt", sa.Integer),
        # the last failure
        sa.Column("failure_count", sa.Integer, nullable=False),
        sa.Column("failure_error", sa.Text),
        sa.Column("failure_owner", sa.Text),
        sa.Column("failure_at", sa.Double),
        # the artifact, once completed
        sa.Column("serializer", sa.String(64)),
        sa.Column("payload", payload_type),
        sa.Column("size", sa.BigInteger),
        sa.Column("checksum", sa.String(100)),
        sa.Column("producer", sa.Text),
        sa.Column("artifact_fence", sa.BigInteger),
        sa.Column("created_at", sa.Double),
        # added after schema version 1 was released: see _ADDED_COLUMNS
        *([sa.Column("compute_seconds", sa.Double)] if "compute_seconds" in added else []),
        **charset,
    )
    meta = sa.Table(
        f"{name}_meta",
        metadata,
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("value", sa.String(200), nullable=False),
        **charset,
    )
    return metadata, reservations, meta


def _now(dialect: str) -> ColumnElement[float]:
    """The database's clock as Unix seconds: the only clock that judges expiry."""
    if dialect == "sqlite":
        return sa.literal_column("((julianday('now') - 2440587.5) * 86400.0)", sa.Double)
    if dialect == "postgresql":
        return sa.literal_column("(extract(epoch from clock_timestamp())::double precision)", sa.Double)
    if dialect in ("mysql", "mariadb"):
        return sa.literal_column("(UNIX_TIMESTAMP(NOW(6)) + 0.0)", sa.Double)
    raise ConfigurationError(f"the SQL store supports sqlite, postgresql and mysql/mariadb, not {dialect!r}")


class SQLStore(Store):
    """Reservations in one SQL table. See the module docstring for how each operation is atomic."""

    scheme = "sqlite"
    clock = "the database server's clock"

    def __init__(self, url: str | URL, **engine_kwargs: Any) -> None:
        sa_url, options = _split_options(url)
        self._url = sa_url
        # What a driver's message might quote back (psycopg and PyMySQL do not, today): kept out of errors.
        raw_url = url if isinstance(url, str) else url.render_as_string(hide_password=False)
        self._secrets = (*url_secrets(raw_url), *([str(sa_url.password)] if sa_url.password else []))
        self.dialect = sa_url.get_backend_name()
        self._now = _now(self.dialect)
        self.table_name = options.get("table", "dibs_reservations")
        self.schema = options.get("schema")
        self.metadata, self.t, self.meta = _tables(self.table_name, self.schema, self.dialect)
        self.timeout = _seconds_option(options, "timeout", DEFAULT_TIMEOUT)
        self.max_artifact_size = _bytes_option(options, "max_artifact_size")
        self.engine = _make_engine(sa_url, options, engine_kwargs, self.timeout)
        self._keeper: Keeper | None = None
        if self.dialect != "sqlite":
            keeper = self._keeper = Keeper(self.engine)
            sa.event.listen(self.engine, "checkin", lambda _dbapi, record: keeper.returned(record))
        self._max_packet: int | None = None  # MySQL's max_allowed_packet, read on the first complete
        self._hex_literals: bool | None = None  # how the MySQL driver writes bytes (see _literal_size)
        _dispose_in_forked_children(self.engine)
        self._prepare_statements()
        # Nothing is sent to the database before the first operation (see _ensure_ready).
        self._ready = False
        self._columns_in_place = 0  # how many of _ADDED_COLUMNS the table has (read with its version)
        self._added: tuple[str, ...] = _ADDED_COLUMNS  # those the statements write and read
        self._ready_lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str) -> SQLStore:
        return cls(url)

    @property
    def url(self) -> str:
        # Redacted once: every client built for this store reads it (~30 µs a redaction).
        shown: str | None = self.__dict__.get("_shown_url")
        if shown is None:
            shown = self.__dict__["_shown_url"] = redact_url(self._url.render_as_string(hide_password=True))
        return shown

    def close(self) -> None:
        super().close()
        if self._keeper is not None:
            self._keeper.close()
        self.engine.dispose()

    # -- plumbing ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _connect(self, *, ready: bool = True) -> Iterator[Connection]:
        """A pooled autocommit connection; database errors become :class:`StoreUnavailable`.

        ``ready=False`` skips the schema check (only the schema check itself uses it).
        """
        with self._fork_gate(), self._pooled_connection(ready=ready) as connection:
            yield connection

    def _fork_gate(self) -> contextlib.AbstractContextManager[None]:
        """SQLite: keep ``os.fork`` out while this thread is inside SQLite (see :mod:`.sql_fork`)."""
        return sql_fork.GATE if self.dialect == "sqlite" else _NO_GATE

    @contextlib.contextmanager
    def _pooled_connection(self, *, ready: bool = True) -> Iterator[Connection]:
        """:meth:`_connect` without the fork gate.

        ``ready=False`` skips the schema check (only the schema check itself uses it).
        """
        if ready:
            self._ensure_ready()
        try:
            connection = self.engine.connect()
        except (sa_exc.ProgrammingError, sa_exc.ArgumentError, TypeError) as exc:
            # Raised before anything reached the server: the driver refused an option of the URL
            # (psycopg: ProgrammingError, PyMySQL: TypeError). Not chained: it may quote the URL.
            orig = getattr(exc, "orig", None) or exc
            raise ConfigurationError(
                f"the SQL store URL {self.url!r} has an option the {self.dialect} driver does not accept "
                f"({type(orig).__name__}: {self._first_line(orig, 200)}); remove it",
                store=self.url,
            ) from None
        except (
            sa_exc.OperationalError,
            sa_exc.InterfaceError,
            sa_exc.DisconnectionError,
            sa_exc.TimeoutError,
        ) as exc:
            raise self._unavailable(exc) from exc
        except sa_exc.DBAPIError as exc:
            if exc.connection_invalidated:
                raise self._unavailable(exc) from exc
            raise
        ended = [False]
        try:
            # The bound ends before the connection goes back to the pool, and before the errors
            # below are translated (they need to know whether the bound ended the call).
            with connection as conn, self._bounded(conn.connection.dbapi_connection, self.timeout) as ended:
                yield conn
        except (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.DisconnectionError) as exc:
            raise self._unavailable(exc, timed_out=ended[0]) from exc
        except sa_exc.DBAPIError as exc:
            if exc.connection_invalidated:
                raise self._unavailable(exc, timed_out=ended[0]) from exc
            raise

    @contextlib.contextmanager
    def _bounded(self, dbapi_connection: Any, seconds: float) -> Iterator[list[bool]]:
        """Bound the block's wait for the server (see :mod:`dibs.stores.sql_bounds`); the flag it
        yields is ``[True]`` afterwards if the bound ended it."""
        if self._keeper is None:  # SQLite: no network, and the busy timeout bounds its lock waits
            yield [False]
            return
        with self._keeper.bounded(dbapi_connection, seconds) as ended:
            yield ended

    @contextlib.contextmanager
    def _cursor(self, bound: float | None = None) -> Iterator[Any]:
        """A DBAPI cursor on a pooled autocommit connection (see :meth:`_pooled_cursor`)."""
        with self._fork_gate(), self._pooled_cursor(bound) as cursor:
            yield cursor

    @contextlib.contextmanager
    def _pooled_cursor(self, bound: float | None = None) -> Iterator[Any]:
        """A DBAPI cursor on a pooled autocommit connection, for the prepared statements.

        Errors are translated as :meth:`_connect` does: an operational error or a lost connection
        (which is invalidated, so the pool replaces it) is :class:`StoreUnavailable`; any other
        database error is raised as SQLAlchemy's exception for it. The block may wait for the server
        ``bound`` seconds (default: the store's ``timeout``) before its connection is shut.
        """
        self._ensure_ready()
        dbapi = self.engine.dialect.loaded_dbapi
        try:
            connection = self.engine.raw_connection()
        except (dbapi.Error, sa_exc.TimeoutError) as exc:
            # TimeoutError: every connection of the bounded pool stayed busy for pool_timeout.
            raise self._unavailable(exc) from exc
        cursor = None
        ended = [False]
        try:
            if self._keeper is None:  # SQLite: nothing to bound (see _bounded), and no generator to pay for
                cursor = connection.cursor()
                yield cursor
            else:
                seconds = self.timeout if bound is None else bound
                with self._keeper.bounded(connection.dbapi_connection, seconds) as ended:
                    cursor = connection.cursor()
                    yield cursor
        except dbapi.Error as exc:
            lost = ended[0] or self.engine.dialect.is_disconnect(exc, connection, cursor)
            if lost:
                connection.invalidate(exc)
            if lost and not ended[0]:
                # The server ended this connection (a restart, pg_terminate_backend): it will have
                # ended the other idle ones too. Drop them all now, or each would fail one later call.
                self.engine.dispose()
            if lost or isinstance(exc, dbapi.OperationalError | dbapi.InterfaceError):
                raise self._unavailable(exc, disconnected=lost and not ended[0], timed_out=ended[0]) from exc
            dialect = self.engine.dialect
            raise sa_exc.DBAPIError.instance(None, None, exc, dbapi.Error, dialect=dialect) from exc
        finally:
            if cursor is not None:
                with contextlib.suppress(dbapi.Error):
                    cursor.close()
            if ended[0] and connection.dbapi_connection is not None:
                # The bound shut its socket just as the call succeeded: never hand it to the next call.
                connection.invalidate()
            connection.close()

    def _first_line(self, error: BaseException, limit: int) -> str:
        """The first line of a driver's message, without any secret of the URL."""
        text = str(error).strip()
        first = text.splitlines()[0] if text else type(error).__name__
        return hide_secrets(first, self._secrets)[:limit]

    def _unavailable(
        self, exc: Exception, *, disconnected: bool = False, timed_out: bool = False
    ) -> StoreUnavailable:
        """``disconnected``: the server had closed the connection (see :meth:`_repeatable`);
        ``timed_out``: the call's bound shut it (see :mod:`dibs.stores.sql_bounds`)."""
        orig = getattr(exc, "orig", None) or exc
        why = f"{type(orig).__name__}: {self._first_line(orig, 300)}"
        if timed_out:
            why = (
                f"no answer within the store's timeout ({self.timeout:g}s, ?timeout= in the URL), so the "
                f"connection was closed ({why})"
            )
        elif _too_many_clients(why):
            why += (
                f"; every process holds up to {getattr(self.engine.pool, 'size', lambda: '?')()} pooled "
                "connections of this store "
                "(one while it only waits) plus, on PostgreSQL, one listener: lower ?pool_size= in the "
                "store URL, raise the server's max_connections, or put PgBouncer in session mode "
                "(LISTEN needs it) in front of the server"
            )
        error = StoreUnavailable(f"SQL store {self.url} failed: {why}", store=self.url)
        error.disconnected = disconnected  # type: ignore[attr-defined]  # not a field: never pickled
        error.rolled_back = (  # type: ignore[attr-defined]
            self.dialect in ("mysql", "mariadb") and _error_code(orig) in _ROLLED_BACK
        )
        return error

    def _repeatable(
        self, operation: Callable[[Any], T], *, after_lost: bool = True, bound: float | None = None
    ) -> T:
        """Run ``operation`` on a cursor, again when the server's answer says it changed nothing.

        A MySQL deadlock or lock wait timeout (the server rolled the statement back) is retried for
        every operation, a few times. A pooled connection that turns out to have been closed by the
        server is retried once on a fresh one, but only when ``after_lost``: for operations that are
        safe to repeat even if the first attempt reached the server and only its reply was lost:
        reads, ``acquire`` (a second attempt by the same owner re-enters the lease the first one may
        have taken) and ``heartbeat`` (extending twice is extending). ``complete`` and ``release``
        are never repeated blindly: a lost reply there is resolved by reading the key again (see
        :meth:`dibs.Lease.complete`).
        """
        lost_once = False
        rolled_back = 0
        while True:
            try:
                with self._cursor(bound) as cursor:
                    return operation(cursor)
            except StoreUnavailable as exc:
                if getattr(exc, "rolled_back", False) and rolled_back < _ROLLED_BACK_ATTEMPTS - 1:
                    rolled_back += 1
                    log.info("%s: the server rolled a statement back (%s); running it again", self.url, exc)
                    time.sleep(random.uniform(0.0, 0.01 * 2**rolled_back))  # let the other side finish
                    continue
                if not (after_lost and getattr(exc, "disconnected", False)) or lost_once:
                    raise
                lost_once = True
                log.info(
                    "%s: a pooled connection had been closed by the server; trying a fresh one", self.url
                )

    def _ensure_ready(self) -> None:
        """Check (and if needed create) the schema before the first operation, once per process and
        database: a client that is never used sends nothing, and a process opening many clients of
        one store checks once."""
        if self._ready:
            return
        with self._ready_lock:
            if self._ready:
                return
            verified = (self._url.render_as_string(hide_password=False), self.table_name, self.schema)
            added = _VERIFIED_SCHEMAS.get(verified)
            if added is None:
                added = _VERIFIED_SCHEMAS[verified] = self._ensure_schema()
            if added != self._added:
                self._use_columns(added)
            self._ready = True

    def _use_columns(self, added: tuple[str, ...]) -> None:
        """Read and write only the :data:`_ADDED_COLUMNS` in ``added`` (before the first operation)."""
        self._added = added
        self.metadata, self.t, self.meta = _tables(self.table_name, self.schema, self.dialect, added)
        self._prepare_statements()

    def _ensure_schema(self) -> tuple[str, ...]:
        """One read of the schema version when the tables exist (the usual case: nothing is locked or
        re-created); otherwise create them, with racing processes serialized or retrying. A version 1
        table without the ``columns`` marker only gets its columns added (see :meth:`_add_columns`).
        The :data:`_ADDED_COLUMNS` the table has."""
        with self._connect(ready=False) as conn:
            version = self._schema_version(conn)
            if version == SCHEMA_VERSION and self._columns_in_place >= len(_ADDED_COLUMNS):
                return _ADDED_COLUMNS
        for attempt in range(5):
            try:
                with self._connect(ready=False) as conn:
                    if version != SCHEMA_VERSION:
                        if self.dialect == "postgresql":
                            self._create_postgres(conn)
                        else:
                            self.metadata.create_all(conn, checkfirst=True)
                        self._check_schema_version(conn)
                        self._check_is_ours(conn)
                    return self._add_columns(conn)
            except (StoreUnavailable, sa_exc.ProgrammingError, sa_exc.IntegrityError):
                # Another process created the table between our check and our CREATE (SQLite, MySQL).
                if attempt == 4:
                    raise
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _schema_version(self, conn: Connection) -> int | None:
        """The schema version recorded in the database; ``None`` when there is none (no tables yet).

        A version newer than this dibs understands is a :class:`ConfigurationError`.
        """
        meta = self.meta.c
        try:
            query = sa.select(meta.name, meta.value).where(meta.name.in_(("schema_version", "columns")))
            rows = {name: value for name, value in conn.execute(query).tuples()}
        except (sa_exc.ProgrammingError, sa_exc.OperationalError) as exc:
            if exc.connection_invalidated:
                raise
            return None  # no such table: created below
        columns = rows.get("columns")
        self._columns_in_place = int(columns) if columns is not None and columns.isdigit() else 0
        found = rows.get("schema_version")
        if found is None:
            return None
        if not found.isdigit() or int(found) > SCHEMA_VERSION:
            raise ConfigurationError(
                f"table {self.table_name} in {self.url} has schema version {found!r}, newer than this dibs "
                f"understands ({SCHEMA_VERSION}); upgrade dibs, or use another table with ?table=NAME"
            )
        return int(found)

    def _added_columns(self, conn: Connection) -> int:
        """How many of :data:`_ADDED_COLUMNS` the ``_meta`` table says are in place."""
        found = conn.execute(sa.select(self.meta.c.value).where(self.meta.c.name == "columns")).scalar()
        return int(found) if found is not None and found.isdigit() else 0

    def _add_columns(self, conn: Connection) -> tuple[str, ...]:
        """Add the nullable :data:`_ADDED_COLUMNS` a version 1 table lacks (its rows are kept; old
        records read the new columns as NULL: unknown), record that they are there, and return those
        the table has. An ALTER that fails because a racing process added the column first is fine; one
        that fails because this user may not alter the table (PostgreSQL/MySQL: an administrator's role
        owns it) leaves the column out, with one warning naming the statement an administrator should
        run: every operation works, without what the column would keep."""
        if self._added_columns(conn) >= len(_ADDED_COLUMNS):
            return _ADDED_COLUMNS
        present = self._present_columns(conn)
        _, full, _ = _tables(self.table_name, self.schema, self.dialect)
        preparer = conn.dialect.identifier_preparer
        table = preparer.format_table(full)
        refused: builtins.list[tuple[str, str]] = []
        for name in _ADDED_COLUMNS:
            if name in present:
                continue
            kind = full.c[name].type.compile(dialect=conn.dialect)
            statement = f"ALTER TABLE {table} ADD COLUMN {preparer.quote(name)} {kind}"
            try:
                conn.execute(sa.text(statement))
            except sa_exc.DBAPIError as exc:
                if exc.connection_invalidated:
                    raise
                present = self._present_columns(conn)
                if name not in present:  # not a racing process: this user may not add it
                    refused.append((statement, self._first_line(exc.orig or exc, 200)))
        if refused:
            log.warning(
                "%s: table %s lacks the column(s) %s and adding them failed (%s); dibs works without "
                "them (artifacts' compute times are not kept) until an administrator runs: %s",
                self.url,
                self.table_name,
                ", ".join(name for name in _ADDED_COLUMNS if name not in present),
                refused[0][1],
                "; ".join(statement for statement, _ in refused),
            )
            return tuple(name for name in _ADDED_COLUMNS if name in present)
        done = str(len(_ADDED_COLUMNS))
        updated = conn.execute(sa.update(self.meta).where(self.meta.c.name == "columns").values(value=done))
        if updated.rowcount == 0:
            with contextlib.suppress(sa_exc.IntegrityError):
                conn.execute(sa.insert(self.meta).values(name="columns", value=done))
        return _ADDED_COLUMNS

    def _present_columns(self, conn: Connection) -> set[str]:
        return {column["name"] for column in sa.inspect(conn).get_columns(self.table_name, self.schema)}

    def _create_postgres(self, conn: Connection) -> None:
        # A session-level advisory lock (statements autocommit here) serializes concurrent creators;
        # CREATE OR REPLACE FUNCTION would otherwise fail with "tuple concurrently updated". Who waited
        # for the lock finds the schema complete and creates nothing.
        conn.execute(sa.text("SELECT pg_advisory_lock(hashtext(:name))"), {"name": self.table_name})
        try:
            if self._schema_version(conn) == SCHEMA_VERSION:
                return
            if self.schema:
                conn.execute(sa.text(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"'))
            self.metadata.create_all(conn, checkfirst=True)
            self._create_notify_trigger(conn)
        finally:
            # A dropped connection took the lock with its session; unlocking on it would only replace
            # the real error (a StoreUnavailable) with SQLAlchemy's PendingRollbackError.
            if not conn.invalidated:
                conn.execute(sa.text("SELECT pg_advisory_unlock(hashtext(:name))"), {"name": self.table_name})

    def _check_is_ours(self, conn: Connection) -> None:
        """Refuse a ``?table=`` that names a table dibs did not create (``CREATE ... IF NOT EXISTS``
        keeps it as it is): every operation would otherwise fail with the driver's raw error."""
        try:
            columns = {
                column["name"] for column in sa.inspect(conn).get_columns(self.table_name, self.schema)
            }
        except sa_exc.NoSuchTableError:
            columns = set()  # e.g. a system catalog found first on PostgreSQL's search path
        missing = sorted(set(self.t.c.keys()) - columns - set(_ADDED_COLUMNS))
        if missing:
            raise ConfigurationError(
                f"table={self.table_name!r} in {self.url} is not a dibs table (it lacks the column(s) "
                f"{', '.join(missing)}); give dibs a table of its own, e.g. ?table=dibs_reservations",
                store=self.url,
            )

    def _check_schema_version(self, conn: Connection) -> None:
        found = conn.execute(
            sa.select(self.meta.c.value).where(self.meta.c.name == "schema_version")
        ).scalar()
        if found is None:
            with contextlib.suppress(sa_exc.IntegrityError):
                conn.execute(sa.insert(self.meta).values(name="schema_version", value=str(SCHEMA_VERSION)))
            return
        if not found.isdigit() or int(found) > SCHEMA_VERSION:
            raise ConfigurationError(
                f"table {self.table_name} in {self.url} has schema version {found!r}, newer than this dibs "
                f"understands ({SCHEMA_VERSION}); upgrade dibs, or use another table with ?table=NAME"
            )

    def _create_notify_trigger(self, conn: Connection) -> None:
        qualified = f'"{self.schema}"."{self.table_name}"' if self.schema else f'"{self.table_name}"'
        function = f'"{self.schema}".dibs_notify' if self.schema else "dibs_notify"
        conn.execute(
            sa.text(
                f"""
                CREATE OR REPLACE FUNCTION {function}() RETURNS trigger AS $$
                BEGIN
                    IF (OLD.lease_id IS NOT NULL AND NEW.lease_id IS NULL)
                       OR (NEW.serializer IS DISTINCT FROM OLD.serializer) THEN
                        PERFORM pg_notify('{NOTIFY_CHANNEL}', NEW.key_hash);
                    END IF;
                    RETURN NEW;
                END $$ LANGUAGE plpgsql
                """
            )
        )
        trigger = f"{self.table_name}_notify"
        exists = conn.execute(
            sa.text("SELECT 1 FROM pg_trigger WHERE tgname = :name AND tgrelid = CAST(:rel AS regclass)"),
            {"name": trigger, "rel": qualified},
        ).scalar()
        if not exists:
            conn.execute(
                sa.text(
                    f'CREATE TRIGGER "{trigger}" AFTER UPDATE ON {qualified} '
                    f"FOR EACH ROW EXECUTE FUNCTION {function}()"
                )
            )

    # -- the hot statements, built and compiled once -------------------------------------------------
    def _prepare_statements(self) -> None:
        """Compile the statements of read/acquire/heartbeat/complete/release for this database.

        Every value that changes between calls is a ``p_*`` bind parameter; see :class:`_Prepared`.
        """
        t, now, dialect, p = self.t, self._now, self.engine.dialect, sa.bindparam
        # A one-row "clock" subquery left-joined to the key's row: the state and the database's
        # clock in one round trip, even when the key has no row yet.
        clock = sa.select(now.label("now")).subquery("clock")
        read = sa.select(clock.c.now, *t.c).select_from(clock.outerjoin(t, t.c.key_hash == p("p_key_hash")))
        self._read_state = _Prepared(read, dialect, ("now", *(c.name for c in t.c)))

        swapped: dict[str, Any] = {name: p(f"p_{name}") for name in (*_LEASE_COLUMNS, "fence", "attempts")}
        new_row: dict[str, Any] = {name: p(f"p_{name}") for name in ("key_hash", "namespace", "name")}
        insert = self._insert_if_absent({**new_row, "version": 1, "failure_count": 0, **swapped})
        self._insert_new = _Prepared(insert, dialect)
        swap = (
            sa.update(t)
            .where(t.c.key_hash == p("p_key_hash"), t.c.version == p("p_version"))
            .values(version=t.c.version + 1, **swapped)
        )
        self._swap_row = _Prepared(swap, dialect)

        # Besides the token: the row must still be this key's (a write never lands in a row that
        # claims another key), and it must have the owner that complete and release copy into the
        # artifact or the failure (else the write would turn a damaged lease into a damaged
        # artifact). A refused write is explained by a read, which reports the row as corrupt. So is a
        # row whose version cannot be incremented (BIGINT overflow: a raw DataError, or on SQLite a REAL).
        holding = sa.and_(
            t.c.key_hash == p("p_key_hash"),
            t.c.fence == p("p_fence"),
            t.c.lease_id == p("p_lease_id"),
            t.c.namespace == p("p_namespace"),
            t.c.name == p("p_name"),
            t.c.owner.is_not(None),
            t.c.version < MAX_FENCE,
        )
        extended = now + p("p_ttl", type_=sa.Double)
        capped = sa.case(
            (sa.and_(t.c.max_expires_at.is_not(None), t.c.max_expires_at < extended), t.c.max_expires_at),
            else_=extended,
        )
        heartbeat = (
            sa.update(t)
            .where(holding, sa.or_(t.c.max_expires_at.is_(None), t.c.max_expires_at > now))
            .values(expires_at=capped, ttl=p("p_ttl", type_=sa.Double), version=t.c.version + 1)
        )
        self._heartbeat = _Prepared(heartbeat, dialect)

        cleared = tuple((t.c[name], None) for name in _LEASE_COLUMNS)
        producer: Any = t.c.owner
        created_at: Any = now
        if not dialect.update_returning:
            # MySQL/MariaDB have no UPDATE ... RETURNING: the statement also keeps the two values the
            # caller cannot know in session variables, read back by _stored_variables (see complete).
            server_now = now.compile(dialect=dialect)
            producer = sa.literal_column(f"(@dibs_producer := {dialect.identifier_preparer.quote('owner')})")
            created_at = sa.literal_column(f"(@dibs_created_at := CAST({server_now} AS DOUBLE))")
        self._stored_variables = "SELECT @dibs_producer, @dibs_created_at"
        # Of the columns added since version 1, those the table has (see _ADDED_COLUMNS).
        added = tuple(name for name in _ADDED_COLUMNS if name in t.c)
        kept = tuple((t.c[name], p(f"p_{name}", type_=sa.Double)) for name in added)
        # MySQL applies SET assignments left to right: read ``owner`` before the lease columns clear it.
        complete = (
            sa.update(t)
            .where(holding)
            .ordered_values(
                (t.c.producer, producer),
                (t.c.artifact_fence, t.c.fence),
                (t.c.version, t.c.version + 1),
                (t.c.serializer, p("p_serializer")),
                (t.c.payload, p("p_payload")),
                (t.c.size, p("p_size")),
                (t.c.checksum, p("p_checksum")),
                (t.c.created_at, created_at),
                *kept,
                *cleared,
            )
        )
        stored = ("serializer", "size", "checksum", "producer", "artifact_fence", "created_at", *added)
        if dialect.update_returning:
            complete = complete.returning(*(t.c[name] for name in stored))
            self._complete = _Prepared(complete, dialect, stored)
        else:
            self._complete = _Prepared(complete, dialect)

        at_version = sa.and_(t.c.key_hash == p("p_key_hash"), t.c.version == p("p_version"))
        no_lease = dict.fromkeys(_LEASE_COLUMNS)
        self._drop_lease = _Prepared(
            sa.update(t).where(at_version).values(version=t.c.version + 1, **no_lease), dialect
        )
        self._reap_expired = _Prepared(
            sa.update(t).where(at_version, t.c.expires_at <= now).values(version=t.c.version + 1, **no_lease),
            dialect,
        )
        no_result = dict.fromkeys(
            (
                *("serializer", "payload", "size", "checksum", "producer", "artifact_fence", "created_at"),
                *added,
                *("failure_error", "failure_owner", "failure_at"),
            )
        )
        self._drop_result = _Prepared(
            sa.update(t).where(at_version).values(version=t.c.version + 1, failure_count=0, **no_result),
            dialect,
        )
        # Removal (discard, prune, the second step of reap) never deletes the row: it leaves a
        # tombstone that keeps the fence and counts the version up, guarded by the version read. A
        # deleted row would come back at version 1 and fence 1, so a delayed statement guarded by an
        # old version could match the new row and remove a live lease (issue 16).
        self._clear_row = _Prepared(
            sa.update(t)
            .where(at_version)
            .values(version=t.c.version + 1, attempts=0, failure_count=0, **no_lease, **no_result),
            dialect,
        )

        released = (t.c.version, t.c.version + 1)
        self._release = _Prepared(sa.update(t).where(holding).ordered_values(released, *cleared), dialect)
        # The failure is recorded before the lease columns are cleared (MySQL assigns left to right).
        # Saturating, like transitions.release: a 32-bit INTEGER column must never overflow.
        counted = sa.case((t.c.failure_count < MAX_COUNT, t.c.failure_count + 1), else_=MAX_COUNT)
        failure: tuple[tuple[Any, Any], ...] = (
            (t.c.failure_count, counted),
            (t.c.failure_error, p("p_error")),
            (t.c.failure_owner, t.c.owner),
            (t.c.failure_at, now),
        )
        self._release_failed = _Prepared(
            sa.update(t).where(holding).ordered_values(*failure, released, *cleared), dialect
        )
        # A stop: recorded like a failure, but its count stays as it is.
        stopped = ((t.c.failure_count, t.c.failure_count), *failure[1:])
        self._release_stopped = _Prepared(
            sa.update(t).where(holding).ordered_values(*stopped, released, *cleared), dialect
        )

    # -- reading ----------------------------------------------------------------------------------
    def _read(self, cursor: Any, key: Key) -> tuple[KeyState, int | None]:
        row = self._read_state.fetch_one(cursor, {"p_key_hash": key.digest})
        state, version = self._state(key, row), row["version"]
        if version is not None and not (isinstance(version, int) and 0 < version < MAX_FENCE):
            # Every write increments it: at the largest BIGINT the row can never change again.
            raise decoder.corrupt(
                key,
                self._where(row["key_hash"]),
                f"its row version {version!r} is not an integer from 1 to {MAX_FENCE - 1}",
            )
        return state, version

    def _where(self, key_hash: object) -> str:
        return f"row {key_hash!s:.64} of table {self.table_name} ({self.url})"

    def _state(self, key: Key | None, row: Any, *, listed: bool = False) -> KeyState:
        """The row's state by the shared decoder (:mod:`dibs.stores.decoder`); ``key`` is ``None``
        when listing, and then the row's key must be the one whose digest is its ``key_hash``."""
        now = float(row["now"])
        if row["key_hash"] is None:
            assert key is not None
            return transitions.empty(key, now)
        return decoder.decode(
            _row_fields(row),
            key,
            now,
            where=self._where(row["key_hash"]),
            digest=str(row["key_hash"]) if listed else None,
            payload=bytes(row["payload"] or b""),
        )

    def read(self, key: Key) -> KeyState:
        return self._repeatable(lambda cursor: self._read(cursor, key)[0])

    def list(self, namespace: str | None = None) -> Listing:
        """Every row (in ``namespace``), without payloads; unreadable rows are skipped, logged and
        counted (see :class:`~dibs.stores.base.Listing`)."""
        self._ensure_ready()  # before the query is built: it names the columns the table has
        clock = sa.select(self._now.label("now")).scalar_subquery()
        columns = [c for c in self.t.c if c.name != "payload"]
        query = sa.select(clock.label("now"), *columns).order_by(self.t.c.namespace, self.t.c.name)
        if namespace is not None:
            query = query.where(self.t.c.namespace == namespace)
        rows = self._repeatable(lambda cursor: self._fetch_rows(cursor, query))
        states: builtins.list[KeyState] = []
        skipped: builtins.list[Skipped] = []
        for row in rows:
            try:
                states.append(self._state(None, {**row, "payload": b""}, listed=True))
            except CorruptRecord as exc:
                skip(skipped, self._where(row["key_hash"]), exc)
        return Listing(states, skipped)

    def _fetch_rows(self, cursor: Any, query: sa.Select[Any]) -> builtins.list[dict[str, Any]]:
        compiled = query.compile(dialect=self.engine.dialect)
        parameters = compiled.construct_params()
        if compiled.positional:
            cursor.execute(compiled.string, tuple(parameters[name] for name in compiled.positiontup or ()))
        else:
            cursor.execute(compiled.string, parameters)
        names = [column[0] for column in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    # -- acquire: read, decide, compare-and-swap ------------------------------------------------------
    def acquire(self, key: Key, request: AcquireRequest) -> StoreOutcome:
        def attempt(cursor: Any) -> StoreOutcome:
            for _ in range(16):
                state, version = self._read(cursor, key)
                outcome, new_state = transitions.acquire(state, request)
                if new_state is None or self._swap(cursor, key, version, new_state):
                    return outcome
            raise StoreUnavailable(
                f"{key} kept changing while acquiring it; the store is overloaded", key=str(key)
            )

        return self._repeatable(attempt)

    def _swap(self, cursor: Any, key: Key, version: int | None, new: KeyState) -> bool:
        values = {f"p_{name}": value for name, value in _lease_columns(new.lease).items()}
        values.update(p_key_hash=key.digest, p_fence=new.fence, p_attempts=new.attempts)
        if version is None:
            values.update(p_namespace=key.namespace, p_name=key.name)
            return self._insert_new.execute(cursor, values) == 1
        values["p_version"] = version
        return self._swap_row.execute(cursor, values) == 1

    def _insert_if_absent(self, row: dict[str, Any]) -> sa.ClauseElement:
        if self.dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            return pg_insert(self.t).values(row).on_conflict_do_nothing(index_elements=["key_hash"])
        if self.dialect == "sqlite":
            from sqlalchemy.dialects.sqlite import insert as sqlite_insert

            return sqlite_insert(self.t).values(row).on_conflict_do_nothing(index_elements=["key_hash"])
        return sa.insert(self.t).values(row).prefix_with("IGNORE")

    # -- token-checked single statements ------------------------------------------------------------
    @staticmethod
    def _holding(key: Key, token: LeaseToken) -> dict[str, Any]:
        return {
            "p_key_hash": key.digest,
            "p_fence": token.fence,
            "p_lease_id": token.lease_id,
            "p_namespace": key.namespace,
            "p_name": key.name,
        }

    def _lost(self, cursor: Any, key: Key, token: LeaseToken, action: str) -> Exception:
        return transitions.explain_lost(self._read(cursor, key)[0], token, action)

    def heartbeat(self, key: Key, token: LeaseToken, ttl: float) -> LeaseRecord:
        def attempt(cursor: Any) -> KeyState:
            if self._heartbeat.execute(cursor, {**self._holding(key, token), "p_ttl": ttl}) != 1:
                raise self._lost(cursor, key, token, "heartbeat")
            return self._read(cursor, key)[0]

        state = self._repeatable(attempt)
        if state.lease is None or state.lease.token != token:  # changed hands right after our update
            raise transitions.explain_lost(state, token, "heartbeat")
        return state.lease

    def complete(self, key: Key, token: LeaseToken, artifact: NewArtifact) -> ArtifactRecord:
        # Which columns the table has is known once the schema was checked: a store whose first call is
        # this one (a resumed lease) must not send a statement naming a column the table lacks.
        self._ensure_ready()
        payload = artifact.payload
        values = {
            **self._holding(key, token),
            "p_serializer": artifact.serializer,
            "p_payload": payload,
            "p_size": len(payload),
            "p_checksum": artifact.checksum,
        }
        if "compute_seconds" in self._added:
            values["p_compute_seconds"] = artifact.compute_seconds
        else:  # not kept: the table lacks the column (see _add_columns)
            artifact = dataclasses.replace(artifact, compute_seconds=None)
        statement = self._complete

        def attempt(cursor: Any) -> ArtifactRecord:
            self._check_size(cursor, key, values)
            if statement.columns:  # UPDATE ... RETURNING: the stored artifact, in the same statement
                rows = statement.fetch_all(cursor, values)
                if len(rows) != 1:
                    raise self._lost(cursor, key, token, "complete")
                return _stored_artifact(rows[0], payload)
            if statement.execute(cursor, values) != 1:
                raise self._lost(cursor, key, token, "complete")
            # MySQL/MariaDB have no UPDATE ... RETURNING: the statement kept what it wrote that the
            # caller does not know (the producer, the server's time) in session variables. Reading
            # them back cannot race with anything: a prune, forget or new holder right after the
            # update would have made a read of the row tell a stored artifact as a lost one.
            cursor.execute(self._stored_variables)
            producer, created_at = cursor.fetchone()
            return artifact.stored(
                producer=producer.decode() if isinstance(producer, bytes) else str(producer),
                fence=token.fence,
                created_at=float(created_at),
            )

        # Not repeated after a lost connection: its outcome is unknown (see _repeatable).
        return self._repeatable(attempt, after_lost=False, bound=self._bound_for(len(payload)))

    def _bound_for(self, size: int) -> float:
        """How long a call that sends ``size`` bytes may wait for the server (see the module docstring)."""
        return self.timeout + size / BYTES_PER_SECOND

    def _check_size(self, cursor: Any, key: Key, values: Mapping[str, Any]) -> None:
        """Refuse (with :class:`ArtifactTooLarge`) a ``complete`` the database would refuse, or that
        is over ``max_artifact_size``, before anything is sent (see :func:`refuse_too_large`)."""
        payload: bytes = values["p_payload"]
        if self.max_artifact_size is not None:
            refuse_too_large(
                key,
                len(payload),
                len(payload),
                self.max_artifact_size,
                where=f"this store's max_artifact_size of {self.url}",
                remedy="Raise ?max_artifact_size= in the store URL, or store the data elsewhere and return a "
                "reference to it",
            )
        if self.dialect in ("mysql", "mariadb"):
            self._check_packet_size(cursor, key, values)
        elif self.dialect == "sqlite":
            import sqlite3

            limit = int(cursor.connection.getlimit(sqlite3.SQLITE_LIMIT_LENGTH))
            others = sum(len(str(value).encode()) for name, value in values.items() if name != "p_payload")
            refuse_too_large(
                key,
                len(payload),
                len(payload) + others + _ROW_OVERHEAD,
                limit,
                where="SQLite takes in one row (SQLITE_LIMIT_LENGTH)",
                remedy="Use a store for large values (PostgreSQL, Azure), or store the data elsewhere "
                "and return a reference to it",
            )
        elif self.dialect == "postgresql":
            refuse_too_large(
                key,
                len(payload),
                len(payload),
                POSTGRES_MAX_BYTEA,
                where="PostgreSQL takes in one bytea value",
                remedy="Store the data elsewhere (e.g. Azure blobs) and return a reference to it",
            )

    def _check_packet_size(self, cursor: Any, key: Key, values: Mapping[str, Any]) -> None:
        """Refuse (with :class:`ArtifactTooLarge`) a complete that MySQL/MariaDB would refuse.

        The server drops the connection when a statement is longer than ``max_allowed_packet``, which
        looks like a network failure: the client then re-sent the payload for a whole ttl and never
        released the lease. The statement's length is known before sending: the driver inlines the
        payload as a literal (see :meth:`_literal_size`), and the other values are short.
        """
        if self._max_packet is None:
            cursor.execute("SELECT @@max_allowed_packet")
            self._max_packet = int(cursor.fetchone()[0])
        payload = values["p_payload"]
        others = sum(2 * len(str(value).encode()) for name, value in values.items() if name != "p_payload")
        needed = self._literal_size(cursor, payload) + others + len(self._complete.sql) + 64
        refuse_too_large(
            key,
            len(payload),
            needed,
            self._max_packet,
            where=f"this {self.dialect} server's max_allowed_packet",
            remedy="Raise max_allowed_packet on the server, or store the data elsewhere and return a "
            "reference to it",
        )

    def _literal_size(self, cursor: Any, payload: bytes) -> int:
        """How many bytes the driver's literal of ``payload`` takes: PyMySQL 1.1 and later write hex
        (``X'..'``, two bytes per byte), older drivers an escaped string (two bytes for each of the
        seven bytes of ``_MYSQL_ESCAPED``). Which one is asked of the driver once per store."""
        if self._hex_literals is None:
            try:
                probe = cursor.connection.escape(b"a\0")
                text = probe.decode("ascii") if isinstance(probe, bytes) else str(probe)
                self._hex_literals = text.upper().startswith("X'")
            except Exception:  # a driver without escape(): assume the larger form
                self._hex_literals = True
        if self._hex_literals:
            return 2 * len(payload) + 3
        return len(payload) + sum(payload.count(byte) for byte in _MYSQL_ESCAPED) + 10

    def release(self, key: Key, token: LeaseToken, error: str | None = None, *, counted: bool = True) -> None:
        values = self._holding(key, token)
        statement = self._release
        if error is not None:
            statement = self._release_failed if counted else self._release_stopped
            values["p_error"] = error[: transitions.MAX_ERROR_LENGTH]

        def attempt(cursor: Any) -> None:
            if statement.execute(cursor, values) != 1:
                raise self._lost(cursor, key, token, "release")

        self._repeatable(attempt, after_lost=False)

    # -- repair -----------------------------------------------------------------------------------------
    # Each reads the row first (so a damaged row is reported as CorruptRecord, as on every store, and
    # never rewritten), then changes it with a compare-and-swap on the version it read.
    def _repair(
        self, key: Key, wanted: Callable[[KeyState], bool], statement: _Prepared, action: str
    ) -> bool:

        def attempt(cursor: Any) -> bool:
            for _ in range(16):
                state, version = self._read(cursor, key)
                if version is None or not wanted(state):
                    return False
                if statement.execute(cursor, {"p_key_hash": key.digest, "p_version": version}) == 1:
                    return True
            raise StoreUnavailable(f"{key} kept changing while trying to {action} it", key=str(key))

        # Only a rolled-back statement runs again: after a lost reply, a second attempt would not
        # know whether the first one changed the row.
        return self._repeatable(attempt, after_lost=False)

    def force_release(self, key: Key) -> bool:
        return self._repair(key, lambda state: state.lease is not None, self._drop_lease, "force-release")

    def forget(self, key: Key) -> bool:
        return self._repair(
            key,
            lambda state: state.artifact is not None or state.failure is not None,
            self._drop_result,
            "forget",
        )

    def reap(self, namespace: str | None = None) -> int:
        reaped = 0
        for state in self.list(namespace):
            expired = state.lease is not None and not state.lease.live_at(state.now)
            if not (expired or transitions.holds_nothing(state)):
                continue
            try:
                # The statement checks expiry again on the database's clock: the holder may have renewed.
                cleared = expired and self._repair(
                    state.key,
                    lambda s: s.lease is not None and not s.lease.live_at(s.now),
                    self._reap_expired,
                    "reap",
                )
                reaped += int(self.discard(state.key) or cleared)
            except CorruptRecord as exc:  # damaged since it was listed: skipped, as by list
                skip([], self._where(state.key.digest), exc)
        return reaped

    def discard(self, key: Key) -> bool:
        return self._repair(
            key, lambda state: transitions.discard(state) is not None, self._clear_row, "discard"
        )

    def prune(self, namespace: str | None, older_than: float) -> int:
        pruned = 0
        for state in self.list(namespace):
            if not transitions.prunable(state, older_than):
                continue
            try:
                pruned += self._repair(
                    state.key,
                    lambda s: transitions.prune(s, older_than) is not None,
                    self._clear_row,
                    "prune",
                )
            except CorruptRecord as exc:  # damaged since it was listed: skipped, as by list
                skip([], self._where(state.key.digest), exc)
        return pruned

    # -- the watch hub ------------------------------------------------------------------------------
    def read_many(self, keys: Sequence[Key]) -> builtins.list[KeyState]:
        """Several keys in one query per few hundred, for the watch hub (payloads included)."""
        if len(keys) == 1:
            # The hub's usual case (one key changed, every waiter of it woken): the prepared read of
            # :meth:`read`, without building and executing a Core statement (~0.3 ms of Python).
            key = keys[0]
            try:
                state, version = self._repeatable(lambda cursor: self._read(cursor, key))
            except CorruptRecord:
                return []  # its waiters ask for themselves, and get the error
            return [] if version is None else [state]
        self._ensure_ready()  # before the query is built: it names the columns the table has
        t = self.t
        clock = sa.select(self._now.label("now")).scalar_subquery()
        query = sa.select(clock.label("now"), *t.c).where(
            t.c.key_hash.in_(sa.bindparam("hashes", expanding=True))
        )
        by_digest = {key.digest: key for key in keys}
        states = []
        for chunk in _chunks(list(by_digest), _IN_LIST):
            with self._connect() as conn:
                rows = conn.execute(query, {"hashes": chunk}).mappings().all()
            for row in rows:
                try:
                    states.append(self._state(by_digest[row["key_hash"]], row))
                except CorruptRecord:
                    continue  # its waiters ask for themselves, and get the error
        return states

    def versions(self, keys: Iterable[Key]) -> dict[str, int]:
        """The row version of each key that has a row: it changes with every write to the row."""
        t = self.t
        query = sa.select(t.c.key_hash, t.c.version).where(
            t.c.key_hash.in_(sa.bindparam("hashes", expanding=True))
        )
        found: dict[str, int] = {}
        for chunk in _chunks([key.digest for key in keys], _IN_LIST):
            with self._connect() as conn:
                found.update((str(h), int(v)) for h, v in conn.execute(query, {"hashes": chunk}).all())
        return found

    def change_feed(self) -> ChangeFeed:
        """PostgreSQL: one ``LISTEN`` connection; SQLite: ``data_version``; MySQL: a versions poll."""
        if self.dialect == "postgresql":
            return _ListenFeed(self)
        if self.dialect == "sqlite":
            return _DataVersionFeed(self)
        return _VersionsFeed(self)


class _Prepared:
    """One statement compiled once for a dialect, then run as plain SQL on a DBAPI cursor.

    Bind parameters named ``p_*`` take the values given at each call; every other bind parameter
    (the literals inside the statement, such as ``version + 1``) keeps the value compiled in. Values
    are handed to the driver as they are: every ``p_*`` value is a ``str``, ``int``, ``float``,
    ``bytes`` or ``None``, which every supported driver takes natively. ``columns`` names the
    returned columns, in order.
    """

    def __init__(self, statement: sa.ClauseElement, dialect: Dialect, columns: Sequence[str] = ()) -> None:
        compiled = cast(SQLCompiler, statement.compile(dialect=dialect))
        self.sql = compiled.string
        self.columns = tuple(columns)
        binds = compiled.bind_names.items()
        self._fixed = {name: bind.effective_value for bind, name in binds if not name.startswith("p_")}
        self._positions = tuple(compiled.positiontup or ()) if compiled.positional else None

    def parameters(self, values: Mapping[str, Any]) -> Any:
        merged = {**self._fixed, **values} if self._fixed else values
        if self._positions is None:
            return merged
        return tuple(merged[name] for name in self._positions)

    def execute(self, cursor: Any, values: Mapping[str, Any]) -> int:
        """Run the statement; the number of rows it matched."""
        cursor.execute(self.sql, self.parameters(values))
        return int(cursor.rowcount)

    def fetch_all(self, cursor: Any, values: Mapping[str, Any]) -> list[dict[str, Any]]:
        cursor.execute(self.sql, self.parameters(values))
        return [dict(zip(self.columns, row, strict=True)) for row in cursor.fetchall()]

    def fetch_one(self, cursor: Any, values: Mapping[str, Any]) -> dict[str, Any]:
        """The one row the statement returns (a read of a key always returns exactly one)."""
        rows = self.fetch_all(cursor, values)
        if len(rows) != 1:
            raise sa_exc.MultipleResultsFound(f"expected one row, got {len(rows)}: {self.sql}")
        return rows[0]


class _VersionsFeed(PollingFeed):
    """MySQL/MariaDB have no notifications: one query for the versions of every watched row per look,
    for the whole process, instead of every waiter asking for itself."""

    min_interval = 0.05
    max_interval = 1.0

    def __init__(self, store: SQLStore) -> None:
        super().__init__()
        self._store = store

    def tokens(self, keys: Iterable[Key]) -> Mapping[str, Hashable]:
        return self._store.versions(keys)


class _DataVersionFeed(_VersionsFeed):
    """SQLite has no notifications, but in WAL mode ``PRAGMA data_version`` is read from shared memory
    without touching the disk, and changes whenever another connection commits. So it is checked every
    few milliseconds on a connection of its own (outside the pool), and only a change costs the
    versions query.
    """

    min_interval = max_interval = 0.004

    def __init__(self, store: SQLStore) -> None:
        super().__init__(store)
        self._conn: Any = None
        self._version: int | None = None

    def open(self) -> None:
        store = self._store
        store._ensure_ready()
        try:
            cargs, cparams = store.engine.dialect.create_connect_args(store.engine.url)
            cparams["check_same_thread"] = False  # the hub may close it from another thread
            with sql_fork.GATE.inside():
                self._conn = store.engine.dialect.connect(*cargs, **cparams)
            self._version = self._data_version()
        except store.engine.dialect.loaded_dbapi.Error as exc:
            self.close()
            raise store._unavailable(exc) from exc

    def _data_version(self) -> int:
        with sql_fork.GATE.inside():  # no fork in the middle of it (see dibs.stores.sql_fork)
            cursor = self._conn.cursor()
            try:
                cursor.execute("PRAGMA data_version")
                return int(cursor.fetchone()[0])
            finally:
                cursor.close()

    def probe(self, timeout: float) -> bool:
        self.pause(timeout)
        try:
            version = self._data_version()
        except self._store.engine.dialect.loaded_dbapi.Error as exc:
            raise self._store._unavailable(exc) from exc
        changed, self._version = version != self._version, version
        return changed

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception), sql_fork.GATE.inside():
                conn.close()


class _ListenFeed(ChangeFeed):
    """``LISTEN`` on one connection of its own: a trigger on the table notifies the digest of every key
    whose lease ends or whose artifact appears, and this one connection hears them for the process.

    The connection is outside the store's pool, and it is the only extra one: with the pool's default
    of three, a process holds at most four connections to the server, however many waiters it has.
    """

    def __init__(self, store: SQLStore) -> None:
        self._store = store
        self._conn: Any = None

    def open(self) -> None:
        import psycopg

        store = self._store
        store._ensure_ready()  # the trigger that notifies is created with the schema
        conninfo = store._url.set(drivername="postgresql").render_as_string(hide_password=False)
        try:
            # The pool's connection bounds too: a connection attempt gives up after the store's timeout,
            # and keepalives notice a server that vanished while the listener only waits.
            bounds = _server_bounds(store._url, store.timeout)
            self._conn = psycopg.connect(conninfo, autocommit=True, **bounds)
            self._conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
        except psycopg.Error as exc:
            self.close()
            raise store._unavailable(exc) from exc

    def changes(self, watched: Mapping[str, Key], timeout: float) -> Collection[str]:
        import psycopg

        assert self._conn is not None, "open() first"
        digests: set[str] = set()
        try:
            for notify in self._conn.notifies(timeout=timeout, stop_after=1):
                digests.add(notify.payload)
            if digests:  # take what else is queued already: a burst is one round of reads
                # timeout 0: what has arrived, without waiting (a 1 ms wait here delayed every hand-off)
                for notify in self._conn.notifies(timeout=0.0, stop_after=_IN_LIST):
                    digests.add(notify.payload)
        except psycopg.Error as exc:
            raise self._store._unavailable(exc) from exc
        return digests

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


# -- helpers -----------------------------------------------------------------------------------------


def _split_options(url: str | URL) -> tuple[URL, dict[str, str]]:
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
    return parsed, options


def _seconds_option(options: Mapping[str, str], name: str, default: float) -> float:
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


def _bytes_option(options: Mapping[str, str], name: str) -> int | None:
    text = options.get(name)
    if text is None:
        return None
    if not text.isdigit() or int(text) < 1:
        raise ConfigurationError(f"{name}={text!r} must be a whole number of bytes, 1 or more")
    return int(text)


def _error_code(error: BaseException) -> int | None:
    """A MySQL driver error's number (``args[0]``), if it has one."""
    code = error.args[0] if error.args else None
    return code if isinstance(code, int) else None


def _too_many_clients(message: str) -> bool:
    """The server refused a connection because it has as many as it takes."""
    text = message.lower()
    return (
        "too many clients" in text
        or "too many connections" in text
        or "remaining connection slots are reserved" in text
    )


def _server_bounds(url: URL, timeout: float) -> dict[str, Any]:
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
        options = f"-c lock_timeout={int(timeout * 800)}"
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
            "init_command": f"SET SESSION innodb_lock_wait_timeout = {max(1, int(timeout * 0.8))}",
        }
    return {}


def _lift_socket_timeouts(dbapi_connection: Any, _record: Any) -> None:
    """A connected PyMySQL connection: its calls are bounded by the keeper (dibs.stores.sql_bounds),
    whose bound grows with the artifact a ``complete`` sends, not by one fixed socket timeout."""
    for name in ("_read_timeout", "_write_timeout"):
        if hasattr(dbapi_connection, name):
            setattr(dbapi_connection, name, None)


def _make_engine(url: URL, options: dict[str, str], engine_kwargs: dict[str, Any], timeout: float) -> Engine:
    kwargs: dict[str, Any] = {"isolation_level": "AUTOCOMMIT", **engine_kwargs}
    if kwargs["isolation_level"] == "AUTOCOMMIT":
        # No transaction is ever left open, so there is nothing to reset when a connection goes back
        # to the pool; the default reset would cost PyMySQL a ROLLBACK round trip per operation.
        kwargs.setdefault("pool_reset_on_return", None)
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
        kwargs.setdefault("connect_args", _server_bounds(url, timeout))
        # Last in, first out: a process that makes one call at a time keeps reusing one connection,
        # and the others stay idle until the keeper closes them (dibs.stores.sql_bounds).
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


def _switch_to_wal(cursor: Any, patience: float) -> None:
    """Put the database in WAL mode, waiting up to ``patience`` seconds for processes doing the same.

    The busy timeout does not cover this: when several processes open a new database at once, the
    switch (which needs the database to itself) fails at once with "database is locked" in all but
    one of them, as SQLite gives up rather than risk a deadlock. So it is retried here, after pauses
    with jitter (processes that collided once must not retry in step and collide again). Once the
    file is in WAL mode (it stays so), the switch is a read that never conflicts.
    """
    import sqlite3

    deadline = time.monotonic() + patience
    pause = 0.005
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            contended = "locked" in str(exc) or "busy" in str(exc)
            if not contended or time.monotonic() >= deadline:
                raise
        time.sleep(min(random.uniform(0.2, 1.0) * pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 2, 0.1)


_ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()
#: (URL, table, schema) whose schema this process has checked, never twice (see SQLStore._ensure_ready):
#: the :data:`_ADDED_COLUMNS` its table has.
_VERIFIED_SCHEMAS: dict[tuple[str, str, str | None], tuple[str, ...]] = {}
#: Keys per ``IN (...)`` list of the watch hub's queries.
_IN_LIST = 500


def _chunks(items: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _dispose_in_forked_children(engine: Engine) -> None:
    """A forked child must not reuse its parent's pooled connections (they share one socket/file)."""
    if not _ENGINES:
        os.register_at_fork(after_in_child=_dispose_all_in_child)
    _ENGINES.add(engine)


def _dispose_all_in_child() -> None:
    for engine in list(_ENGINES):
        engine.dispose(close=False)


_LEASE_COLUMNS = ("owner", "lease_id", "acquired_at", "expires_at", "max_expires_at", "ttl", "attempt")


def _lease_columns(lease: LeaseRecord | None) -> dict[str, Any]:
    if lease is None:
        return dict.fromkeys(_LEASE_COLUMNS)
    return {
        "owner": lease.owner,
        "lease_id": lease.token.lease_id,
        "acquired_at": lease.acquired_at,
        "expires_at": lease.expires_at,
        "max_expires_at": lease.max_expires_at,
        "ttl": lease.ttl,
        "attempt": lease.attempt,
    }


def _stored_artifact(row: Mapping[str, Any], payload: bytes) -> ArtifactRecord:
    """The artifact ``complete`` just stored: the row's facts, and the payload the caller passed."""
    return ArtifactRecord(
        serializer=str(row["serializer"]),
        payload=bytes(payload),
        size=int(row["size"]),
        checksum=str(row["checksum"]),
        producer=str(row["producer"]),
        fence=int(row["artifact_fence"]),
        created_at=float(row["created_at"]),
        compute_seconds=None if row.get("compute_seconds") is None else float(row["compute_seconds"]),
    )


# Columns of the row under the shared decoder's field names (dibs.stores.decoder.FIELDS). The lease's
# fence is the row's fence; a failure count of 0 means "no failure" (the column is NOT NULL).
_ROW_FIELDS = {
    "namespace": "namespace",
    "name": "name",
    "fence": "fence",
    "attempts": "attempts",
    "lease_owner": "owner",
    "lease_id": "lease_id",
    "lease_acquired_at": "acquired_at",
    "lease_expires_at": "expires_at",
    "lease_ttl": "ttl",
    "lease_attempt": "attempt",
    "lease_max_expires_at": "max_expires_at",
    "failure_count": "failure_count",
    "failure_error": "failure_error",
    "failure_owner": "failure_owner",
    "failure_at": "failure_at",
    "artifact_serializer": "serializer",
    "artifact_size": "size",
    "artifact_checksum": "checksum",
    "artifact_producer": "producer",
    "artifact_fence": "artifact_fence",
    "artifact_created_at": "created_at",
    "artifact_compute_seconds": "compute_seconds",
}


def _row_fields(row: Mapping[str, Any]) -> dict[str, Any]:
    # .get: a column added since version 1 is absent from a table that cannot be given it (unknown).
    fields = {name: row.get(column) for name, column in _ROW_FIELDS.items()}
    has_lease = any(row[column] is not None for column in _LEASE_COLUMNS)
    fields["lease_fence"] = row["fence"] if has_lease else None
    if row["failure_count"] == 0 and row["failure_at"] is None:  # 0 with a failure: only stops
        fields["failure_count"] = None
    return fields

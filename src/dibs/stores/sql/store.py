"""The SQL store: :class:`SQLStore`, its operations on the table's rows, and the plumbing that runs
them on pooled connections (how each operation stays atomic and cheap: :mod:`dibs.stores.sql`).
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import functools
import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar, cast

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.engine.url import URL

from dibs.backoff import Backoff, Retrying
from dibs.errors import ConfigurationError, CorruptRecord, StoreUnavailable
from dibs.keys import Key
from dibs.records import (
    MAX_FENCE,
    ArtifactRecord,
    Granted,
    KeyState,
    LeaseRecord,
    LeaseToken,
    Present,
    StoreOutcome,
    new_lease_id,
)
from dibs.stores import decoder, pages, redact_url, transitions, url_secrets
from dibs.stores.base import Listing, Progress, Skipped, Store, skip
from dibs.stores.feeds import ChangeFeed, check_watch_interval
from dibs.stores.large import CHUNK, Filling, LargeReads, advise_payload_store, read_settled
from dibs.stores.requests import AcquireRequest, NewArtifact
from dibs.stores.sql.admin import AdminReads
from dibs.stores.sql.bounds import Keeper, PatientPool
from dibs.stores.sql.engine import (
    DEFAULT_TIMEOUT,
    DEFAULT_WATCH_INTERVAL,
    bytes_option,
    dispose_in_forked_children,
    make_engine,
    schema_bound,
    seconds_option,
    split_options,
)
from dibs.stores.sql.feed import DataVersionFeed, ListenFeed, VersionsFeed
from dibs.stores.sql.fork import GATE
from dibs.stores.sql.limits import SizeLimits
from dibs.stores.sql.pooler import ServerEnd
from dibs.stores.sql.removal import SetRemoval
from dibs.stores.sql.schema import (
    ADDED_COLUMNS,
    NOTIFY_CHANNEL,
    SchemaCheck,
    check_once,
    lease_columns,
    refuses_writes,
    row_fields,
    tables,
)
from dibs.stores.sql.shelf import SERVER_SHELF_SIZE, SHELF_SIZE, PooledCursor, shelve
from dibs.stores.sql.statements import IN_LIST, Prepared, Statements, chunks, read_columns, server_now
from dibs.stores.sql.translate import ROLLED_BACK_ATTEMPTS, Translator

__all__ = ["SQLStore"]

#: Rows per statement of a prune or reap (see :meth:`SQLStore._remove`).
REMOVAL_BATCH = 1000
#: The pauses before a statement the server rolled back (a MySQL deadlock) runs again: short and
#: spread, so the two sides of a deadlock do not meet again.
_ROLLED_BACK_PAUSES = Backoff(initial=0.01, maximum=0.16, notify_maximum=0.16, jitter=0.9)

log = logging.getLogger(__name__)

T = TypeVar("T")

#: The gate of the stores that need none (every server store): a context manager that does nothing.
_NO_GATE: contextlib.AbstractContextManager[None] = contextlib.nullcontext()


class SQLStore(Store):
    """Reservations in one SQL table. See :mod:`dibs.stores.sql` for how each operation is atomic."""

    scheme = "sqlite"
    clock = "the database server's clock"
    scans = False  # the admin reads go through indexes (dibs.stores.sql.admin)

    def __init__(self, url: str | URL, **engine_kwargs: Any) -> None:
        sa_url, options = split_options(url)
        self._url = sa_url
        # What a driver's message might quote back (psycopg and PyMySQL do not, today): kept out of errors.
        raw_url = url if isinstance(url, str) else url.render_as_string(hide_password=False)
        self._secrets = (*url_secrets(raw_url), *([str(sa_url.password)] if sa_url.password else []))
        self.dialect = sa_url.get_backend_name()
        self._now = server_now(self.dialect)
        self.table_name = options.get("table", "dibs_reservations")
        self.schema = options.get("schema")
        self.metadata, self.t, self.meta = tables(self.table_name, self.schema, self.dialect)
        self.timeout = seconds_option(options, "timeout", DEFAULT_TIMEOUT)
        self.max_artifact_size = bytes_option(options, "max_artifact_size")
        if "watch_interval" in options and self.dialect not in ("mysql", "mariadb"):
            raise ConfigurationError(
                f"watch_interval={options['watch_interval']!r}: only a MySQL/MariaDB store takes it (its "
                "waiters' hub polls); PostgreSQL's hub listens (LISTEN) and SQLite's probes data_version"
            )
        #: MySQL/MariaDB: the longest pause between two looks of the watch hub's versions query.
        self.watch_interval = check_watch_interval(
            seconds_option(options, "watch_interval", DEFAULT_WATCH_INTERVAL)
        )
        #: PostgreSQL: what the URL reaches, the server or a pooler (``?pooler=``), decided once; and
        #: the libpq URL of the watch hub's ``LISTEN`` connection (``?listen_url=``), if given.
        self.server_end, self._listen_url = self._postgres_ends(sa_url, options)
        self.engine = make_engine(sa_url, options, engine_kwargs, self.timeout, self.server_end)
        pool_size: Any = getattr(self.engine.pool, "size", lambda: "?")
        #: The driver's errors as dibs's (:mod:`dibs.stores.sql.translate`), naming the redacted URL.
        self._translate = Translator(self.url, self._secrets, self.dialect, self.timeout, pool_size)
        #: Whether the change feed may read records on its own connection (PostgreSQL's LISTEN one,
        #: SQLite's data_version one): only when that connection is made as the pool's are (a caller's
        #: connect_args, a search_path say, are not).
        self.feed_may_read = "connect_args" not in engine_kwargs
        #: Pooled connections kept checked out between calls (:mod:`dibs.stores.sql.shelf`); ``None`` once
        #: the store is closed.
        self._shelf: builtins.list[Any] | None = []
        self._shelf_size = SHELF_SIZE if self.dialect == "sqlite" else 0
        pool = self.engine.pool
        if isinstance(pool, PatientPool):  # lends its shelved connection to a waiting checkout
            self._shelf_size = SERVER_SHELF_SIZE
            shelf_of = weakref.ref(self)

            def lend() -> None:
                store = shelf_of()
                if store is not None:
                    store._empty_shelf()

            pool.lender = lend
        #: Seconds after which the pool replaces a connection (``pool_recycle``): a shelved one too.
        recycle = getattr(self.engine.pool, "_recycle", -1)
        self._recycle: float | None = float(recycle) if recycle is not None and recycle > 0 else None
        shelve(self)
        self._keeper: Keeper | None = None
        if self.dialect != "sqlite":
            this = weakref.ref(self)

            def shelved() -> bool:
                store = this()
                return store is not None and bool(store._shelf)

            keeper = self._keeper = Keeper(self.engine, shelved=shelved)
            sa.event.listen(self.engine, "checkin", lambda _dbapi, record: keeper.returned(record))
        #: The driver's module (its exception classes), which every call's cursor needs.
        self._dbapi = self.engine.dialect.loaded_dbapi
        #: What ``complete`` may send (:mod:`dibs.stores.sql.limits`).
        self._limits = SizeLimits(self.dialect, self.url, self.max_artifact_size)
        #: Large artifacts read apart from their rows, once for the threads that want one at a time.
        self._large = LargeReads(self._read_large)
        dispose_in_forked_children(self.engine)
        self._prepare_statements()
        # Nothing is sent to the database before the first operation (see _ensure_ready).
        self._ready = False
        self._added: tuple[str, ...] = ADDED_COLUMNS  # those the statements write and read
        self._ready_lock = threading.Lock()

    def _postgres_ends(self, url: URL, options: Mapping[str, str]) -> tuple[ServerEnd | None, str | None]:
        """PostgreSQL: the store's :class:`ServerEnd` and its ``listen_url`` (whose password joins the
        secrets kept out of messages); ``(None, None)`` for other databases."""
        if self.dialect != "postgresql":
            return None, None
        listen_url = options.get("listen_url")
        if listen_url is not None:
            password = make_url(listen_url).password
            self._secrets = (*self._secrets, *([str(password)] if password else []))
        user_options = url.query.get("options")
        end = ServerEnd(options.get("pooler") or None, self.url, str(user_options) if user_options else None)
        return end, listen_url

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
        shelf, self._shelf = self._shelf, None  # calls that end from now on give their connection back
        self._empty_shelf(shelf)
        self.engine.dispose()

    def _empty_shelf(self, shelf: builtins.list[Any] | None = None) -> None:
        """Give the connections kept between calls back to the pool (before it is disposed of)."""
        shelf = self._shelf if shelf is None else shelf
        while shelf:
            try:
                connection = shelf.pop()
            except IndexError:  # another thread took the last one
                break
            with contextlib.suppress(Exception):
                connection.close()

    # -- plumbing ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _connect(self, *, ready: bool = True, bound: float | None = None) -> Iterator[Connection]:
        """A pooled autocommit connection; database errors become :class:`StoreUnavailable`.

        ``ready=False`` skips the schema check (only the schema check itself uses it); ``bound``:
        seconds the block may wait for the server (default: the store's ``timeout``).
        """
        with self._fork_gate(), self._pooled_connection(ready=ready, bound=bound) as connection:
            yield connection

    def _fork_gate(self) -> contextlib.AbstractContextManager[None]:
        """SQLite: keep ``os.fork`` out while this thread is inside SQLite (see :mod:`.fork`)."""
        return GATE if self.dialect == "sqlite" else _NO_GATE

    @contextlib.contextmanager
    def _pooled_connection(self, *, ready: bool = True, bound: float | None = None) -> Iterator[Connection]:
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
            seconds = self.timeout if bound is None else bound
            with connection as conn, self._bounded(conn.connection.dbapi_connection, seconds) as ended:
                yield conn
        except sa_exc.DBAPIError as exc:
            server_end, orig = self.server_end, exc.orig or exc
            if server_end is not None and not ended[0] and server_end.sessions_mixed(orig):
                raise self._sessions_mixed(orig) from exc
            if (
                isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError)
                or exc.connection_invalidated
                or refuses_writes(self.dialect, orig)
            ):
                raise self._unavailable(exc, timed_out=ended[0]) from exc
            raise
        except sa_exc.DisconnectionError as exc:
            raise self._unavailable(exc, timed_out=ended[0]) from exc

    @contextlib.contextmanager
    def _bounded(self, dbapi_connection: Any, seconds: float) -> Iterator[list[bool]]:
        """Bound the block's wait for the server (see :mod:`dibs.stores.sql.bounds`); the flag it
        yields is ``[True]`` afterwards if the bound ended it."""
        if self._keeper is None:  # SQLite: no network, and the busy timeout bounds its lock waits
            yield [False]
            return
        with self._keeper.bounded(dbapi_connection, seconds) as ended:
            yield ended

    def _cursor(self, bound: float | None = None) -> PooledCursor:
        """A DBAPI cursor on a pooled autocommit connection, for the prepared statements.

        Errors are translated as :meth:`_connect` does: an operational error or a lost connection
        (which is invalidated, so the pool replaces it) is :class:`StoreUnavailable`; any other
        database error is raised as SQLAlchemy's exception for it. The block may wait for the server
        ``bound`` seconds (default: the store's ``timeout``) before its connection is shut.
        """
        return PooledCursor(self, self.timeout if bound is None else bound)

    def _first_line(self, error: BaseException, limit: int) -> str:
        """The first line of a driver's message, without any secret of the URL."""
        return self._translate.first_line(error, limit)

    def _unavailable(
        self, exc: Exception, *, disconnected: bool = False, timed_out: bool = False
    ) -> StoreUnavailable:
        """``exc`` as :class:`StoreUnavailable` (see :class:`~dibs.stores.sql.translate.Translator`)."""
        return self._translate.unavailable(exc, disconnected=disconnected, timed_out=timed_out)

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
        lost_once = mixed_once = False
        rolled_back: Retrying | None = None
        while True:
            try:
                with self._cursor(bound) as cursor:
                    return operation(cursor)
            except StoreUnavailable as exc:
                if getattr(exc, "never_ran", False) and not mixed_once:
                    # A prepared statement met another session of a transaction pooler: refused before
                    # it ran, and the store prepares no more (see _sessions_mixed).
                    mixed_once = True
                    continue
                if getattr(exc, "rolled_back", False):
                    rolled_back = rolled_back or Retrying(_ROLLED_BACK_PAUSES, None)
                    if rolled_back.attempts < ROLLED_BACK_ATTEMPTS - 1:
                        log.info(
                            "%s: the server rolled a statement back (%s); running it again", self.url, exc
                        )
                        rolled_back.sleep()  # let the other side finish
                        continue
                if not (after_lost and getattr(exc, "disconnected", False)) or lost_once:
                    raise
                lost_once = True
                log.info(
                    "%s: a pooled connection had been closed by the server; trying a fresh one", self.url
                )

    def _sessions_mixed(self, exc: Exception) -> Exception:
        """A statement psycopg prepared met another server session (a transaction pooler, see
        :mod:`dibs.stores.sql.pooler`): a :class:`ConfigurationError` when the URL said otherwise
        (``?pooler=none`` or ``session``); else the store prepares no more, drops its connections (each
        holds prepared statements the pooler mixes up), and the error says the statement never ran, so
        :meth:`_repeatable` runs it again."""
        assert self.server_end is not None
        refusal = self.server_end.stop_preparing(exc)
        if refusal is not None:
            return refusal
        self._empty_shelf()
        self.engine.dispose()
        error = self._unavailable(exc)
        error.never_ran = True  # type: ignore[attr-defined]  # not a field: never pickled
        return error

    # -- the schema, checked before the first operation, and the statements compiled for it ----------
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
            added = check_once(verified, self._ensure_schema)
            if added != self._added:
                self._use_columns(added)
            self._ready = True

    def _ensure_schema(self) -> tuple[str, ...]:
        """The schema check itself (:class:`~dibs.stores.sql.schema.SchemaCheck`), on connections that
        skip it; the :data:`~dibs.stores.sql.schema.ADDED_COLUMNS` the table has."""
        # Longer than an ALTER's lock wait, which ends cleanly then (see engine.schema_bound)
        connect = functools.partial(
            self._connect, ready=False, bound=schema_bound(self.dialect, self.timeout)
        )
        check = SchemaCheck(
            self.table_name, self.schema, self.dialect, self.url, connect=connect, first_line=self._first_line
        )
        return check.run()

    def _use_columns(self, added: tuple[str, ...]) -> None:
        """Read and write only the :data:`ADDED_COLUMNS` in ``added`` (before the first operation)."""
        self._added = added
        self.metadata, self.t, self.meta = tables(self.table_name, self.schema, self.dialect, added)
        self._prepare_statements()

    def _prepare_statements(self) -> None:
        """Compile the statements of read/acquire/heartbeat/complete/release for this database and the
        table's columns (see :class:`~dibs.stores.sql.statements.Statements`)."""
        prepared = Statements(self.t, self._now, self.engine.dialect, self.dialect)
        self._read_state = prepared.read_state
        self._insert_new, self._swap_row = prepared.insert_new, prepared.swap_row
        self._read_or_insert = prepared.read_or_insert
        self._heartbeat = prepared.heartbeat
        self._complete, self._stored_variables = prepared.complete, prepared.stored_variables
        self._release, self._release_failed = prepared.release, prepared.release_failed
        self._release_stopped = prepared.release_stopped
        self._drop_lease = prepared.drop_lease  # reap clears expired leases by batches (admin.py)
        self._versions_by_size: dict[int, Prepared] = {}
        # Where a read's row has the values read by position (see _read_row). PostgreSQL's
        # read_or_insert returns the read's columns after its first, ``inserted``.
        read = prepared.read_state
        if prepared.read_or_insert is not None:
            assert prepared.read_or_insert.columns[1:] == read.columns
        self._now_at, self._key_hash_at = read.position("now"), read.position("key_hash")
        self._lease_times_at = tuple(
            read.position(name) for name in ("acquired_at", "expires_at", "max_expires_at")
        )
        self._drop_result, self._clear_row = prepared.drop_result, prepared.clear_row
        self._payload_chunk, self._payload_row = prepared.payload_chunk, prepared.payload_row
        self._admin = AdminReads(self.t, self._now, self.engine.dialect)
        self._set_removal = SetRemoval(self._admin)

    # -- reading ----------------------------------------------------------------------------------
    def _read(self, cursor: Any, key: Key) -> tuple[KeyState, int | None]:
        statement = self._read_state
        row = statement.fetch_tuple(cursor, {"p_key_hash": key.digest})
        return self._read_row(key, row, statement)

    def _read_row(self, key: Key, row: tuple[Any, ...], statement: Prepared) -> tuple[KeyState, int | None]:
        """:meth:`_checked_state` of a row of ``statement`` as the driver returned it. A key without a
        row (the outer join's ``key_hash`` is ``NULL``: every new key) is the empty state, without
        naming the row's columns first (issue 20)."""
        if row[self._key_hash_at] is None:
            return transitions.empty(key, float(row[self._now_at])), None
        return self._checked_state(key, statement.named(row))

    def _checked_state(self, key: Key, row: Mapping[str, Any]) -> tuple[KeyState, int | None]:
        """A read row's state and version, a version no write could increment being corrupt."""
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
            row_fields(row),
            key,
            now,
            where=self._where(row["key_hash"]),
            digest=str(row["key_hash"]) if listed else None,
            payload=bytes(row["payload"] or b""),
        )

    def read(self, key: Key) -> KeyState:
        return read_settled(
            key, lambda: self._with_payload(self._repeatable(lambda cursor: self._read(cursor, key)[0]))
        )

    # -- large artifacts, read apart from their rows (dibs.stores.large) -------------------------------
    def _with_payload(self, state: KeyState) -> KeyState | None:
        """``state`` with its artifact's bytes, which its read left out when they are more than
        :data:`~dibs.stores.large.READ_INLINE`; ``None`` when the row holds another artifact by now
        (the caller reads the key again)."""
        return self._large.state(state)

    def _read_large(self, key: Key, artifact: ArtifactRecord) -> bytes | None:
        """Read a large artifact's bytes into one buffer of its size (:class:`~dibs.stores.large.Filling`):
        a chunk per call, each call bounded for its chunk's size, so the whole read's time grows with
        the value's size as a ``complete``'s does, and memory holds the value plus a chunk (read at
        once, a PostgreSQL row of 200 MB took libpq's buffer and result in hex, the unescaped copy and
        the bytes object: 6 times the value). A row whose bytes run short is given back short: the
        artifact's integrity check refuses it, as it refused a short payload read whole."""
        values = {"p_key_hash": key.digest, "p_fence": artifact.fence, "p_checksum": artifact.checksum}
        filling = Filling(artifact.size)
        if self.dialect == "sqlite":
            return self._repeatable(
                lambda cursor: self._read_blob(cursor, values, filling),
                bound=SizeLimits.bound_for(self.timeout, artifact.size),
            )
        statement = self._payload_chunk
        while filling.filled < artifact.size:
            length = min(CHUNK, artifact.size - filling.filled)
            chunk_values = {**values, "p_start": filling.filled + 1, "p_length": length}
            rows = self._repeatable(
                functools.partial(statement.fetch_rows, values=chunk_values),
                bound=SizeLimits.bound_for(self.timeout, length),
            )
            if not rows:
                return None  # another artifact by now, or none
            chunk = rows[0][0]
            if not chunk:
                break
            filling.add(chunk)
            if len(chunk) < length:
                break
        return filling.value()

    def _read_blob(self, cursor: Any, values: Mapping[str, Any], filling: Filling) -> bytes | None:
        """SQLite: the artifact's blob read incrementally (``sqlite3.Blob``), in chunks straight into
        ``filling``, in one read transaction (the blob handle's)."""
        rows = self._payload_row.fetch_rows(cursor, values)
        if not rows:
            return None
        filling.filled = 0  # a second attempt starts over
        with cursor.connection.blobopen(
            self.table_name, "payload", rows[0][0], readonly=True, name=self.schema or "main"
        ) as blob:
            while filling.filled < filling.size:
                chunk = blob.read(min(CHUNK, filling.size - filling.filled))
                if not chunk:
                    break
                filling.add(chunk)
        return filling.value()

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

    # -- the reads a person makes (dibs.stores.pages, dibs.stores.sql.admin) ------------------------------
    def _admin_rows(
        self, statement: Prepared, values: dict[str, Any], *, unprepared: bool = False
    ) -> builtins.list[dict[str, Any]]:
        """The rows of an admin read (see :mod:`dibs.stores.sql.admin`), under their column names;
        never prepared on the server when ``unprepared`` (see :meth:`_unprepared`)."""
        if not unprepared:
            return self._repeatable(lambda cursor: statement.fetch_all(cursor, values))
        options = self._unprepared()

        def run(cursor: Any) -> builtins.list[dict[str, Any]]:
            cursor.execute(statement.sql, statement.parameters(values), **options)
            return [statement.named(row) for row in cursor.fetchall()]

        return self._repeatable(run)

    def _listed(
        self, rows: Iterable[Mapping[str, Any]], skipped: builtins.list[Skipped]
    ) -> builtins.list[KeyState]:
        """The states of listed rows; an unreadable row is skipped, logged and counted in ``skipped``."""
        states = []
        for row in rows:
            try:
                states.append(self._state(None, {**row, "payload": b""}, listed=True))
            except CorruptRecord as exc:
                skip(skipped, self._where(row["key_hash"]), exc)
        return states

    def _admin_values(
        self, namespace: str | None, limit: int, start: tuple[str, str] | None = None, **more: Any
    ) -> dict[str, Any]:
        """The parameters of an admin statement: ``p_limit``, the namespace when it reads one, the cursor
        ``start`` when it reads from one (its name; its namespace too across namespaces), and ``more``."""
        values: dict[str, Any] = {"p_limit": limit, **more}
        if namespace is not None:
            values["p_namespace"] = namespace
        if start is not None:
            values["p_after_name"] = start[1]
            if namespace is None:
                values["p_after_namespace"] = start[0]
        return values

    def page(self, query: pages.Query) -> pages.Page:
        """A page in key order through the keys' index from the cursor: of a status
        (:meth:`AdminReads.page <dibs.stores.sql.admin.AdminReads.page>`), or, with the query's
        ``older_than``, the rows prune would clear, found as the read-then-write removal finds them
        (:meth:`AdminReads.removable <dibs.stores.sql.admin.AdminReads.removable>` in SQL: only
        candidates come back), each decided on again as it is (:func:`transitions.prunable`). An
        unreadable row is skipped and counted."""
        self._ensure_ready()  # the statements name the columns the table has
        namespace, start, limit, older = query.namespace, query.start, query.limit, query.older_than
        if start is not None and namespace is not None:  # only the name counts within one namespace
            if start[0] > namespace:
                return pages.Page((), None)  # every key of the namespace comes before the cursor
            start = start if start[0] == namespace else None  # else: every one comes after it
        within, after = namespace is not None, start is not None
        if older is None:
            statement = self._admin.page(namespace=within, state=query.state, after=after)
            ranged = unprepared = within and self._admin.walks(query.state)  # planned for the table as it is
        else:
            statement = self._admin.removable(namespace=within, kind="prune", after=after)
            ranged, unprepared = within and self.dialect == "postgresql", True
        if ranged and start is None:  # a range of one namespace from its first name on
            start = (namespace or "", "")
        more = {} if older is None else {"p_older": older}
        rows = self._admin_rows(
            statement, self._admin_values(namespace, limit + 1, start, **more), unprepared=unprepared
        )
        skipped: builtins.list[Skipped] = []
        states = self._listed(rows[:limit], skipped)
        if older is not None:
            states = [state for state in states if transitions.prunable(state, older)]
        last = rows[limit - 1] if len(rows) > limit else None
        cursor = None if last is None else pages.cursor_of(Key(last["namespace"], last["name"]))
        return pages.Page(tuple(states), cursor, len(skipped))

    def latest(self, namespace: str | None, kind: pages.Kind, *, limit: int) -> builtins.list[KeyState]:
        pages.check_limit(limit)
        if kind not in ("artifact", "failure"):
            return pages.latest_of((), kind, limit)  # refuses it, naming it
        self._ensure_ready()
        statement = self._admin.latest(namespace=namespace is not None, kind=kind)
        return self._listed(self._admin_rows(statement, self._admin_values(namespace, limit)), [])

    def leases(self, namespace: str | None, *, expired: bool, limit: int) -> builtins.list[KeyState]:
        pages.check_limit(limit)
        self._ensure_ready()
        statement = self._admin.leases(namespace=namespace is not None, expired=expired)
        return self._listed(self._admin_rows(statement, self._admin_values(namespace, limit)), [])

    def count_states(self, namespace: str | None, *, up_to: int = pages.COUNT_CAP) -> dict[str, int]:
        """Each count up to ``up_to`` (a count of ``up_to`` means at least that many): found through the
        status's index, so the count's cost is bounded too."""
        pages.check_limit(up_to)
        self._ensure_ready()
        statement = self._admin.counts(namespace=namespace is not None)
        (row,) = self._admin_rows(statement, self._admin_values(namespace, up_to))
        return {state: int(row[state] or 0) for state in pages.COUNTED}

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
            for round_number in range(16):
                if round_number == 0 and self._read_or_insert is not None:
                    granted, first, version = self._read_or_insert_first(cursor, key, request)
                    if granted is not None:
                        return granted
                    assert first is not None
                    state = first
                else:
                    state, version = self._read(cursor, key)
                outcome, new_state = transitions.acquire(state, request)
                if new_state is None or self._swap(cursor, key, version, new_state):
                    return outcome
            raise StoreUnavailable(
                f"{key} kept changing while acquiring it; the store is overloaded", key=str(key)
            )

        def whole() -> StoreOutcome | None:
            outcome = self._repeatable(attempt)
            if not isinstance(outcome, Present):
                return outcome
            # A hit: its bytes, which the read left out when they are large (read again if the row
            # holds another artifact by now).
            artifact = self._large.artifact(key, outcome.artifact)
            if artifact is None:
                return None
            return outcome if artifact is outcome.artifact else Present(artifact)

        try:
            # mypy joins the union to ``object`` when it solves ``T | None``: the cast names it again.
            return cast(StoreOutcome, read_settled(key, whole))
        except StoreUnavailable as exc:
            if not getattr(exc, "read_only", False):
                raise
            # A read-only server (a standby, a failover under way) refused the statement, which may
            # write. An answer that writes nothing is still right from a read: a hit gets its
            # artifact, a waiter learns who holds the key. Only a lease needs the primary.
            outcome, new_state = transitions.acquire(self.read(key), request)
            if new_state is not None:
                raise
            return outcome

    def _read_or_insert_first(
        self, cursor: Any, key: Key, request: AcquireRequest
    ) -> tuple[Granted | None, KeyState | None, int | None]:
        """PostgreSQL: read the key and, if it has no row, take its first lease, in one round trip
        (see :func:`~dibs.stores.sql.statements.read_or_insert`). The lease granted, or ``None`` and
        the key's state and row version for :func:`transitions.acquire` to decide on."""
        statement = self._read_or_insert
        assert statement is not None
        span = request.ttl if request.max_lease_age is None else min(request.ttl, request.max_lease_age)
        lease_id = new_lease_id()
        values = {
            "p_key_hash": key.digest,
            "p_namespace": key.namespace,
            "p_name": key.name,
            "p_owner": request.owner,
            "p_lease_id": lease_id,
            "p_span": span,
            "p_max_lease_age": request.max_lease_age,
            "p_ttl": request.ttl,
        }
        row = statement.fetch_tuple(cursor, values)
        if not row[0]:  # inserted: false
            state, version = self._read_row(key, row[1:], self._read_state)
            return None, state, version
        # The row the statement inserted is the first lease transitions.acquire grants a free key
        # (fence 1, attempt 1, no failure): built from what was sent and the times the database
        # wrote, rather than by decoding the whole row back (issue 20).
        acquired_at, expires_at, max_expires_at = (row[1 + at] for at in self._lease_times_at)
        lease = LeaseRecord(
            key=key,
            owner=request.owner,
            token=LeaseToken(1, lease_id),
            acquired_at=float(acquired_at),
            expires_at=float(expires_at),
            ttl=request.ttl,
            attempt=1,
            max_expires_at=None if max_expires_at is None else float(max_expires_at),
        )
        return Granted(lease), None, None

    def _swap(self, cursor: Any, key: Key, version: int | None, new: KeyState) -> bool:
        lease = new.lease
        if lease is None:
            values = {f"p_{name}": value for name, value in lease_columns(None).items()}
        else:  # lease_columns(lease) written out: this runs for every lease granted (issue 20)
            values = {
                "p_owner": lease.owner,
                "p_lease_id": lease.token.lease_id,
                "p_acquired_at": lease.acquired_at,
                "p_expires_at": lease.expires_at,
                "p_max_expires_at": lease.max_expires_at,
                "p_ttl": lease.ttl,
                "p_attempt": lease.attempt,
            }
        values["p_key_hash"] = key.digest
        values["p_fence"] = new.fence
        values["p_attempts"] = new.attempts
        if version is None:
            values.update(p_namespace=key.namespace, p_name=key.name)
            return self._insert_new.execute(cursor, values) == 1
        values["p_version"] = version
        return self._swap_row.execute(cursor, values) == 1

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
        advise_payload_store(self.url, len(payload))
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
            self._limits.check(cursor, key, values, statement.sql)
            # What the statement wrote that the caller does not know: the producer (the lease's owner)
            # and the server's time. The rest of the artifact is what was sent.
            if statement.columns:  # UPDATE ... RETURNING: read in the same statement
                rows = statement.fetch_rows(cursor, values)
                if len(rows) != 1:
                    raise self._lost(cursor, key, token, "complete")
                producer, created_at = rows[0]
            else:
                if statement.execute(cursor, values) != 1:
                    raise self._lost(cursor, key, token, "complete")
                # MySQL/MariaDB have no UPDATE ... RETURNING: the statement kept the two in session
                # variables. Reading them back cannot race with anything: a prune, forget or new holder
                # right after the update would have made a read of the row tell a stored artifact as
                # a lost one.
                cursor.execute(self._stored_variables)
                producer, created_at = cursor.fetchone()
            return artifact.stored(
                producer=producer.decode() if isinstance(producer, bytes) else str(producer),
                fence=token.fence,
                created_at=float(created_at),
            )

        # Not repeated after a lost connection: its outcome is unknown (see _repeatable).
        return self._repeatable(
            attempt, after_lost=False, bound=SizeLimits.bound_for(self.timeout, len(payload))
        )

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
    def _repair(self, key: Key, wanted: Callable[[KeyState], bool], statement: Prepared, action: str) -> bool:

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

    def reap(self, namespace: str | None = None, *, progress: Progress | None = None) -> int:
        return self._remove(namespace, "reap", 0.0, progress)

    def discard(self, key: Key) -> bool:
        return self._repair(
            key, lambda state: transitions.discard(state) is not None, self._clear_row, "discard"
        )

    def prune(self, namespace: str | None, older_than: float, *, progress: Progress | None = None) -> int:
        return self._remove(namespace, "prune", older_than, progress)

    # -- removal in batches (issue 30) ------------------------------------------------------------
    def _remove(self, namespace: str | None, kind: str, older_than: float, progress: Progress | None) -> int:
        """Prune or reap by sets, :data:`REMOVAL_BATCH` rows at a time in key order (through the keys'
        index): on PostgreSQL decided and changed by one statement per batch
        (:mod:`dibs.stores.sql.removal`), elsewhere read, decided on in Python and changed by one
        statement (:meth:`_remove_read`). Either way a row changes only while it is still removable
        (a holder or another remover that wrote it meanwhile wins, and the row is not counted), a
        damaged row is left as it is, and removal keeps every row, as a tombstone with its fence (see
        :meth:`discard`)."""
        self._ensure_ready()
        if self.dialect == "postgresql":
            return self._remove_in_sql(namespace, kind, older_than, progress)
        return self._remove_read(namespace, kind, older_than, progress)

    def _remove_in_sql(
        self, namespace: str | None, kind: str, older_than: float, progress: Progress | None
    ) -> int:
        """PostgreSQL: one statement per batch, which says how many rows it changed, how many it chose
        and the last one's key (the next batch's cursor); the last batch is the one that chose fewer
        than its limit. Not repeated after a lost reply (its outcome is unknown: the next removal
        finds what is left), only after the server rolled it back."""
        changed, start = 0, None
        more = {"p_older": older_than} if kind == "prune" else {}
        while True:
            within, after = namespace is not None, start is not None
            statement = self._set_removal.batch(kind, namespace=within, after=after)
            done = self._removal_batch(statement, self._admin_values(namespace, REMOVAL_BATCH, start, **more))
            changed += int(done["changed"])
            if progress is not None:
                progress(changed)
            if int(done["selected"]) < REMOVAL_BATCH:
                return changed
            start = (str(done["last_namespace"]), str(done["last_name"]))

    def _remove_read(
        self, namespace: str | None, kind: str, older_than: float, progress: Progress | None
    ) -> int:
        """SQLite, MySQL/MariaDB: the rows that may change are read in key order (the others filtered
        out by the database); each is decided on as by one key's removal (:func:`transitions.prunable`,
        an expired lease, a record holding nothing; an unreadable row is skipped and logged), and the
        batch is changed by one statement (two for reap: the tombstones, and the expired leases of
        records that keep an artifact or a failure), each row only at the version read and while the
        statement's re-check holds (:meth:`AdminReads.at_versions
        <dibs.stores.sql.admin.AdminReads.at_versions>`)."""
        admin, changed, start = self._admin, 0, None
        while True:
            statement = admin.removable(namespace=namespace is not None, kind=kind, after=start is not None)
            values = self._admin_values(namespace, REMOVAL_BATCH, start, p_older=older_than)
            rows = self._removal_rows(statement, values)
            cleared: builtins.list[tuple[str, int]] = []
            leases: builtins.list[tuple[str, int]] = []
            for row in rows:
                try:
                    state, version = self._listed_row(row)
                except CorruptRecord as exc:
                    skip([], self._where(row["key_hash"]), exc)
                    continue
                if kind == "prune":
                    wanted = transitions.prunable(state, older_than) and not transitions.is_tombstone(state)
                    if wanted:
                        cleared.append((state.key.digest, version))
                    continue
                lease = state.lease
                if lease is not None and not lease.live_at(state.now):
                    to = cleared if state.artifact is None and state.failure is None else leases
                    to.append((state.key.digest, version))
                elif transitions.holds_nothing(state) and not transitions.is_tombstone(state):
                    cleared.append((state.key.digest, version))
            changed += self._change_rows(kind, cleared, older_than)
            changed += self._change_rows("leases", leases, older_than)
            if progress is not None:
                progress(changed)
            if len(rows) < REMOVAL_BATCH:
                return changed
            start = (str(rows[-1]["namespace"]), str(rows[-1]["name"]))

    def _removal_batch(self, statement: Prepared, values: dict[str, Any]) -> dict[str, Any]:
        """One batch of :meth:`_remove_in_sql` (a seam for the tests that count them), never prepared
        on the server (see :meth:`_unprepared`)."""

        def run(cursor: Any) -> dict[str, Any]:
            cursor.execute(statement.sql, statement.parameters(values), **self._unprepared())
            return statement.named(cursor.fetchone())

        return self._repeatable(run, after_lost=False)

    def _unprepared(self) -> dict[str, Any]:
        """psycopg's option to run a statement without preparing it on the server. psycopg prepares a
        statement after its fifth run on a connection, and PostgreSQL may then keep one generic plan
        for it; the removal's statements are planned at each run instead, for the table as it is then.
        A plan kept from a table that was nearly empty (where a scan is as good as any index) would scan
        the grown table for every batch or page; planning costs ~1 ms a batch."""
        return {"prepare": False} if self.engine.dialect.driver == "psycopg" else {}

    def _removal_rows(self, statement: Prepared, values: dict[str, Any]) -> builtins.list[dict[str, Any]]:
        """One batch of the rows a removal may change (a seam for the tests that pause a remover
        between its read and its write)."""
        return self._admin_rows(statement, values)

    def _listed_row(self, row: Mapping[str, Any]) -> tuple[KeyState, int]:
        """A listed row's state and version (:class:`CorruptRecord` if either cannot be read)."""
        state = self._state(None, {**row, "payload": b""}, listed=True)
        version = row["version"]
        if not (isinstance(version, int) and 0 < version < MAX_FENCE):
            raise decoder.corrupt(
                state.key, self._where(row["key_hash"]), f"its row version {version!r} is not an integer"
            )
        return state, version

    def _change_rows(self, change: str, pairs: builtins.list[tuple[str, int]], older_than: float) -> int:
        """Run a batch statement of :meth:`_remove` (``change``: see :meth:`AdminReads.batch
        <dibs.stores.sql.admin.AdminReads.batch>`) on ``pairs`` (key hash, version read); how many
        rows it changed. Not repeated after a lost reply (its outcome is unknown: the next removal
        finds what is left), only after the server rolled it back."""
        if not pairs:
            return 0
        values: dict[str, Any] = {"p_older": older_than} if change == "prune" else {}
        # Padded to a power of two with its first pair (matched once all the same): a few statements
        # compiled per store, whatever the batches' sizes.
        size = 1 << max(0, len(pairs) - 1).bit_length()
        statement = self._admin.batch(change, size)
        for i, (digest, version) in enumerate([*pairs, *[pairs[0]] * (size - len(pairs))]):
            values[f"p_h{i}"], values[f"p_v{i}"] = digest, version
        return self._repeatable(lambda cursor: statement.execute(cursor, values), after_lost=False)

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
            full = None if version is None else self._with_payload(state)
            return [] if full is None else [full]  # changed meanwhile: its waiters ask for themselves
        self._ensure_ready()  # before the query is built: it names the columns the table has
        t = self.t
        clock = sa.select(self._now.label("now")).scalar_subquery()
        query = sa.select(clock.label("now"), *read_columns(t)).where(
            t.c.key_hash.in_(sa.bindparam("hashes", expanding=True))
        )
        by_digest = {key.digest: key for key in keys}
        states = []
        for chunk in chunks(list(by_digest), IN_LIST):
            with self._connect() as conn:
                rows = conn.execute(query, {"hashes": chunk}).mappings().all()
            for row in rows:
                try:
                    full = self._with_payload(self._state(by_digest[row["key_hash"]], row))
                except CorruptRecord:
                    continue  # its waiters ask for themselves, and get the error
                if full is not None:  # changed meanwhile: its waiters ask for themselves
                    states.append(full)
        return states

    def versions(self, keys: Iterable[Key]) -> dict[str, int]:
        """The row version of each key that has a row: it changes with every write to the row.

        MySQL's watch hub asks this every ``watch_interval`` while anything is watched, so it runs
        prepared statements on a pooled cursor (0.09 ms of the client's CPU for one key, against 0.26
        ms for a Core statement compiled each time; measured on MariaDB, issue 20): one per size of
        ``IN`` list, a power of two up to :data:`IN_LIST`, the list padded with its first digest.
        """
        digests = [key.digest for key in keys]
        found: dict[str, int] = {}
        if not digests:
            return found

        def look(cursor: Any) -> None:
            for chunk in chunks(digests, IN_LIST):
                statement, size = self._versions_statement(len(chunk))
                padded = [*chunk, *[chunk[0]] * (size - len(chunk))]
                rows = statement.fetch_all(cursor, {f"p_h{i}": digest for i, digest in enumerate(padded)})
                found.update((str(row["key_hash"]), int(row["version"])) for row in rows)

        self._repeatable(look)
        return found

    def _versions_statement(self, count: int) -> tuple[Prepared, int]:
        """The versions query for ``count`` keys, and how many it takes (see :meth:`versions`)."""
        size = min(IN_LIST, 1 << max(0, count - 1).bit_length())
        statement = self._versions_by_size.get(size)
        if statement is None:
            t = self.t
            query = sa.select(t.c.key_hash, t.c.version).where(
                t.c.key_hash.in_([sa.bindparam(f"p_h{i}") for i in range(size)])
            )
            statement = self._versions_by_size[size] = Prepared(
                query, self.engine.dialect, ("key_hash", "version")
            )
        return statement, size

    def notify(self, payload: str) -> None:
        """PostgreSQL: ``NOTIFY`` the feed's channel with ``payload`` from a pooled connection (a
        listener's proof that it hears, see :class:`~dibs.stores.sql.feed.ListenFeed`)."""

        def send(cursor: Any) -> None:
            cursor.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, payload))

        self._repeatable(send)

    def change_feed(self) -> ChangeFeed:
        """PostgreSQL: one ``LISTEN`` connection; SQLite: ``data_version``; MySQL: a versions poll."""
        if self.dialect == "postgresql":
            return ListenFeed(self, self._listen_url)
        if self.dialect == "sqlite":
            return DataVersionFeed(self)
        return VersionsFeed(self, self.watch_interval)

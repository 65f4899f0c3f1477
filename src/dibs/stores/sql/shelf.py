"""The shelf: pooled connections a SQL store keeps checked out between calls, and :class:`PooledCursor`,
the one object that runs a call on one (the fork gate, a connection, the call's bound, a cursor, and
the error the call ended with, translated)."""

from __future__ import annotations

import builtins
import os
import time
import weakref
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine
from sqlalchemy.engine.interfaces import DBAPIModule

from dibs.errors import StoreUnavailable
from dibs.stores.sql.bounds import Keeper
from dibs.stores.sql.fork import GATE
from dibs.stores.sql.schema import refuses_writes

if TYPE_CHECKING:
    from dibs.stores.sql.pooler import ServerEnd

__all__ = ["SERVER_SHELF_SIZE", "SHELF_SIZE", "CursorSource", "PooledCursor", "shelve"]

#: How many connections a store keeps checked out of its pool between calls, for the next call (its
#: shelf, see :class:`PooledCursor`): SQLAlchemy's checkout and checkin cost 10-13 µs a call, a third of
#: SQLite's own time for a reserve + complete (issue 20). SQLite: a few (its pool, 5 + 10 overflow,
#: still bounds the rest). A server: one, the connection the keeper leaves open anyway (it trims every
#: idle pooled one while the shelf holds it). On PostgreSQL the checkout, checkin and its event cost
#: more there than on SQLite: keeping one cut a reserve + complete's client CPU by a fifth (issue 20).
#: The server pool is bounded (``pool_size``, no overflow), so a shelved connection is lent back:
#: a checkout that finds no idle one empties the shelf into the pool before it waits, and a call that
#: ends while a checkout waits gives its connection back rather than shelve it
#: (:class:`~dibs.stores.sql.bounds.PatientPool`); without that, with ``pool_size=1``, a batched read
#: after a single-key call waited out ``pool_timeout``.
SHELF_SIZE = 2
SERVER_SHELF_SIZE = 1


class CursorSource(Protocol):
    """What a :class:`PooledCursor` uses of its store (:class:`~dibs.stores.sql.store.SQLStore`, which
    imports this module, so this one names only what it needs)."""

    dialect: str
    engine: Engine
    server_end: ServerEnd | None
    _dbapi: DBAPIModule
    _shelf: builtins.list[Any] | None
    _shelf_size: int
    _recycle: float | None
    _keeper: Keeper | None

    def _ensure_ready(self) -> None: ...

    def _empty_shelf(self, shelf: builtins.list[Any] | None = None) -> None: ...

    def _sessions_mixed(self, exc: Exception) -> Exception: ...

    def _unavailable(
        self, exc: Exception, *, disconnected: bool = False, timed_out: bool = False
    ) -> StoreUnavailable: ...


class PooledCursor:
    """A call's cursor (:meth:`~dibs.stores.sql.store.SQLStore._cursor`): the fork gate (SQLite), a
    pooled connection, the call's bound and a cursor, entered and left by one object. Written out
    rather than as nested generator context managers: it runs twice for every reservation, and each
    generator layer cost a few microseconds, as much as the rest of the Python of an SQLite call
    (issue 20)."""

    __slots__ = ("_bound", "_connection", "_cursor", "_dbapi", "_gate", "_store", "_ticket")

    def __init__(self, store: CursorSource, bound: float) -> None:
        self._store = store
        self._bound = bound
        self._gate: Any = GATE if store.dialect == "sqlite" else None
        self._connection: Any = None
        self._cursor: Any = None
        self._ticket: int | None = None

    def __enter__(self) -> Any:
        store = self._store
        store._ensure_ready()
        gate = self._gate
        if gate is not None:
            gate.__enter__()
        try:
            dbapi = self._dbapi = store._dbapi
            connection = None
            shelf = store._shelf
            if shelf:  # a connection kept from an earlier call, past the pool
                # Not contextlib.suppress, which would build an object on every call.
                try:  # noqa: SIM105
                    connection = shelf.pop()
                except IndexError:  # another thread took the last one
                    pass
                if (
                    connection is not None
                    and store._recycle is not None
                    and _expired(connection, store._recycle)
                ):
                    connection.close()  # the pool replaces it on a later checkout (pool_recycle)
                    connection = None
                self._connection = connection
            if connection is None:
                try:
                    connection = self._connection = store.engine.raw_connection()
                except (dbapi.Error, sa_exc.TimeoutError) as exc:
                    # TimeoutError: every connection of the bounded pool stayed busy for pool_timeout.
                    raise store._unavailable(exc) from exc
            try:
                if store._keeper is not None:  # SQLite: no network; its busy timeout bounds lock waits
                    self._ticket = store._keeper.register(connection.dbapi_connection, self._bound)
                self._cursor = connection.cursor()
            except BaseException as exc:
                self._end(type(exc), exc)  # raises a database error translated
                raise
            return self._cursor
        except BaseException:
            if gate is not None:
                gate.__exit__(None, None, None)
            raise

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            self._end(exc_type, exc)
        finally:
            if self._gate is not None:
                self._gate.__exit__(None, None, None)

    def _end(self, exc_type: Any, exc: BaseException | None) -> None:
        """Give the connection back; a database error that ended the block is raised translated."""
        store, connection, cursor, dbapi = self._store, self._connection, self._cursor, self._dbapi
        ended = store._keeper.unregister(self._ticket) if store._keeper is not None else False
        error: BaseException | None = None
        try:
            server_end = store.server_end
            if (
                exc is not None
                and server_end is not None
                and not ended
                and isinstance(exc, dbapi.Error)
                and server_end.sessions_mixed(exc)
            ):
                connection.invalidate(exc)  # its prepared statements are psycopg's idea, not the server's
                error = store._sessions_mixed(exc)
            elif exc is not None and isinstance(exc, dbapi.Error):
                lost = ended or store.engine.dialect.is_disconnect(exc, connection, cursor)
                if lost:
                    connection.invalidate(exc)
                if lost and not ended:
                    # The server ended this connection (a restart, pg_terminate_backend): it will have
                    # ended the other idle ones too. Drop them all now, or each would fail one later call.
                    store._empty_shelf()
                    store.engine.dispose()
                if (
                    lost
                    or isinstance(exc, dbapi.OperationalError | dbapi.InterfaceError)
                    or refuses_writes(store.dialect, exc)
                ):
                    error = store._unavailable(exc, disconnected=lost and not ended, timed_out=ended)
                else:
                    dialect = store.engine.dialect
                    error = sa_exc.DBAPIError.instance(None, None, exc, dbapi.Error, dialect=dialect)
        finally:
            if cursor is not None:
                # Not contextlib.suppress, which would build an object on every call.
                try:  # noqa: SIM105
                    cursor.close()
                except dbapi.Error:
                    pass
            if ended and connection.dbapi_connection is not None:
                # The bound shut its socket just as the call succeeded: never hand it to the next call.
                connection.invalidate()
            shelf, pool = store._shelf, store.engine.pool
            # A server pool's checkouts that wait for a connection (PatientPool): one is given back.
            waiting = getattr(pool, "waiting", ())
            if (
                shelf is not None
                and exc is None
                and len(shelf) < store._shelf_size
                and connection.dbapi_connection is not None
                and connection._pool is pool  # not one of a pool disposed of meanwhile
                and not waiting
            ):
                shelf.append(connection)  # kept for the next call (a call that failed is not)
                # The store was closed meanwhile, or a checkout began to wait after the check above
                # (it may have emptied the shelf before this connection was on it).
                if store._shelf is not shelf or waiting:
                    store._empty_shelf(shelf)
            else:
                connection.close()
        if error is not None:
            raise error from exc


#: The SQL stores of the process, whose shelves a forked child empties (see ``_abandon_shelves``).
_SHELVES: weakref.WeakSet[Any] = weakref.WeakSet()
#: The parent's shelved connections, in a forked child: kept referenced, never used nor closed there
#: (closing an SQLite connection the parent still uses is what SQLite's docs warn against; a server
#: connection's socket is the parent's, as ``engine.dispose(close=False)`` leaves the pool's).
_ABANDONED: builtins.list[Any] = []


def _abandon_shelves() -> None:
    for store in list(_SHELVES):
        shelf = store._shelf
        if shelf:
            _ABANDONED.extend(shelf)
            shelf.clear()


os.register_at_fork(after_in_child=_abandon_shelves)


def shelve(store: CursorSource) -> None:
    """Keep ``store``'s shelf known to the process: a forked child abandons it (see ``_abandon_shelves``)."""
    _SHELVES.add(store)


def _expired(connection: Any, recycle: float) -> bool:
    """Whether a shelved pooled connection is older than the pool's ``pool_recycle``."""
    record = getattr(connection, "_connection_record", None)
    started = getattr(record, "starttime", None)
    return started is not None and time.time() - started > recycle

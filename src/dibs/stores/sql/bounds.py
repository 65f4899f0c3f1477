"""Bounds on the SQL store's server connections: how long one call may wait, and how many stay open.

Why a thread of our own, rather than driver options:

* **No call waits longer than its bound.** libpq (psycopg) has no client-side read timeout: a network
  that goes silent after a statement was sent (a dead proxy, a partitioned host) leaves the caller
  blocked until the kernel gives up on the TCP connection, minutes later; the server-side
  ``statement_timeout`` cannot help, since the server never hears of the statement. PyMySQL has socket
  timeouts, but fixed per connection, while a ``complete`` carrying a large artifact legitimately takes
  longer than a read. So each call on a pooled connection registers a deadline here, and when it
  passes, the connection's socket is shut down from this thread: the blocked driver call wakes at once
  with "connection lost", which the store reports as :class:`~dibs.errors.StoreUnavailable`. The same
  works for every driver that talks over a socket.
* **A waiting process keeps few connections.** SQLAlchemy's pool opens a connection whenever none is
  idle, and keeps every connection it ever opened: a process whose waiters once asked at the same
  moment kept three for good (four with the listener), and thirty such processes ran a server with
  ``max_connections = 100`` out of connections. Here (:class:`PatientPool`), a call that finds every
  open connection busy first waits :data:`PATIENCE` seconds for one to come back (a waiter's call
  takes a few milliseconds) before it opens another, and the keeper closes pooled connections beyond
  one that have been idle for :data:`IDLE_SECONDS`. So a process that only waits holds one pooled
  connection plus PostgreSQL's listener, and a busy one still grows to ``pool_size``.

One :class:`Keeper` per store, with one daemon thread started on first use (and again in a forked
child, where threads do not survive).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from sqlalchemy.pool import ConnectionPoolEntry, QueuePool
from sqlalchemy.util import queue as sqla_queue


class PatientPool(QueuePool):
    """A bounded pool that opens another connection only when the open ones stay busy for
    :data:`PATIENCE` seconds (see the module docstring), and that gets back the connection its store
    keeps between calls (the SQL store's shelf) whenever a checkout finds no idle one: a connection
    kept past a bounded pool would otherwise make a waiting checkout time out (issue 20)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # SQLAlchemy names a pool's logger after its class's module, which would put its messages
        # ("Pool disposed", ...) under the "dibs" logger: keep them under SQLAlchemy's own name.
        self.logger = logging.getLogger("sqlalchemy.pool.impl.QueuePool")  # type: ignore[assignment]
        #: The checkouts that found no idle connection and wait for one, one item each (list appends
        #: and removals are atomic): while any waits, a store gives a connection it would keep between
        #: calls (its shelf) back to the pool instead (see :mod:`dibs.stores.sql.shelf`).
        self.waiting: list[object] = []
        #: Gives the connections a store keeps between calls back to this pool (set by the store).
        self.lender: Callable[[], None] | None = None

    def recreate(self) -> PatientPool:
        """The pool that replaces this one (``engine.dispose()``): it lends from the same store."""
        pool = super().recreate()
        assert isinstance(pool, PatientPool)
        pool.lender = self.lender
        return pool

    def _do_get(self) -> ConnectionPoolEntry:
        # A connection idle in the pool is taken without waiting. Only a take that cannot block may
        # skip the count below: checking for an idle one and then waiting for it would let another
        # call take it in between, end while nobody is counted as waiting, and shelve it, and this
        # call would wait out pool_timeout for a connection kept idle (review of issue 20's shelf).
        with contextlib.suppress(sqla_queue.Empty):
            idle: ConnectionPoolEntry = self._pool.get(False)
            return idle
        # Counted as waiting before the store's shelf is emptied: a call that ends meanwhile either
        # sees this waiter and gives its connection back, or shelved it before, and the lender
        # below hands it over (the ordering the GIL gives these list operations).
        marker = object()
        self.waiting.append(marker)
        try:
            lender = self.lender
            if lender is not None:
                lender()
            return self._patient_get()
        finally:
            self.waiting.remove(marker)

    def _patient_get(self) -> ConnectionPoolEntry:
        opened = self._pool.maxsize + self._overflow  # QueuePool counts its overflow from -pool_size
        if opened > 0 and self._pool.empty():
            with contextlib.suppress(sqla_queue.Empty):
                entry: ConnectionPoolEntry = self._pool.get(True, PATIENCE)
                return entry
        return super()._do_get()


__all__ = ["IDLE_SECONDS", "PATIENCE", "Keeper", "PatientPool"]

#: Pooled connections beyond one are closed after being idle this long.
IDLE_SECONDS = 2.0
#: How long a call waits for a busy pooled connection before it opens another one.
PATIENCE = 0.25
_IDLE_SINCE = "dibs_idle_since"


class Keeper:
    """Deadlines of the calls in flight on one store's pool, and the trimming of its idle connections."""

    def __init__(
        self, engine: Any, *, idle_seconds: float = IDLE_SECONDS, shelved: Callable[[], bool] | None = None
    ) -> None:
        self._engine = weakref.ref(engine)
        self._idle_seconds = idle_seconds
        #: Whether the store keeps a connection checked out between calls (its shelf): that one is the
        #: connection left open, so every idle pooled one may be closed.
        self._shelved = shelved or (lambda: False)
        # A plain lock that the calls enter directly (C code: every call of the store registers and
        # unregisters), and the thread's condition on it.
        self._mutex = threading.Lock()
        self._lock = threading.Condition(self._mutex)
        # ticket -> (deadline, socket file descriptor, the connection it must still belong to)
        self._calls: dict[int, tuple[float, int, Callable[[], Any]]] = {}
        self._ended: set[int] = set()
        self._next_ticket = 0
        self._thread: threading.Thread | None = None
        self._closed = False
        self._trim_at: float | None = None
        # When the thread wakes next: a new deadline or trim wakes it earlier only if it is sooner
        # (a call registers without waking the thread, in the usual case).
        self._wake_at = 0.0
        _KEEPERS.add(self)

    # -- deadlines ------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def bounded(self, dbapi_connection: Any, seconds: float) -> Iterator[list[bool]]:
        """Shut ``dbapi_connection``'s socket down if the block has not ended within ``seconds``.

        Yields a one-item list that is ``[True]`` afterwards when the deadline ended the call (the
        caller then reports a timeout rather than a lost connection).
        """
        ended = [False]
        ticket = self.register(dbapi_connection, seconds)
        try:
            yield ended
        finally:
            ended[0] = self.unregister(ticket)

    def register(self, dbapi_connection: Any, seconds: float) -> int | None:
        """:meth:`bounded` without a generator (the SQL store's every call; see :mod:`dibs.stores.sql.shelf`):
        the call's ticket for :meth:`unregister`, ``None`` if the connection has no socket."""
        fileno = _fileno(dbapi_connection)
        if fileno is None:  # not a socket (SQLite): nothing to bound here
            return None
        with self._mutex:
            self._start()
            ticket = self._next_ticket = self._next_ticket + 1
            deadline = time.monotonic() + seconds
            self._calls[ticket] = (deadline, fileno, _ref(dbapi_connection))
            if deadline < self._wake_at:
                self._lock.notify()
        return ticket

    def unregister(self, ticket: int | None) -> bool:
        """End a call that :meth:`register` began: whether its deadline had shut its connection."""
        if ticket is None:
            return False
        with self._mutex:
            # Under the lock: once unregistered, the thread never touches this socket again.
            self._calls.pop(ticket, None)
            if ticket in self._ended:
                self._ended.discard(ticket)
                return True
        return False

    def _after_fork_in_child(self) -> None:
        """The child has none of the parent's threads or calls: it must not shut the sockets it
        shares with the parent (their calls are the parent's), nor wait on a lock a parent thread held."""
        self._mutex = threading.Lock()
        self._lock = threading.Condition(self._mutex)
        self._calls = {}
        self._ended = set()
        self._thread = None
        self._trim_at = None
        self._wake_at = 0.0

    # -- idle connections -----------------------------------------------------------------------------
    def returned(self, connection_record: Any) -> None:
        """A connection went back to the pool: note when, and trim the idle ones later."""
        now = time.monotonic()
        connection_record.info[_IDLE_SINCE] = now
        with self._mutex:
            self._start()
            if self._trim_at is None:
                self._trim_at = now + self._idle_seconds
                if self._trim_at < self._wake_at:
                    self._lock.notify()

    def _trim(self) -> bool:
        """Close idle pooled connections beyond one (or all, while the store keeps one on its shelf)
        that have been idle long enough; ``True`` while others remain that may be closed later."""
        pool = getattr(self._engine(), "pool", None)
        if not isinstance(pool, QueuePool):  # SQLite's own pool: nothing to trim
            return False
        queue: Any = pool._pool  # sqlalchemy.util.queue.Queue: its mutex and deque are what we need
        now = time.monotonic()
        with queue.mutex:
            # LIFO pool: the most recently returned connection (the last) is the one kept, unless the
            # store keeps one of its own between calls.
            idle = list(queue.queue)
            candidates = idle if self._shelved() else idle[:-1]
            stale = [r for r in candidates if now - r.info.get(_IDLE_SINCE, now) >= self._idle_seconds]
            for record in stale:
                queue.queue.remove(record)
        for record in stale:
            pool._dec_overflow()  # the pool may open another in its place when it needs one
            with contextlib.suppress(Exception):
                record.close()
        return len(candidates) > len(stale)

    # -- the thread -----------------------------------------------------------------------------------
    def _start(self) -> None:
        """Start the thread if it is not running (first use, or a forked child). Holds the lock.

        Every call of the store passes here: the thread clears ``_thread`` under the lock as it ends
        (see :meth:`_run`), so this is one attribute check, not ``Thread.is_alive()`` (~1 µs)."""
        if self._closed or self._thread is not None:
            return
        thread = threading.Thread(target=self._run, name="dibs-sql-keeper", daemon=True)
        # Kept only once started: a thread that could not start (a thread limit reached) leaves none,
        # and the next call tries again. It cannot end and clear itself first: that takes the lock.
        thread.start()
        self._thread = thread

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify()  # the thread ends at once

    def _run(self) -> None:
        try:
            self._keep()
        finally:
            with self._mutex:  # a later call starts another (unless closed)
                if self._thread is threading.current_thread():
                    self._thread = None

    def _keep(self) -> None:
        while True:
            with self._lock:
                if self._closed or self._engine() is None:
                    return
                now = time.monotonic()
                for ticket, (deadline, fileno, connection) in list(self._calls.items()):
                    if deadline <= now:
                        del self._calls[ticket]
                        self._ended.add(ticket)
                        # Only if the number is still that connection's socket: a driver that
                        # closed its socket in the call may see the number reused by another.
                        if _fileno(connection()) == fileno:
                            _shut_down(fileno)
                trim = self._trim_at is not None and self._trim_at <= now
                if trim:
                    self._trim_at = None
                wakes = [deadline for deadline, _, _ in self._calls.values()]
                if self._trim_at is not None:
                    wakes.append(self._trim_at)
                if not trim:
                    # At most a minute: a store dropped without close() lets the thread end.
                    self._wake_at = min([*wakes, now + 60.0])
                    self._lock.wait(timeout=max(0.0, self._wake_at - now))
                    continue
            if self._trim():  # outside the lock: it takes the pool's own lock
                with self._lock:
                    if self._trim_at is None:
                        self._trim_at = time.monotonic() + self._idle_seconds


def _ref(connection: Any) -> Callable[[], Any]:
    """A weak reference to ``connection`` where it allows one (else a strong one, for the call's life)."""
    try:
        return weakref.ref(connection)
    except TypeError:
        return lambda: connection


_KEEPERS: weakref.WeakSet[Keeper] = weakref.WeakSet()


def _reset_keepers_in_child() -> None:
    for keeper in list(_KEEPERS):
        keeper._after_fork_in_child()


os.register_at_fork(after_in_child=_reset_keepers_in_child)


def _fileno(dbapi_connection: Any) -> int | None:
    """The socket of a DBAPI connection: psycopg's ``fileno()``, PyMySQL's ``_sock``.

    Every bounded call asks (see :meth:`Keeper.register`): psycopg's case is looked for first, with
    one attribute lookup that finds something, and no ``contextlib.suppress`` object is built."""
    try:
        if getattr(dbapi_connection, "pgconn", None) is not None:
            return int(dbapi_connection.fileno())
        sock = getattr(dbapi_connection, "_sock", None)
        return None if sock is None else int(sock.fileno())
    except Exception:  # closed, or a driver without a socket
        return None


def _shut_down(fileno: int) -> None:
    """Shut the socket down for both directions: a driver blocked reading or writing wakes at once
    with a lost connection. A duplicate descriptor is used, so the driver's own stays valid (and is
    closed by the driver); the shutdown applies to the socket both share."""
    with contextlib.suppress(OSError):
        duplicate = socket.socket(fileno=os.dup(fileno))
        try:
            duplicate.shutdown(socket.SHUT_RDWR)
        finally:
            duplicate.close()

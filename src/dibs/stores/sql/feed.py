"""The SQL store's change feeds, which wake the process's watch hub (:mod:`dibs.stores.feeds`):
PostgreSQL's ``LISTEN``/``NOTIFY`` (:class:`ListenFeed`), SQLite's ``data_version``
(:class:`DataVersionFeed`) and, for MySQL/MariaDB, a versions poll (:class:`VersionsFeed`).
"""

from __future__ import annotations

import collections
import contextlib
import math
import secrets
import time
from collections.abc import Collection, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.engine.url import URL

from dibs.errors import CorruptRecord, StoreUnavailable
from dibs.keys import Key
from dibs.records import KeyState
from dibs.stores import _inotify, redact_url
from dibs.stores.feeds import ChangeFeed, PollingFeed, Unheard
from dibs.stores.sql.engine import server_bounds
from dibs.stores.sql.fork import GATE
from dibs.stores.sql.pooler import ServerEnd
from dibs.stores.sql.schema import NOTIFY_CHANNEL
from dibs.stores.sql.statements import IN_LIST, chunks


class FeedSource(Protocol):
    """What a feed uses of its store (:class:`~dibs.stores.sql.store.SQLStore`, which imports this
    module, so this one names only what it needs)."""

    engine: Engine
    timeout: float
    feed_may_read: bool
    t: sa.Table
    _url: URL
    server_end: ServerEnd | None

    def versions(self, keys: Iterable[Key]) -> dict[str, int]: ...

    def notify(self, payload: str) -> None: ...

    def _ensure_ready(self) -> None: ...

    def _read(self, cursor: Any, key: Key) -> tuple[KeyState, int | None]: ...

    def _with_payload(self, state: KeyState) -> KeyState | None: ...

    def _bounded(
        self, dbapi_connection: Any, seconds: float
    ) -> contextlib.AbstractContextManager[list[bool]]: ...

    def _unavailable(self, exc: Exception) -> StoreUnavailable: ...


def _whole(source: FeedSource, state: KeyState, version: int | None) -> list[KeyState]:
    """A feed's read of one key as the hub hands it on: with its artifact's bytes, which the read
    leaves out when they are large (read apart, on the store's pooled connections, after the feed's
    connection is free again); nothing when the key has no row, or holds another artifact by now
    (its waiters then ask for themselves)."""
    full = None if version is None else source._with_payload(state)
    return [] if full is None else [full]


class VersionsFeed(PollingFeed):
    """MySQL/MariaDB have no notifications: one query for the versions of every watched row per look,
    for the whole process, instead of every waiter asking for itself.

    It looks every ``watch_interval`` (the URL's ``?watch_interval=``, 25 ms by default), whatever the
    number of waiters, for as long as any waiter of the process waits: 40 indexed queries a second,
    each 0.02-0.05 ms of the server's CPU for one key (MariaDB, issue 20). It used to stretch the pause
    to a second while nothing changed, and a key completed 20 s after its 1,000 waiters arrived reached
    them after 0.4-0.5 s; with 50 ms, after 60-66 ms (the hand-off goal is 50). A longer
    ``watch_interval`` lets the pause grow from 25 ms to it instead. Many keys stretch the pause too
    (:attr:`per_key`): 1,000 keys are looked at every 50 ms, 2.6 ms of the server's CPU each time.
    """

    min_interval = 0.025
    max_interval = 0.025
    #: A look at 1,000 keys takes ~3 ms of the server's CPU and ~3 ms of this process's: the pause is
    #: at least 50 µs per watched key, so following many keys never costs more than a few percent of a core.
    per_key = 0.00005

    def __init__(self, store: FeedSource, watch_interval: float | None = None) -> None:
        super().__init__()
        self._store = store
        if watch_interval is not None:
            self.max_interval = watch_interval
            self.min_interval = min(type(self).min_interval, watch_interval)
            self._interval = self.min_interval

    def tokens(self, keys: Iterable[Key]) -> Mapping[str, Hashable]:
        return self._store.versions(keys)


class DataVersionFeed(VersionsFeed):
    """SQLite has no notifications, but in WAL mode ``PRAGMA data_version`` is read from shared memory
    without touching the disk, and changes whenever another connection commits. It is read on a
    connection of its own (outside the pool), and only a change costs the versions query, on that
    connection too.

    When to look: on Linux, when the database's ``-wal`` file is written (an inotify watch,
    :mod:`dibs.stores._inotify`): every commit in WAL mode writes it, and every process of a WAL
    database is on this host, so the watch hears every commit at once. The write comes before the
    commit is visible (SQLite publishes it in shared memory afterwards, after an fsync with
    ``synchronous=FULL``), so looks follow every :data:`POLL` seconds for :data:`FOLLOW` seconds after
    the last write, and a look every :data:`BACKSTOP` seconds catches what the watch may miss. Without a
    watch (another platform, the watch limit reached, not WAL), a look every :data:`POLL` seconds.
    """

    #: Seconds between looks without a watch, and at most while following a write.
    POLL = 0.004
    #: Seconds between looks while the watch hears nothing: only for what it could miss (a queue
    #: overflow). Rare, so slow: 10 looks a second instead of 250, and a missed commit costs a
    #: waiter 0.1 s at worst, not its own backstop question's seconds.
    BACKSTOP = 0.1
    #: Seconds after a write of the ``-wal`` file during which looks stay frequent (the commit shows
    #: in ``data_version`` after the write: at once, or after the WAL's fsync).
    FOLLOW = 0.1
    #: The first look after a write that found nothing new follows it this soon, then twice as late
    #: each time, up to :data:`POLL`.
    FIRST_STEP = 0.0005
    #: Seconds at least between two looks: every commit to the database (to any table, by any
    #: process) writes the ``-wal`` file, and a look per write would cost an idle waiting process CPU
    #: in proportion to the database's write rate (4,500 looks a second beside a writer committing
    #: 4,400 rows a second, 12 times the CPU of polling). Writes heard within the gap are taken
    #: together by the next look, so looks stay under 1,000 a second; the first write after a quiet
    #: spell is still looked at as soon as it is heard.
    MIN_GAP = 0.001

    min_interval = max_interval = POLL
    per_key = 0.0

    def __init__(self, store: FeedSource) -> None:
        super().__init__(store)
        self._conn: Any = None
        self._version: int | None = None
        self._versions_sql: dict[int, str] = {}  # by the number of keys asked for
        self._watch: _inotify.FileWatch | None = None
        self._written = -math.inf  # when the watch last heard a write
        self._step = self.FIRST_STEP
        #: What prompted each look that found a commit: ``"inotify"`` (the ``-wal`` file was written,
        #: or a look following such a write), ``"backstop"`` (the watch missed it) or ``"poll"`` (no
        #: watch). For tests and benchmarks.
        self.woken_by: collections.Counter[str] = collections.Counter()
        #: How many times the watch woke the feed (a write, a creation of the ``-wal`` file).
        self.inotify_wakeups = 0
        #: How many times the feed looked at ``data_version``, changed or not (for tests).
        self.looks = 0
        self._looked = -math.inf  # when the feed last looked

    @property
    def watching(self) -> bool:
        """Whether an inotify watch says when to look (else the feed looks every :data:`POLL` s)."""
        return self._watch is not None and not self._watch.closed

    def open(self) -> None:
        store = self._store
        store._ensure_ready()
        try:
            cargs, cparams = store.engine.dialect.create_connect_args(store.engine.url)
            cparams["check_same_thread"] = False  # the hub may close it from another thread
            with GATE.inside():
                self._conn = store.engine.dialect.connect(*cargs, **cparams)
            wal = self._wal_path()
            # the watch before the first look: a commit in between is seen by the look
            self._watch = None if wal is None else _inotify.watch(wal)
            self._version = self._data_version()
        except store.engine.dialect.loaded_dbapi.Error as exc:
            self.close()
            raise store._unavailable(exc) from exc
        self._set_interval(self.BACKSTOP if self._watch is not None else self.POLL)

    def _set_interval(self, seconds: float) -> None:
        self.min_interval = self.max_interval = self._interval = seconds

    def _wal_path(self) -> str | None:
        """The ``-wal`` file of the main database, as SQLite names it; ``None`` if not in WAL mode or
        not a file."""
        with GATE.inside():
            cursor = self._conn.cursor()
            try:
                cursor.execute("PRAGMA journal_mode")
                if str(cursor.fetchone()[0]).lower() != "wal":
                    return None
                cursor.execute("PRAGMA database_list")
                files = {str(row[1]): str(row[2] or "") for row in cursor.fetchall()}
            finally:
                cursor.close()
        main = files.get("main", "")
        return f"{main}-wal" if main else None

    def _data_version(self) -> int:
        with GATE.inside():  # no fork in the middle of it (see dibs.stores.sql.fork)
            cursor = self._conn.cursor()
            try:
                cursor.execute("PRAGMA data_version")
                return int(cursor.fetchone()[0])
            finally:
                cursor.close()

    def wake(self) -> None:
        super().wake()
        watch = self._watch
        if watch is not None:
            watch.poke()

    def probe(self, timeout: float) -> bool:
        reason = self._wait(timeout)
        try:
            version = self._data_version()
        except self._store.engine.dialect.loaded_dbapi.Error as exc:
            raise self._store._unavailable(exc) from exc
        self._looked = time.monotonic()
        self.looks += 1
        changed, self._version = version != self._version, version
        if changed:
            self.woken_by[reason] += 1
        return changed

    def _wait(self, timeout: float) -> str:
        """Wait until it is time to look (see the class docstring); what prompted the look."""
        watch = self._watch
        if watch is not None and watch.closed:  # its folder is gone: look on our own
            self._watch = None
            watch.close()
            self._set_interval(self.POLL)
            watch = None
        if watch is None:
            self.pause(timeout)
            return "poll"
        gap = min(self._looked + self.MIN_GAP - time.monotonic(), timeout)
        if gap > 0:  # too soon after the last look: writes heard meanwhile wait for the next one
            watch.hold(gap)
            timeout = max(0.0, timeout - gap)
        following = time.monotonic() - self._written < self.FOLLOW
        if watch.wait(min(timeout, self._step) if following else timeout):
            self.inotify_wakeups += 1
            self._written, self._step = time.monotonic(), self.FIRST_STEP
            return "inotify"
        if following:
            self._step = min(self._step * 2, self.POLL)
            return "inotify"
        return "backstop"

    def tokens(self, keys: Iterable[Key]) -> Mapping[str, Hashable]:
        # The store's versions() builds and compiles a Core statement and takes a pooled connection
        # each time: ~0.7 ms of the hand-off right after every commit (issue 20). Here the SQL is
        # written once per number of keys and runs on the feed's own connection, which is idle now.
        found: dict[str, int] = {}
        try:
            with GATE.inside():
                cursor = self._conn.cursor()
                try:
                    for chunk in chunks([key.digest for key in keys], IN_LIST):
                        cursor.execute(self._versions_query(len(chunk)), chunk)
                        found.update((str(digest), int(version)) for digest, version in cursor.fetchall())
                finally:
                    cursor.close()
        except self._store.engine.dialect.loaded_dbapi.Error as exc:
            raise self._store._unavailable(exc) from exc
        return found

    def read_many(self, store: object, keys: Sequence[Key]) -> list[KeyState] | None:
        """One key (a hand-off) is read on the feed's own connection, idle right after its look, with
        the store's prepared read: no pooled connection checked out and returned (the pooled read
        took ~0.3 ms of a ~1.5 ms hand-off, this one ~0.15; issue 20). Several keys, or any failure:
        the store reads."""
        source = self._store
        if store is not source or len(keys) != 1 or self._conn is None or not source.feed_may_read:
            return None
        try:
            with GATE.inside():
                cursor = self._conn.cursor()
                try:
                    state, version = source._read(cursor, keys[0])
                finally:
                    cursor.close()
        except CorruptRecord:
            return []  # its waiters ask for themselves, and get the error
        except source.engine.dialect.loaded_dbapi.Error:
            return None
        return _whole(source, state, version)

    def _versions_query(self, count: int) -> str:
        sql = self._versions_sql.get(count)
        if sql is None:
            t = self._store.t
            table = self._store.engine.dialect.identifier_preparer.format_table(t)
            marks = ", ".join("?" * count)
            sql = self._versions_sql[count] = (
                f"SELECT key_hash, version FROM {table} WHERE key_hash IN ({marks})"
            )
        return sql

    def close(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.close()
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception), GATE.inside():
                conn.close()


class ListenFeed(ChangeFeed):
    """``LISTEN`` on one connection of its own: a trigger on the table notifies the digest of every key
    whose lease ends or whose artifact appears, and this one connection hears them for the process.

    The connection is outside the store's pool, and it is the only extra one: with the pool's default
    of three, a process holds at most four connections, however many waiters it has. It goes to the
    store's URL, or to ``?listen_url=`` when given: a transaction pooler (PgBouncer's ``pool_mode =
    transaction``) hands the session that ran ``LISTEN`` to other clients as soon as the statement
    ends, so the listener hears nothing there, and the one listening connection must reach the server
    itself (or a session pooler) instead; the pool's connections still go through the pooler.

    **A listener proves that it hears.** After ``LISTEN`` (when it opens, so after every reconnection
    too) it has a pooled connection of the store send it a ``NOTIFY`` (a pooled one: its own ``NOTIFY``
    could be served by its own server session and prove nothing), and waits for it up to the store's
    ``timeout``. Unheard, it raises :class:`~dibs.stores.feeds.Unheard`: the hub does not count as
    following, so waiters poll, one warning says why and what to set, and the hub tries again after
    :data:`RETRY_UNHEARD` seconds. A store that says it is behind a transaction pooler
    (``?pooler=transaction``) and has no ``listen_url`` does not even try (a ``LISTEN`` left behind
    on a pooled session makes PgBouncer log every notification as an unexpected packet).
    """

    #: Seconds before a listener that did not hear its proof is opened again (see the class docstring).
    RETRY_UNHEARD = 300.0
    #: The start of a proof's payload: no key's digest (lowercase hex) starts so, and every listener of
    #: the database hears the channel, so each leaves the others' proofs aside.
    PROOF = "dibs-proof:"

    def __init__(self, store: FeedSource, listen_url: str | None = None) -> None:
        self._store = store
        self._listen_url = listen_url
        self._conn: Any = None
        #: What the listening connection reaches: the store's own (its pool's URL), or the listen URL's.
        self._server_end: ServerEnd | None = store.server_end
        if listen_url is not None:
            options = make_url(listen_url).query.get("options")
            self._server_end = ServerEnd(
                None, f"listen_url={redact_url(listen_url)}", str(options) if options else None
            )
        #: How many key notifications it heard, and how many proofs (for tests and benchmarks).
        self.heard = 0
        self.proofs = 0

    def open(self) -> None:
        import psycopg

        store = self._store
        store._ensure_ready()  # the trigger that notifies is created with the schema
        end = self._server_end
        if self._listen_url is None and end is not None and end.declared == "transaction":
            raise Unheard(
                "it cannot listen through a transaction pooler (?pooler=transaction: the pooler hands the "
                "session that runs LISTEN to other clients); add ?listen_url=postgresql://USER:PASSWORD@"
                "SERVER:5432/DB, the PostgreSQL server itself, for the process's one listening connection",
                self.RETRY_UNHEARD,
            )
        url = store._url if self._listen_url is None else make_url(self._listen_url)
        conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
        with self._closed_on_error():
            # The pool's connection bounds too: a connection attempt gives up after the store's timeout,
            # and keepalives notice a server that vanished while the listener only waits.
            bounds = server_bounds(url, store.timeout)

            def connect(params: dict[str, Any]) -> Any:
                return psycopg.connect(conninfo, autocommit=True, **params)

            self._conn = connect(bounds) if end is None else end.connect(connect, bounds)
            self._conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
        self._prove()

    @contextlib.contextmanager
    def _closed_on_error(self) -> Iterator[None]:
        """Whatever fails in the block closes the listening connection: a driver's error goes on as
        :class:`StoreUnavailable` (naming the listen URL), anything else as it is."""
        import psycopg

        try:
            yield
        except psycopg.Error as exc:
            self.close()
            raise self._unavailable(exc) from exc
        except BaseException:
            self.close()
            raise

    def _unavailable(self, exc: Exception) -> StoreUnavailable:
        error = self._store._unavailable(exc)
        if self._listen_url is None:
            return error
        return StoreUnavailable(
            f"{error} (on the LISTEN connection, listen_url={redact_url(self._listen_url)})",
            store=getattr(error, "store", None),
        )

    def _prove(self) -> None:
        """Hear a ``NOTIFY`` sent from a pooled connection within the store's timeout, or raise
        :class:`~dibs.stores.feeds.Unheard` (see the class docstring)."""
        store, proof = self._store, f"{self.PROOF}{secrets.token_hex(8)}"
        heard = False
        with self._closed_on_error():
            store.notify(proof)
            for notify in self._conn.notifies(timeout=store.timeout):
                # Anything else heard meanwhile is left: the hub reads every watched key after open().
                if notify.payload == proof:
                    heard = True
                    break
        if heard:
            self.proofs += 1
            return
        self.close()
        end = self._server_end
        if self._listen_url is not None:
            why = (
                f"its LISTEN connection (listen_url={redact_url(self._listen_url)}) did not hear a NOTIFY "
                f"sent through the store's URL within {store.timeout:g} s: listen_url must reach the same "
                "database, on the PostgreSQL server itself (or a session pooler)"
            )
        elif end is not None and end.pooled:
            why = (
                f"its LISTEN connection did not hear a NOTIFY sent from another connection within "
                f"{store.timeout:g} s, and the server end is {end.why}: a transaction pooler (PgBouncer's "
                "pool_mode = transaction) hands the session that listens to other clients. Add "
                "?listen_url=postgresql://USER:PASSWORD@SERVER:5432/DB, the PostgreSQL server itself, for "
                "the process's one listening connection (or pool sessions: pool_mode = session)"
            )
        else:
            why = (
                f"its LISTEN connection did not hear a NOTIFY sent from another connection within "
                f"{store.timeout:g} s (a pooler in between that passes startup options on? then add "
                "?pooler=transaction and ?listen_url= to the URL, see docs/deploy.md)"
            )
        raise Unheard(why, self.RETRY_UNHEARD)

    def changes(self, watched: Mapping[str, Key], timeout: float) -> Collection[str]:
        import psycopg

        assert self._conn is not None, "open() first"
        digests: set[str] = set()
        try:
            for notify in self._conn.notifies(timeout=timeout, stop_after=1):
                digests.add(notify.payload)
            if digests:  # take what else is queued already: a burst is one round of reads
                # timeout 0: what has arrived, without waiting (a 1 ms wait here delayed every hand-off)
                for notify in self._conn.notifies(timeout=0.0, stop_after=IN_LIST):
                    digests.add(notify.payload)
        except psycopg.Error as exc:
            raise self._unavailable(exc) from exc
        proofs = [digest for digest in digests if digest.startswith(self.PROOF)]
        digests.difference_update(proofs)  # other listeners' proofs, on the channel they share
        self.heard += len(digests)
        return digests

    def read_many(self, store: object, keys: Sequence[Key]) -> list[KeyState] | None:
        """One key (a hand-off) is read on the ``LISTEN`` connection, whose server process has just
        sent the notification and is awake, with the store's prepared read: no pooled connection,
        and one server process less to wake per waiting process. Several keys go through the store.

        Any failure leaves the read to the store; a broken connection then fails the next
        :meth:`changes`, and the hub listens again.
        """
        import psycopg

        if store is not self._store or len(keys) != 1 or self._conn is None or not self._store.feed_may_read:
            return None
        key, source = keys[0], self._store
        try:
            with source._bounded(self._conn, source.timeout), self._conn.cursor() as cursor:
                state, version = source._read(cursor, key)
        except CorruptRecord:
            return []  # its waiters ask for themselves, and get the error
        except psycopg.Error:
            return None
        return _whole(source, state, version)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

"""The SQL store keeps pooled connections checked out between calls (its shelf: a few on SQLite, one
on a server), past SQLAlchemy's checkout and checkin (issue 20); these are the rules that keep that
safe, a server's bounded pool getting its connection back whenever a checkout needs it."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dibs.keys import Key
from dibs.stores import open_store
from dibs.stores.sql import shelf as sql_shelf
from dibs.stores.sql.store import SQLStore


def _store(tmp_path: Path) -> SQLStore:
    store = open_store(f"sqlite:///{tmp_path}/dibs.db")
    assert isinstance(store, SQLStore)
    return store


def _dbapi(store: SQLStore) -> sqlite3.Connection:
    with store._cursor() as cursor:
        connection: sqlite3.Connection = cursor.connection
        return connection


@contextlib.contextmanager
def _one_connection_server_store(tmp_path: Path) -> Iterator[SQLStore]:
    """A PostgreSQL store (skipped, or failed in CI, without a server) whose bounded pool holds one
    connection: the one its shelf keeps between calls, or lends back to a waiting checkout."""
    from tests.scale import tagged_url

    with tagged_url("postgres", tmp_path) as (url, _tag):
        store = SQLStore(f"{url}&pool_size=1" if "?" in url else f"{url}?pool_size=1", pool_timeout=5)
        try:
            yield store
        finally:
            store.close()


def test_a_call_leaves_its_connection_for_the_next(tmp_path: Path) -> None:
    store = _store(tmp_path)
    try:
        store.read(Key("ns", "a"))
        first = _dbapi(store)
        assert _dbapi(store) is first
        assert store.engine.pool.checkedout() == 1  # type: ignore[attr-defined]  # the kept one
    finally:
        store.close()


def test_close_closes_the_kept_connections(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.read(Key("ns", "a"))
    kept = _dbapi(store)
    store.close()
    with pytest.raises(sqlite3.ProgrammingError):
        kept.execute("SELECT 1")
    assert store.engine.pool.checkedout() == 0  # type: ignore[attr-defined]


def test_a_call_that_failed_gives_its_connection_back(tmp_path: Path) -> None:
    store = _store(tmp_path)
    try:
        store.read(Key("ns", "a"))
        with pytest.raises(RuntimeError), store._cursor():
            raise RuntimeError("the operation failed")
        assert store._shelf == []
        assert store.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    finally:
        store.close()


def test_few_connections_are_kept_however_many_threads_called(tmp_path: Path) -> None:
    store = _store(tmp_path)
    try:
        store.read(Key("ns", "a"))
        inside, leave = threading.Barrier(5), threading.Event()

        def call() -> None:
            with store._cursor():
                inside.wait(10)
                leave.wait(10)

        threads = [threading.Thread(target=call) for _ in range(4)]
        for thread in threads:
            thread.start()
        inside.wait(10)  # four calls at once, each on its own connection
        leave.set()
        for thread in threads:
            thread.join(10)
        assert store._shelf is not None and len(store._shelf) == sql_shelf.SHELF_SIZE
        assert store.engine.pool.checkedout() == sql_shelf.SHELF_SIZE  # type: ignore[attr-defined]
    finally:
        store.close()


@pytest.mark.skipif(sys.platform == "win32", reason="fork is POSIX")
def test_a_forked_child_never_uses_the_parents_kept_connections(tmp_path: Path) -> None:
    store = _store(tmp_path)
    try:
        store.read(Key("ns", "a"))
        parents = id(_dbapi(store))
        reading, writing = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its first call opens a connection of its own
            try:
                shelf_was_empty = store._shelf == []
                state = store.read(Key("ns", "a"))
                own = id(_dbapi(store)) != parents
                os.write(writing, b"ok" if shelf_was_empty and own and state.lease is None else b"no")
            finally:
                os._exit(0)
        os.close(writing)
        answer = os.read(reading, 2)
        os.close(reading)
        os.waitpid(pid, 0)
        assert answer == b"ok"
        assert id(_dbapi(store)) == parents  # the parent's is still its own, and still works
    finally:
        store.close()


def test_a_server_store_lends_its_kept_connection_to_a_checkout_that_needs_it(tmp_path: Path) -> None:
    # A server store's pool is bounded (pool_size, no overflow) and waits patiently for a busy
    # connection, so the one connection it keeps between calls must go back to the pool whenever a
    # checkout needs it: with pool_size=1 a batched read (through the pool) after a single-key call,
    # and four threads taking turns on the one connection, each waited out pool_timeout and failed
    # while the store simply kept it.
    with _one_connection_server_store(tmp_path) as store:
        store.read(Key("ns", "a"))
        assert store._shelf is not None and len(store._shelf) == 1  # kept for the next call
        assert store.read_many([Key("ns", "a"), Key("ns", "b")]) == []  # lent to the pool
        done: list[object] = []
        inside, leave = threading.Barrier(2), threading.Event()

        def call() -> None:
            done.append(store.read(Key("ns", "b")))

        def hold() -> None:
            with store._cursor():
                inside.wait(10)
                leave.wait(10)

        holder = threading.Thread(target=hold)
        holder.start()
        inside.wait(10)  # the one connection is busy: the calls below wait for it
        threads = [threading.Thread(target=call) for _ in range(4)]
        for thread in threads:
            thread.start()
        leave.set()
        for thread in [holder, *threads]:
            thread.join(60)
        # One connection served four threads in turn (a thread that failed appended nothing).
        assert len(done) == 4 and all(getattr(state, "lease", None) is None for state in done)
        assert store.engine.pool.checkedout() <= 1  # type: ignore[attr-defined]  # the kept one


def test_a_checkout_that_finds_its_idle_connection_taken_is_still_served(tmp_path: Path) -> None:
    # The window of a lost wake-up: a checkout sees the one connection idle, another call takes it
    # first and, ending while nobody is counted as waiting, keeps it on its shelf; the checkout must
    # still get it (it waited out pool_timeout and failed when it found "idle" and then blocked).
    with _one_connection_server_store(tmp_path) as store:
        assert store.read_many([Key("ns", "a"), Key("ns", "b")]) == []  # idle in the pool now
        queue = store.engine.pool._pool  # type: ignore[attr-defined]
        taking, taken = threading.Event(), threading.Event()
        late: list[threading.Thread] = []
        get = queue.get

        def slow_get(*args: object, **kwargs: object) -> object:
            if late and threading.current_thread() is late[0] and not taking.is_set():
                taking.set()  # the checkout is about to take the idle connection ...
                taken.wait(10)  # ... and another call takes it first, and ends
            return get(*args, **kwargs)

        queue.get = slow_get
        result: list[object] = []
        thread = threading.Thread(target=lambda: result.append(store.read(Key("ns", "b"))))
        late.append(thread)
        thread.start()
        assert taking.wait(10)
        store.read(Key("ns", "a"))  # takes the idle connection, ends, keeps it
        taken.set()
        thread.join(30)
        assert len(result) == 1 and getattr(result[0], "lease", None) is None

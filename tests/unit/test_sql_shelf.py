"""The SQLite store keeps a few pooled connections checked out between calls (its shelf), past
SQLAlchemy's checkout and checkin (issue 20); these are the rules that keep that safe."""

from __future__ import annotations

import os
import sqlite3
import sys
import threading
import time
from pathlib import Path

import pytest

from dibs.keys import Key
from dibs.stores import open_store
from dibs.stores.sql import store as sql_store
from dibs.stores.sql.store import SQLStore


def _store(tmp_path: Path) -> SQLStore:
    store = open_store(f"sqlite:///{tmp_path}/dibs.db")
    assert isinstance(store, SQLStore)
    return store


def _dbapi(store: SQLStore) -> sqlite3.Connection:
    with store._cursor() as cursor:
        connection: sqlite3.Connection = cursor.connection
        return connection


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
        assert store._shelf is not None and len(store._shelf) == sql_store._SHELF_SIZE
        assert store.engine.pool.checkedout() == sql_store._SHELF_SIZE  # type: ignore[attr-defined]
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


def test_a_server_store_keeps_one_and_its_keeper_trims_every_idle_pooled_one(tmp_path: Path) -> None:
    # A PostgreSQL store keeps one connection on its shelf: that is the one left open, so the keeper
    # closes every idle one in the pool (a waiting process still holds one, not two).
    from tests.scale import server_connections, tagged_url

    with tagged_url("postgres", tmp_path) as (url, tag):
        store = open_store(url)
        assert isinstance(store, SQLStore) and store._keeper is not None
        try:
            store.read(Key("ns", "a"))
            inside, leave = threading.Barrier(3), threading.Event()

            def call() -> None:
                with store._cursor():
                    inside.wait(30)
                    leave.wait(30)

            threads = [threading.Thread(target=call) for _ in range(2)]
            for thread in threads:
                thread.start()
            inside.wait(30)  # two calls at once: two connections
            leave.set()
            for thread in threads:
                thread.join(30)
            assert store._shelf is not None and len(store._shelf) == 1  # one kept, one back in the pool
            assert server_connections("postgres", tag) == 2
            store._keeper._idle_seconds = 0.0
            store._keeper._trim()
            for _ in range(100):  # the server ends the closed connection's backend soon after
                if server_connections("postgres", tag) == 1:
                    break
                time.sleep(0.1)
            assert server_connections("postgres", tag) == 1  # the shelved one
            store.read(Key("ns", "a"))  # and it serves the next call
        finally:
            store.close()

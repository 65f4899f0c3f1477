"""The keeper of the SQL store's bounded calls (:class:`dibs.stores.sql.bounds.Keeper`)."""

from __future__ import annotations

import dataclasses
import socket
import threading
from collections.abc import Iterator

import pytest

from dibs.stores.sql.bounds import Keeper


class _Engine:  # what the keeper needs of an engine: something to refer to weakly
    pool = None


class _Connection:
    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock  # PyMySQL's attribute, which the keeper reads


@dataclasses.dataclass
class Kept:
    """A keeper, and a connection whose socket it shuts at a call's deadline (``ours`` reads EOF)."""

    keeper: Keeper
    connection: _Connection
    ours: socket.socket

    def shut_at_the_deadline(self, ticket: int | None) -> None:
        self.ours.settimeout(30)
        assert self.ours.recv(1) == b""  # shut down by the keeper at the deadline
        assert self.keeper.unregister(ticket)


@pytest.fixture
def kept() -> Iterator[Kept]:
    engine, (ours, theirs) = _Engine(), socket.socketpair()  # the keeper refers to engine weakly
    keeper = Keeper(engine)
    try:
        # The connection stays referenced: the keeper shuts only a connection still alive.
        yield Kept(keeper, _Connection(ours), ours)
    finally:
        keeper.close()
        ours.close()
        theirs.close()


def test_a_keeper_whose_thread_ended_starts_another_for_the_next_bounded_call(
    kept: Kept, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every call checks only that the keeper has a thread (not Thread.is_alive()): a thread that
    # ends must clear itself, or no later call would ever be bounded again.
    keeper, connection = kept.keeper, kept.connection
    keep = Keeper._keep
    runs: list[int] = []
    end_first = threading.Event()

    def ends_when_told_the_first_time(self: Keeper) -> None:
        runs.append(1)
        if len(runs) > 1:
            keep(self)
        else:
            end_first.wait(30)  # until the test has seen it

    monkeypatch.setattr(Keeper, "_keep", ends_when_told_the_first_time)
    try:
        keeper.unregister(keeper.register(connection, 600))
        first = keeper._thread
        assert first is not None
        end_first.set()
        first.join(10)
        assert not first.is_alive() and keeper._thread is None
        ticket = keeper.register(connection, 0.01)  # a second thread ends this call
        assert keeper._thread is not None and keeper._thread is not first
        kept.shut_at_the_deadline(ticket)
    finally:
        end_first.set()


def test_the_socket_of_each_drivers_connection_is_found() -> None:
    from dibs.stores.sql.bounds import _fileno

    class Psycopg:
        pgconn = object()

        def __init__(self, fileno: int | None) -> None:
            self._fileno = fileno

        def fileno(self) -> int:
            if self._fileno is None:
                raise OSError("the connection is closed")
            return self._fileno

    class PyMySQL:
        def __init__(self, sock: object) -> None:
            self._sock = sock

    class Socket:
        def fileno(self) -> int:
            return 9

    assert _fileno(Psycopg(7)) == 7
    assert _fileno(Psycopg(None)) is None  # closed
    assert _fileno(PyMySQL(Socket())) == 9
    assert _fileno(PyMySQL(None)) is None  # closed
    assert _fileno(object()) is None  # SQLite: no socket


def test_a_keeper_whose_thread_could_not_start_tries_again_at_the_next_call(
    kept: Kept, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A thread limit reached once must not leave a keeper that believes it has a thread: every later
    # call would register a deadline that nothing enforces.
    keeper, connection = kept.keeper, kept.connection
    start = threading.Thread.start

    def refused(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refused)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        keeper.register(connection, 600)
    monkeypatch.setattr(threading.Thread, "start", start)
    ticket = keeper.register(connection, 0.01)
    assert keeper._thread is not None and keeper._thread.is_alive()
    kept.shut_at_the_deadline(ticket)

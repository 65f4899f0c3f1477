"""The fork gate of the SQLite store (:mod:`dibs.stores.sql.fork`): ``os.fork`` waits until no dibs
thread is inside SQLite, so a child never inherits SQLite's mutexes locked."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from dibs.stores.sql import fork as sql_fork
from dibs.stores.sql.fork import ForkGate

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="fork is POSIX")


def test_a_fork_waits_for_the_threads_inside_and_keeps_new_ones_out() -> None:
    gate, order = ForkGate(), []
    inside, leave, forked = threading.Event(), threading.Event(), threading.Event()

    def user() -> None:
        with gate.inside():
            inside.set()
            leave.wait()
            order.append("left")

    def fork() -> None:
        gate.before_fork()
        order.append("forking")
        gate.after_fork_in_parent()
        forked.set()

    threads = [threading.Thread(target=user)]
    threads[0].start()
    inside.wait()
    threads.append(threading.Thread(target=fork))
    threads[1].start()
    assert not forked.wait(0.2)  # still inside: the fork waits (a bound on the check, not on speed)
    leave.set()
    for thread in threads:
        thread.join(10)
    assert order == ["left", "forking"]
    with gate.inside():  # and the gate is open again afterwards
        pass


def test_a_thread_may_fork_from_inside_its_own_section() -> None:
    gate = ForkGate()
    with gate.inside(), gate.inside():  # re-entrant
        gate.before_fork()  # does not wait for itself
        gate.after_fork_in_parent()


def test_a_child_forked_from_inside_a_section_leaves_it_and_forks_again() -> None:
    gate = ForkGate()
    with gate.inside(), gate.inside():
        gate.before_fork()
        gate.after_fork_in_child()  # what the child runs: it is still inside the parent's section
    # Out of both sections: the child's next fork has nobody to wait for (before the fix, leaving
    # the section raised AttributeError: the child's reset had dropped this thread's depth).
    gate.before_fork()
    assert gate._inside == 0
    gate.after_fork_in_parent()


@contextlib.contextmanager
def _busy_in_sqlite(gate: Callable[[], contextlib.AbstractContextManager[None]]) -> Iterator[None]:
    """A thread that calls into SQLite without pause, each call under ``gate``."""
    stop = threading.Event()

    def spin() -> None:
        with gate():  # opening a connection is inside SQLite too
            conn = sqlite3.connect(":memory:", check_same_thread=False)
        while not stop.is_set():
            with gate():
                conn.execute("SELECT randomblob(4096), hex(randomblob(64))").fetchall()
        with gate():
            conn.close()

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)


def _children_that_finish(forks: int) -> int:
    """Fork ``forks`` children that each make one SQLite call; how many finished (the rest hung and
    were killed after a generous wait)."""
    finished = 0
    for _ in range(forks):
        pid = os.fork()
        if pid == 0:  # the child: one SQLite call, then leave without running the parent's cleanup
            try:
                sqlite3.connect(":memory:").execute("SELECT randomblob(16)").fetchall()
            finally:
                os._exit(0)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                finished += int(os.waitstatus_to_exitcode(status) == 0)
                break
            time.sleep(0.01)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    return finished


def test_children_forked_beside_a_thread_busy_in_sqlite_never_hang() -> None:
    with _busy_in_sqlite(sql_fork.GATE.inside):
        assert _children_that_finish(40) == 40


def test_a_forked_child_forgets_the_parents_bounded_calls() -> None:
    # The child shares the parent's sockets: its keeper must never shut one of them at the deadline
    # of a call the parent made (the parent may be using that connection for another call by then).
    from dibs.stores.sql.bounds import Keeper

    class Engine:  # what the keeper needs of an engine: something to refer to weakly
        pool = None

    engine, (ours, theirs) = Engine(), socket.socketpair()
    keeper = Keeper(engine)

    class Connection:
        def __init__(self, sock: socket.socket) -> None:
            self._sock = sock  # PyMySQL's attribute, which the keeper reads

    try:
        with keeper.bounded(Connection(ours), 600):
            pid = os.fork()
            if pid == 0:  # the child: nothing of the parent's is in flight here
                os._exit(0 if not keeper._calls and not keeper._ended else 1)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0
            assert len(keeper._calls) == 1  # the parent's own call is still bounded
    finally:
        keeper.close()
        ours.close()
        theirs.close()


def test_a_fork_from_inside_a_section_goes_ahead_once_the_other_threads_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The forking thread is inside a section itself: the others leaving must wake it (it waited for
    # the whole patience when the count stopped at its own 1 rather than 0).
    monkeypatch.setattr(sql_fork, "FORK_PATIENCE", 60.0)
    gate = ForkGate()
    inside, leave, forked = threading.Event(), threading.Event(), threading.Event()

    def user() -> None:
        with gate.inside():
            inside.set()
            leave.wait()

    def fork() -> None:
        with gate.inside():
            gate.before_fork()
            gate.after_fork_in_parent()
            forked.set()

    threads = [threading.Thread(target=user)]
    threads[0].start()
    inside.wait()
    threads.append(threading.Thread(target=fork))
    threads[1].start()
    assert not forked.wait(0.2)  # the other thread is still inside
    leave.set()
    assert forked.wait(30)  # well before the patience of 60 s
    for thread in threads:
        thread.join(10)

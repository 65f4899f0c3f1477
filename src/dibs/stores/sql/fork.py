"""Forking a process while one of its threads is inside SQLite, safely for dibs's own threads.

SQLite keeps process-wide mutexes (its memory allocator's among them). A thread that is inside SQLite
when another thread calls ``os.fork`` leaves that mutex locked in the child, where no thread will ever
unlock it: the child's first SQLite call then hangs forever (seen in ``tests/test_runtime_processes.py``,
the child stuck in ``sqlite3Malloc``). dibs has threads that use SQLite on their own schedule (the
watch hub probes every few milliseconds, waiters ask, heartbeats write), and programs that embed it
fork (Airflow's executors, ``multiprocessing``), so each SQLite call of dibs goes through
:data:`GATE`: threads pass it freely, and ``os.fork`` (through ``os.register_at_fork``) waits until
no dibs thread is inside SQLite and keeps new ones out until the fork is done.

It cannot make a fork safe from *other* code's threads inside SQLite: that is a hazard of
``fork`` with threads in any Python program (Python 3.12 warns about it).
"""

from __future__ import annotations

import logging
import os
import threading
import time

__all__ = ["GATE", "ForkGate"]

log = logging.getLogger(__name__)

#: How long a fork waits for dibs's threads to leave SQLite before it goes ahead anyway (a thread
#: that stays inside longer is waiting on SQLite's busy timeout, and holds no mutex while it sleeps).
FORK_PATIENCE = 2.0


class ForkGate:
    """Counts the threads inside a guarded section; a fork waits until the count is zero."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        # A plain lock, entered directly (``with self._lock``: C code), and a condition on it for the
        # waits: a Condition's own ``with`` runs Python code, a few hundred ns per SQLite call.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._inside = 0
        self._forking = False
        self._depth = threading.local()

    def inside(self) -> ForkGate:
        """A section of this thread that may call into SQLite (re-entrant): ``with gate.inside():``.

        The gate is its own context manager (a class, not a generator: it costs every SQLite call of
        the store, ~1 µs instead of ~1.7)."""
        return self

    def __enter__(self) -> None:
        local = self._depth
        depth: int = getattr(local, "value", 0)
        if depth == 0:
            with self._lock:
                while self._forking:
                    self._cond.wait()
                self._inside += 1
        local.value = depth + 1

    def __exit__(self, *exc: object) -> None:
        local = self._depth
        depth: int = local.value - 1
        local.value = depth
        if depth == 0:
            with self._lock:
                self._inside = max(0, self._inside - 1)
                if self._forking:  # only a fork waits on the condition (before_fork, under the lock)
                    self._cond.notify_all()

    def before_fork(self) -> None:
        # The condition's lock is held from here until the fork is done: nobody enters or leaves.
        self._cond.acquire()
        self._forking = True
        own = 1 if getattr(self._depth, "value", 0) > 0 else 0  # a fork from inside a section
        deadline = time.monotonic() + FORK_PATIENCE
        while self._inside > own:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log.warning(
                    "forking while %d dibs thread(s) are still inside SQLite after %.0fs; the child's "
                    "first SQLite call may hang",
                    self._inside - own,
                    FORK_PATIENCE,
                )
                break
            self._cond.wait(remaining)

    def after_fork_in_parent(self) -> None:
        self._forking = False
        self._cond.notify_all()
        self._cond.release()

    def after_fork_in_child(self) -> None:
        # The child has one thread, this one; the other threads were not copied. A fork from inside
        # a section (a callback of SQLite's, a signal handler) leaves this thread inside it in the
        # child too: it keeps its depth, or leaving the section would find no depth to count down.
        depth: int = getattr(self._depth, "value", 0)
        self._reset()
        if depth:
            self._depth.value = depth
            self._inside = 1


#: The one gate of the process, which every SQLite call of the SQL store passes.
GATE = ForkGate()
os.register_at_fork(
    before=GATE.before_fork,
    after_in_parent=GATE.after_fork_in_parent,
    after_in_child=GATE.after_fork_in_child,
)

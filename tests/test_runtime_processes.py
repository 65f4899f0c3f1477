"""The runtime across ``fork``: a child builds its own store, pool and hub, and never uses its parent's.

A forked child inherits the parent's pooled connections (and, with them, their sockets). If it used
one, parent and child would talk over the same socket and one of them would read the other's answer.
So the child starts with an empty runtime: its first client opens a store of its own. Checked on every
store that several processes can share: the parent forks while one of its threads waits on a key
(through the parent's watch hub), the child completes that key with a lease handed over to it, and
the parent's waiter is woken by its own hub and reads the child's value over its own connections.
The parent forks while its own threads (the hub, the waiter) use the store: on SQLite the fork waits
until none of them is inside SQLite (:mod:`dibs.stores.sql.fork`), else the child could hang.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading

import pytest

import dibs
from dibs.runtime import runtime
from tests.scale import wait_until

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="fork is POSIX")
FORK = multiprocessing.get_context("fork")


def _child(url: str, exported: str, done: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    try:
        client = dibs.Reservations(url, namespace="fork", ttl=60)
        fresh = not hasattr(client.store, "opened_by_the_parent")
        client.resume(exported).complete(os.getpid())
        done.put(("ok", fresh))
    except BaseException as exc:  # reported to the parent, which fails the test with it
        done.put(("error", repr(exc)))


def test_a_forked_child_builds_its_own_store_and_the_parent_keeps_its_own(process_store_url: str) -> None:
    parent = dibs.Reservations(process_store_url, namespace="fork", ttl=60)
    assert parent.run("warm-up", lambda: "parent") == "parent"  # the parent's pool is in use
    parent.store.opened_by_the_parent = True  # type: ignore[attr-defined]
    held = parent.get_or_reserve("handed-over", owner="holder")
    assert isinstance(held, dibs.Acquired)
    hub = runtime().hub(parent.store)
    assert hub is not None
    woken: list[object] = []
    waiter = threading.Thread(
        target=lambda: woken.append(parent.acquire("handed-over", owner="parent-waiter", timeout=120))
    )
    waiter.start()
    wait_until(lambda: hub.waiters == 1, "the parent's waiter waits on its hub")

    done: multiprocessing.Queue = FORK.Queue()  # type: ignore[type-arg]
    child = FORK.Process(target=_child, args=(process_store_url, held.lease.export(), done))
    child.start()
    try:
        result = done.get(timeout=120)
        child.join(timeout=60)
    finally:
        if child.is_alive():  # a child stuck at its first store call must fail the test, not hang it
            child.kill()
            child.join()
    assert result == ("ok", True), result  # the child had a store of its own
    waiter.join(timeout=120)
    assert len(woken) == 1 and isinstance(woken[0], dibs.Hit) and woken[0].value == child.pid
    assert parent.run("warm-up", lambda: "again") == "parent"  # the parent's connections still work
    parent.close()

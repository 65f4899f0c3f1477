"""Hundreds of threads of one process waiting on one key, on real PostgreSQL, Redis and SQLite.

A worker with a thread pool (or a web service) may have hundreds of threads wait on one popular key,
each with a client of its own. They must share one store, one pool and one watch hub: the server
sees a few connections of the process (counted by the server), and every thread gets the artifact
when the holder completes. Sizes: 200 threads, 500 with DIBS_FULL=1.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import dibs
from dibs.runtime import runtime
from dibs.stores.redis import DEFAULT_MAX_CONNECTIONS
from dibs.stores.sql.engine import DEFAULT_POOL_SIZE
from tests.scale import SCALE_BACKENDS, PeakSampler, server_connections, tagged_url, wait_until
from tests.services import full_size

THREADS = 500 if full_size() else 200
BOUND = {"postgres": DEFAULT_POOL_SIZE + 1, "redis": DEFAULT_MAX_CONNECTIONS}


@pytest.mark.parametrize("backend", SCALE_BACKENDS)
def test_hundreds_of_waiting_threads_share_a_few_connections(backend: str, tmp_path: Path) -> None:
    with tagged_url(backend, tmp_path) as (url, tag):
        holder = dibs.Reservations(url, namespace="scale", ttl=300)
        got = holder.get_or_reserve("popular", owner="holder")
        assert isinstance(got, dibs.Acquired)
        hub = runtime().hub(holder.store)
        assert hub is not None
        results: list[object] = []
        lock = threading.Lock()

        def wait() -> None:
            with dibs.Reservations(url, namespace="scale", ttl=300) as client:  # one client per thread
                try:
                    outcome: object = client.acquire("popular", timeout=300)
                except Exception as exc:  # reported below, with the others
                    outcome = exc
            with lock:
                results.append(outcome)

        threads = [threading.Thread(target=wait, name=f"waiter-{i}") for i in range(THREADS)]
        with PeakSampler(lambda: server_connections(backend, tag)) as connections:
            for thread in threads:
                thread.start()
            wait_until(lambda: hub.waiters == THREADS or len(results) > 0, "every thread waits on the hub")
            assert not results, f"threads returned before the key was done: {results[:3]}"
            got.lease.complete({"rows": 42})
            for thread in threads:
                thread.join(timeout=300)
        holder.close()

    assert len(results) == THREADS
    failures = [r for r in results if not isinstance(r, dibs.Hit)]
    assert not failures, f"{len(failures)} threads did not get the artifact, e.g. {failures[:3]}"
    assert all(r.value == {"rows": 42} and r.token == got.lease.token for r in results)  # type: ignore[attr-defined]
    if backend in BOUND:
        assert connections.samples > 0
        assert 0 < connections.peak <= BOUND[backend], f"{connections.peak} connections for {THREADS} threads"

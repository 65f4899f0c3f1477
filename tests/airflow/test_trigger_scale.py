"""Hundreds of deferred waits in one triggerer event loop, on real PostgreSQL, Redis and SQLite.

What a triggerer does when a popular key makes hundreds of tasks defer: it runs every
:class:`ReservationTrigger` as a coroutine of one event loop. Each builds its own hook and client;
they must all share one store, one connection pool and one watch hub, so the process holds a few
connections however many triggers wait (counted by the server itself), no thread per waiter, and
every trigger fires ``done`` once the holder completes. Sizes: 500 triggers, 1,000 with DIBS_FULL=1.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("airflow")

import dibs
from dibs.runtime import Runtime, runtime
from dibs.stores.redis import DEFAULT_MAX_CONNECTIONS
from dibs.stores.sql.engine import DEFAULT_POOL_SIZE
from dibs_provider.triggers.reservation import ReservationTrigger
from tests.scale import SCALE_BACKENDS, PeakSampler, server_connections, tagged_url
from tests.services import full_size

TRIGGERS = 1000 if full_size() else 500
#: Connections one process may hold: the bounded pool, plus PostgreSQL's one listening connection
#: (Redis counts the hub's subscription inside its pool).
BOUND = {"postgres": DEFAULT_POOL_SIZE + 1, "redis": DEFAULT_MAX_CONNECTIONS}
#: Threads dibs may run: the I/O executor, the watch hub, the heartbeat launcher.
DIBS_THREADS = Runtime.IO_THREADS + 2


def _dibs_threads() -> int:
    return sum(1 for thread in threading.enumerate() if thread.name.startswith("dibs-"))


@pytest.mark.parametrize("backend", SCALE_BACKENDS)
def test_hundreds_of_triggers_in_one_loop_share_a_few_connections(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with tagged_url(backend, tmp_path) as (url, tag):
        conn = {"conn_type": "dibs", "extra": {"store_url": url, "namespace": "scale"}}
        monkeypatch.setenv("AIRFLOW_CONN_DIBS_SCALE", json.dumps(conn))
        holder = dibs.Reservations(url, namespace="scale", ttl=300)
        got = holder.get_or_reserve("popular", owner="holder")
        assert isinstance(got, dibs.Acquired)
        triggers = [
            ReservationTrigger("popular", dibs_conn_id="dibs_scale", holder="holder") for _ in range(TRIGGERS)
        ]
        hub = runtime().hub(holder.store)  # the triggers' clients share this store, and so this hub
        assert hub is not None
        before = _dibs_threads()  # hubs of earlier tests' stores may still be winding down
        threads = PeakSampler(_dibs_threads)

        async def scenario() -> list[Any]:
            fired = [asyncio.ensure_future(anext(trigger.run())) for trigger in triggers]
            while hub.waiters < TRIGGERS:  # every trigger deferred and waits on the hub
                early = [task.result().payload for task in fired if task.done()]
                assert not early, f"triggers fired before the key was done: {early[:3]}"
                await asyncio.sleep(0.02)
            await runtime().io(got.lease.complete, {"rows": 42})
            return [event.payload for event in await asyncio.gather(*fired)]

        with PeakSampler(lambda: server_connections(backend, tag)) as connections, threads:
            events = asyncio.run(asyncio.wait_for(scenario(), timeout=600))
        holder.close()

    assert [event["status"] for event in events] == ["done"] * TRIGGERS
    assert {event["token"] for event in events} == {got.lease.token}
    assert threads.peak - before <= DIBS_THREADS, (
        f"{threads.peak - before} dibs threads for {TRIGGERS} waiters"
    )
    if backend in BOUND:
        assert connections.samples > 0
        assert 0 < connections.peak <= BOUND[backend], (
            f"{connections.peak} server connections for {TRIGGERS} waiting triggers"
        )

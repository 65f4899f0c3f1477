"""A Redis restart under a key's waiters (issue 29): every waiter returns the artifact, none fails.

A ``redis-server`` of the test's own (tests/redis_topologies.py) with AOF persistence, fsynced on
every write, as a deployment that keeps leases must run it (docs/deploy-redis.md): stopped (SIGTERM,
as a restart does), kept down N seconds, and started again on the same port from its folder. Three
processes wait on a key this test holds; a waiter holds nothing, so it keeps waiting through the
outage (:class:`dibs.Outage`, ``outage_patience`` 60 s by default), and returns the artifact the
holder stores once the server is back. 5 s down (a restart) and 15 s (30 s with ``DIBS_FULL=1``: a
managed failover): the test mostly waits, in the second lane (tests/serial.py).
"""

from __future__ import annotations

import multiprocessing
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import dibs
from dibs.runtime import runtime
from tests import workers
from tests.components import free_port
from tests.redis_topologies import RedisServer, missing
from tests.scale import wait_until
from tests.services import full_size, unavailable

SPAWN = multiprocessing.get_context("spawn")
#: Seconds the server stays down under waiting processes: a restart; a managed failover (15 s in CI).
OUTAGES = (5.0, 30.0 if full_size() else 15.0)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    why = missing()
    if why is not None:
        unavailable(f"the Redis restart test starts its own server: {why}")
    port = free_port()
    config = ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path / "redis")]
    config += ["--appendonly", "yes", "--appendfsync", "always", "--save", ""]
    started = RedisServer("redis-restart", tmp_path / "redis", port, config).start()
    try:
        wait_until(started.answers, "the throwaway Redis to answer")
        yield started
    finally:
        runtime().close()
        started.stop()


@pytest.mark.parametrize("down", OUTAGES, ids=lambda down: f"{down:g}s")
def test_waiting_processes_get_the_artifact_through_a_restart(
    server: RedisServer, down: float, tmp_path: Path
) -> None:
    url = f"redis://127.0.0.1:{server.port}/0?prefix=restart-{uuid.uuid4().hex[:8]}:&socket_timeout=2"
    holder = dibs.Reservations(url, namespace="outage", ttl=down + 30)
    held = holder.get_or_reserve("hot", owner="holder")
    assert isinstance(held, dibs.Acquired)
    with held.lease.keep_alive():
        children = [
            SPAWN.Process(target=workers.wait_through_outage, args=(url, "hot", str(tmp_path), w))
            for w in range(3)
        ]
        for child in children:
            child.start()
        try:
            wait_until(
                lambda: (
                    {line["worker"] for line in workers.read_lines(tmp_path / "waiting.jsonl")} == {0, 1, 2}
                ),
                "every waiter is told the key is busy",
            )
            server.stop()  # SIGTERM: Redis writes its AOF and exits, as a restart does
            assert not server.answers()
            time.sleep(down)  # the outage itself: the server stays down this long (nothing is timed)
            server.restart()
            wait_until(server.answers, "the Redis server to be back")
            state = holder.status("hot")  # the lease outlived the restart: it was persisted
            assert state.lease is not None and state.lease.owner == "holder"
            held.lease.complete("the artifact")
            for child in children:
                child.join(timeout=down + 300)
        finally:
            for child in children:
                if child.is_alive():
                    child.kill()
    reports = [workers.read_lines(tmp_path / f"waiter-{w}.jsonl") for w in range(3)]
    assert reports == [[{"value": "the artifact", "role": "waited"}]] * 3, reports

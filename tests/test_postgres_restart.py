"""A PostgreSQL restart under a lease's holder and under its waiters (issue 29).

The throwaway server (tests/postgres_servers.py) is stopped as a restart does (``pg_ctl stop -m
fast``: every connection cut), kept down N seconds, and started again on the same port; the tests'
store URLs take ``?timeout=2``, so each call gives up on a dead server in two seconds.

* The holder rides it out today: its heartbeats retry until the lease would have expired, and a
  ``complete`` whose outcome is unknown is settled by reading the key again for up to a ttl
  (:mod:`dibs.lease`). Its lease survives an outage shorter than the ttl less one heartbeat
  interval (two thirds of the ttl, at worst).
* The waiters ride it out too (the outage policy, :class:`dibs.Outage`: a waiter holds nothing, so
  it keeps waiting for ``outage_patience``, 60 s by default); before it, 2 of 3 waiters failed with
  ``StoreUnavailable ... Connection refused`` 5-6 s into a 5 s restart. 5 s down (a restart) and 15 s
  (30 s with ``DIBS_FULL=1``: a managed failover takes 20-60 s): the test mostly waits, in the second
  lane.

Behind stock PgBouncer the same restart lasts longer for the clients: PgBouncer waits
``server_login_retry`` (15 s) after a failed login to the server before it tries again (measured: the
server back after 5.1 s, the first call through PgBouncer after 15.1 s; docs/deploy.md). The holder's
test through it runs under ``DIBS_FULL=1``, with a ttl to match.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import dibs
from dibs.runtime import runtime
from tests import workers
from tests.postgres_servers import PgBouncer, ThrowawayPostgres
from tests.scale import wait_until
from tests.services import full_size

SPAWN = multiprocessing.get_context("spawn")


@pytest.fixture
def server(restartable_postgres: ThrowawayPostgres) -> Iterator[ThrowawayPostgres]:
    """The module's throwaway server (tests/conftest.py); every test's clients open their own stores,
    and a test that failed mid-outage leaves the next one a server that answers."""
    yield restartable_postgres
    runtime().close()
    if not restartable_postgres.running:
        restartable_postgres.start()


@contextlib.contextmanager
def _url(server: ThrowawayPostgres, through: str) -> Iterator[str]:
    """A fresh schema on ``server``, directly or through PgBouncer in transaction mode."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    if through == "direct":
        yield server.url(schema=schema, timeout="2")
        return
    with PgBouncer(server.url(), "transaction") as bouncer:
        yield bouncer.url(schema=schema, timeout="2", listen_url=server.libpq_url())


#: How the holder reaches the server, and its ttl (see the test). Through PgBouncer a 5 s restart lasts
#: up to ~20 s for its clients: only the full run takes that long.
HOLDER_ROUTES = [("direct", 12.0), *([("pgbouncer", 45.0)] if full_size() else [])]
#: Seconds the server stays down under waiting processes: a restart; a managed failover (15 s in CI,
#: three times what failed every waiter before).
OUTAGES = (5.0, 30.0 if full_size() else 15.0)


@pytest.mark.parametrize(("through", "ttl"), HOLDER_ROUTES)
def test_a_holder_keeps_its_lease_and_stores_through_a_restart(
    server: ThrowawayPostgres, through: str, ttl: float, caplog: pytest.LogCaptureFixture
) -> None:
    """The work ends while the server is down, so its ``complete`` meets a dead server and is settled
    by reading the key until the server is back. Directly, a heartbeat meets it first (ttl 12 s:
    heartbeats every 4 s, the outage ~6 s with the start), and is retried. Behind PgBouncer the work
    ends as soon as the server is down: PgBouncer's clients may wait ``server_login_retry`` (15 s)
    after the server is back, so the ttl there is 45 s and the heartbeats (every 15 s) may miss it."""
    with _url(server, through) as url:
        client = dibs.Reservations(url, namespace="restart", ttl=ttl)
        seen: list[Any] = []
        outage: list[Any] = []

        def work() -> str:
            outage.append(server.outage(5.0))
            outage[0].down.wait(60)
            if through == "direct":
                wait_until(
                    lambda: any(isinstance(event, dibs.events.HeartbeatFailed) for event in seen),
                    "a heartbeat meets the stopped server",
                    timeout=60,
                )
            assert not outage[0].up.is_set(), "the server came back before the work ended"
            return "computed through the restart"

        with caplog.at_level(logging.WARNING, logger="dibs"):
            report = client.compute("through", work, observer=seen.append)
        outage[0].join()
        assert report.role == "computed" and report.value == "computed through the restart"
        assert report.stored and report.token == 1
        kinds = [type(event).__name__ for event in seen]
        assert "LostLease" not in kinds and "ArtifactStored" in kinds
        assert through != "direct" or "HeartbeatFailed" in kinds
        settled = [r.getMessage() for r in caplog.records if "reading the key to find out" in r.getMessage()]
        assert settled, "the complete never met the stopped server"
        stored = client.status("through").artifact
        assert stored is not None and stored.fence == 1 and stored.producer == report.producer
        assert client.run("through", lambda: "never runs") == "computed through the restart"


@pytest.mark.parametrize("down", OUTAGES, ids=lambda down: f"{down:g}s")
def test_waiting_processes_get_the_artifact_through_a_restart(
    server: ThrowawayPostgres, down: float, tmp_path: Path
) -> None:
    """Three processes wait on a key this test holds; the server goes down ``down`` seconds; once it
    is back the holder completes: every waiter returns the artifact, none fails."""
    url = server.url(schema=f"t_{uuid.uuid4().hex[:12]}", timeout="2")
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
            server.outage(down).join()
            held.lease.complete("the artifact")
            for child in children:
                child.join(timeout=down + 300)
        finally:
            for child in children:
                if child.is_alive():
                    child.kill()
    reports = [workers.read_lines(tmp_path / f"waiter-{w}.jsonl") for w in range(3)]
    assert reports == [[{"value": "the artifact", "role": "waited"}]] * 3, reports


def test_the_restart_fixture_cuts_connections_and_keeps_the_data(server: ThrowawayPostgres) -> None:
    """What the scenarios above rely on: during an outage calls fail as unavailable, the server comes
    back on the same port with its data, and the store's next call works on a fresh connection."""
    url = server.url(schema=f"t_{uuid.uuid4().hex[:12]}", timeout="2")
    client = dibs.Reservations(url, namespace="fixture", ttl=30)
    assert client.run("kept", lambda: "before") == "before"
    outage = server.outage(1.0)
    outage.down.wait(60)
    with pytest.raises(dibs.StoreUnavailable):  # refused at once: the server is down for a second
        while not outage.up.is_set():
            client.status("kept")
            time.sleep(0.05)
    outage.join()
    assert server.restarts >= 1
    assert client.run("kept", lambda: "after") == "before"

"""The PostgreSQL store behind PgBouncer 1.18 with stock settings, in both pool modes (issue 29).

Each failure of the issue's table has its test here, and each fails on the code before the fix:

* stock PgBouncer, either mode: every call failed (``FATAL: unsupported startup parameter: options``);
* transaction pooling that drops the startup options (``ignore_startup_parameters = options``): a
  statement psycopg prepared met another client's server session (``prepared statement "_pg3_0"
  already exists``, ``bind message supplies 8 parameters, but prepared statement "_pg3_2" requires
  1``), raw errors, not :class:`~dibs.errors.StoreUnavailable`;
* ``LISTEN`` through transaction pooling heard nothing, and nothing said so (waiters waited for
  their 10 s backstop): now one warning says why and what to set, waiters poll, and ``listen_url``
  brings the notifications back;
* found on the way: the schema's creation took a session advisory lock around autocommit statements,
  which transaction pooling split across server sessions, leaving the lock held.

A throwaway server (tests/postgres_servers.py) serves the module, so that what its notification
channel carries is this module's alone; each test has a schema of its own. The contract suite through
PgBouncer is tests/contract/test_pooled_contract.py, processes racing through it
tests/test_pooled_processes.py.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

import dibs
from dibs.runtime import runtime
from dibs.stores.sql import SQLStore
from dibs.stores.sql.feed import ListenFeed
from tests.postgres_servers import PgBouncer, ThrowawayPostgres, process_connections
from tests.scale import PeakSampler, wait_until


@pytest.fixture(scope="module")
def server(restartable_postgres: ThrowawayPostgres) -> ThrowawayPostgres:
    return restartable_postgres


@pytest.fixture(scope="module")
def transaction_bouncer(server: ThrowawayPostgres) -> Iterator[PgBouncer]:
    with PgBouncer(server.url(), "transaction") as bouncer:
        yield bouncer


@pytest.fixture(scope="module")
def session_bouncer(server: ThrowawayPostgres) -> Iterator[PgBouncer]:
    with PgBouncer(server.url(), "session") as bouncer:
        yield bouncer


@pytest.fixture
def schema() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


@pytest.fixture(autouse=True)
def _fresh_runtime() -> Iterator[None]:
    """Every test's clients open their own stores and hub (a hub's one warning is per hub), and no
    hub of an earlier test still holds a connection (a hub closed while its listener awaits its proof
    ends when the proof's bound does)."""
    yield
    runtime().close()
    wait_until(
        lambda: not [t for t in threading.enumerate() if t.name.startswith("dibs-hub-")],
        "the closed hubs' threads end",
        timeout=60,
    )


def _separate(url: str, count: int, namespace: str) -> list[dibs.Reservations]:
    """``count`` clients with a store each, as ``count`` processes would have: a process shares one
    store per URL, so each URL differs (in its pool size, 3 and up)."""
    return [dibs.Reservations(f"{url}&pool_size={3 + i}", namespace=namespace, ttl=30) for i in range(count)]


def _computed_once(clients: list[dibs.Reservations], keys: list[str]) -> None:
    """Every client computes every key through ``run``, in threads: each key computed exactly once,
    every client gets every value, and no call fails."""
    computed: list[str] = []
    failures: list[BaseException] = []
    results: dict[int, dict[str, str]] = {}

    def work(index: int, client: dibs.Reservations) -> None:
        def compute(key: str) -> str:
            computed.append(key)
            return f"value-of-{key}"

        try:
            order = keys[index:] + keys[:index]  # each walks the keys in its own order: they collide
            results[index] = {key: client.run(key, compute, key) for key in order}
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(i, client)) for i, client in enumerate(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not failures, failures
    assert sorted(computed) == sorted(keys)
    assert all(result == {key: f"value-of-{key}" for key in keys} for result in results.values())
    assert len(results) == len(clients)


@pytest.mark.parametrize("mode", ["transaction", "session"])
def test_stock_pgbouncer_serves_every_call_in_either_pool_mode(
    mode: str, request: pytest.FixtureRequest, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    bouncer: PgBouncer = request.getfixturevalue(f"{mode}_bouncer")
    url = bouncer.url(schema=schema, timeout="2")  # a deaf listener's proof is awaited that long
    with caplog.at_level(logging.INFO, logger="dibs.stores.sql"):
        client = dibs.Reservations(url, namespace="pooled", ttl=30)
        assert client.run("first", lambda: {"rows": 1}) == {"rows": 1}
        assert isinstance(client.get_or_reserve("first"), dibs.Hit)
    store = client.store
    assert isinstance(store, SQLStore) and store.server_end is not None
    assert store.server_end.pooled and not store.server_end.prepares
    (found,) = [r.getMessage() for r in caplog.records if "is a pooler" in r.getMessage()]
    assert "refused the startup parameter 'options'" in found and "docs/deploy.md" in found
    assert bouncer.password not in found
    # Several stores of their own (each its own pool, as processes have) racing on shared keys.
    _computed_once(_separate(url, 3, "pooled.race"), [f"k{i}" for i in range(30)])


def test_transaction_pooling_that_drops_startup_options_never_mixes_prepared_statements(
    server: ThrowawayPostgres, schema: str
) -> None:
    """The issue's second row: ``ignore_startup_parameters = options`` lets the connection through, the
    options never arrive, and psycopg's prepared statements (after five runs of one) met other clients'
    server sessions. The first connection now sees that its options did not arrive, before any
    statement is prepared."""
    with PgBouncer(server.url(), "transaction", settings={"ignore_startup_parameters": "options"}) as bouncer:
        url = bouncer.url(schema=schema, timeout="2")
        clients = _separate(url, 4, "dropped")
        _computed_once(clients, [f"k{i}" for i in range(40)])
        for client in clients:
            end = client.store.server_end  # type: ignore[attr-defined]
            assert end.pooled and not end.prepares and "did not reach the server" in end.why


def test_a_url_that_says_session_behind_transaction_pooling_is_refused_clearly(
    server: ThrowawayPostgres, schema: str
) -> None:
    """``?pooler=session`` keeps prepared statements; behind transaction pooling they meet another
    client's session. With one server connection for every client (``default_pool_size = 1``, so that
    the meeting is certain), the second store's statement finds the first one's name taken."""
    with PgBouncer(server.url(), "transaction", settings={"default_pool_size": "1"}) as bouncer:
        url = bouncer.url(schema=schema, pooler="session")
        first = dibs.Reservations(url, namespace="claimed", ttl=30)
        second = dibs.Reservations(f"{url}&pool_size=2", namespace="claimed", ttl=30)
        for _ in range(10):  # past psycopg's prepare_threshold (5): the read is prepared
            first.status("k")
        with pytest.raises(dibs.ConfigurationError) as refused:
            for _ in range(10):
                second.status("k")
        assert "pooler=session" in str(refused.value) and "Use pooler=transaction" in str(refused.value)
        assert bouncer.password not in str(refused.value)
        # Said otherwise (or not at all), the same two stores share the one server connection.
        plain = bouncer.url(schema=schema)
        clients = [
            dibs.Reservations(f"{plain}&pool_size={1 + i}", namespace="claimed", ttl=30) for i in range(2)
        ]
        for _ in range(10):
            for client in clients:
                client.status("k")


def test_pooler_none_through_a_pooler_is_refused_clearly(transaction_bouncer: PgBouncer, schema: str) -> None:
    client = dibs.Reservations(transaction_bouncer.url(schema=schema, pooler="none"), namespace="n", ttl=30)
    with pytest.raises(dibs.ConfigurationError, match="has pooler=none, but the server end refuses"):
        client.get_or_reserve("k")


def test_creating_the_schema_leaves_no_advisory_lock_behind_transaction_pooling(
    server: ThrowawayPostgres, transaction_bouncer: PgBouncer, schema: str
) -> None:
    """Creators are serialized by an advisory lock. As a session lock around autocommit statements,
    transaction pooling ran its unlock in another server session whenever another client took the
    locking session in between (here: a client that begins a transaction right after the lock, which
    PgBouncer serves with the server connection used last), and the lock stayed held there."""
    libpq = transaction_bouncer.url().replace("postgresql+psycopg://", "postgresql://", 1)
    other = psycopg.connect(libpq)  # not autocommit: its first statement begins a transaction
    store = SQLStore(transaction_bouncer.url(schema=schema, pooler="transaction"))

    def take_the_session(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if "pg_advisory" in statement and "unlock" not in statement and other.info.transaction_status == 0:
            other.execute("SELECT 1")  # BEGIN, and hold a server connection until the commit

    sa.event.listen(store.engine, "after_cursor_execute", take_the_session)
    try:
        store._ensure_ready()  # the schema check, which creates the tables
        assert other.info.transaction_status != 0, "the other client never took a server connection"
        other.commit()
        with psycopg.connect(server.libpq_url(), autocommit=True) as admin:
            held = admin.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").fetchone()
        assert held == (0,)
    finally:
        other.close()
        store.close()


def _held_and_waited(url: str, key: str) -> tuple[dibs.Acquired, threading.Thread, dict[str, Any]]:
    """A lease on ``key`` held by this process, and a thread waiting for ``key`` through ``url``."""
    held = dibs.Reservations(url, namespace="handoff", ttl=60).get_or_reserve(key, owner="holder")
    assert isinstance(held, dibs.Acquired)
    got: dict[str, Any] = {}

    def wait() -> None:
        try:
            got["value"] = dibs.Reservations(url, namespace="handoff", ttl=60).run(
                key, lambda: "waiter ran it"
            )
        except BaseException as exc:
            got["error"] = exc

    waiter = threading.Thread(target=wait, name=f"waiter-{key}")
    waiter.start()
    return held, waiter, got


def test_a_listener_behind_transaction_pooling_warns_once_and_waiters_poll(
    transaction_bouncer: PgBouncer, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``LISTEN`` through transaction pooling hears nothing: it used to look fine (the hub counted as
    following, so waiters asked only every 10 s) and say nothing. Now its proof goes unheard: one
    warning that says what to set, the hub does not follow, and every waiter still gets the hand-off."""
    url = transaction_bouncer.url(schema=schema, timeout="2")  # the proof is awaited up to the timeout
    with caplog.at_level(logging.WARNING, logger="dibs.hub"):
        held, waiter, got = _held_and_waited(url, "first")
        hub = runtime().hub(dibs.Reservations(url).store)
        assert hub is not None

        def warned() -> list[str]:
            return [
                r.getMessage()
                for r in caplog.records
                if r.name == "dibs.hub" and r.levelno == logging.WARNING
            ]

        wait_until(lambda: bool(warned()), "the hub warns that its listener does not hear", timeout=60)
        assert not hub.following
        held.lease.complete("the artifact")
        waiter.join(timeout=60)
        assert got == {"value": "the artifact"}
        # A second wait in the same process: the hub does not try again so soon, nor warn again.
        held, waiter, got = _held_and_waited(url, "second")
        held.lease.complete("the second artifact")
        waiter.join(timeout=60)
        assert got == {"value": "the second artifact"}
    (warning,) = warned()
    assert (
        "did not hear a NOTIFY" in warning
        and "?listen_url=" in warning
        and "pool_mode = transaction" in warning
    )
    assert transaction_bouncer.password not in warning


def test_listen_url_brings_push_back_behind_transaction_pooling(
    server: ThrowawayPostgres, transaction_bouncer: PgBouncer, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = transaction_bouncer.url(schema=schema, listen_url=server.libpq_url())
    with caplog.at_level(logging.WARNING, logger="dibs.hub"):
        held, waiter, got = _held_and_waited(url, "pushed")
        hub = runtime().hub(dibs.Reservations(url).store)
        assert hub is not None
        wait_until(lambda: hub.following, "the hub follows the store through its listen_url", timeout=60)
        feed = hub._feed
        assert isinstance(feed, ListenFeed) and feed.proofs == 1
        held.lease.complete("pushed artifact")
        waiter.join(timeout=60)
    assert got == {"value": "pushed artifact"}
    wait_until(lambda: feed.heard >= 1, "the listener heard the key's notification", timeout=60)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("listen", [True, False], ids=["listen_url", "no-listen_url"])
def test_a_process_holds_at_most_four_connections_behind_transaction_pooling(
    listen: bool, server: ThrowawayPostgres, transaction_bouncer: PgBouncer, schema: str
) -> None:
    """docs/scaling.md's bound, counted by the operating system: a pool of 3 (to PgBouncer) and the
    listener (to the server, with ``listen_url``; without it, only while its proof is awaited), however
    many threads wait or work. With a listener that hears, the waiters only ask as a backstop, and the
    process settles at 2 (one pooled connection and the listener); without one, its waiters poll
    through the pool, which keeps as many of its 3 connections as their questions need."""
    query = {"schema": schema, "timeout": "2"} | ({"listen_url": server.libpq_url()} if listen else {})
    url = transaction_bouncer.url(**query)
    ports = {"pgbouncer": transaction_bouncer.port, "server": server.port}
    holder = dibs.Reservations(url, namespace="counts", ttl=60)
    held = holder.get_or_reserve("hot", owner="holder")
    assert isinstance(held, dibs.Acquired)
    results: list[Any] = []

    def wait() -> None:
        results.append(dibs.Reservations(url, namespace="counts", ttl=60).run("hot", lambda: "ran"))

    def work(worker: int) -> None:
        for number in range(6):
            holder.run(f"busy-{worker}-{number}", lambda: "worked")

    threads = [threading.Thread(target=wait) for _ in range(40)]
    with (
        held.lease.keep_alive(),
        PeakSampler(lambda: sum(process_connections(os.getpid(), ports).values())) as peak,
    ):
        for thread in threads:
            thread.start()
        hub = runtime().hub(holder.store)
        assert hub is not None
        if listen:
            wait_until(lambda: hub.following, "the hub follows the store", timeout=60)
        else:
            wait_until(lambda: hub._unheard_until > 0, "the hub found its listener deaf", timeout=60)
        # A busy spell beside the waiters: the pool grows, up to its size and no further.
        busy = [threading.Thread(target=work, args=(worker,)) for worker in range(8)]
        for thread in busy:
            thread.start()
        for thread in busy:
            thread.join(timeout=120)
        if listen:  # idle pooled connections beyond one are closed after 2 s

            def settled() -> bool:
                return process_connections(os.getpid(), ports) == {"pgbouncer": 1, "server": 1}

            wait_until(settled, "the waiting process settles at one pooled connection and its listener")
        else:  # the listener that did not hear was closed: only the pool is left
            feed = hub._feed
            assert isinstance(feed, ListenFeed) and feed._conn is None and feed.proofs == 0
            assert process_connections(os.getpid(), ports)["pgbouncer"] <= 3
        held.lease.complete("done")
        for thread in threads:
            thread.join(timeout=60)
    assert results == ["done"] * 40
    assert 0 < peak.peak <= 4, peak.peak
    print(f"\nbehind transaction pooling, listen_url {listen}: peak {peak.peak} connections")

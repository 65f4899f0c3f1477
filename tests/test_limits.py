"""Everything is bounded (contract, guarantee 8): value sizes, the time of one store call, and the
connections a waiting process holds; and what the SQL store does when MariaDB rolls a statement back
or a record changes right after ``complete``. Issue 16, items 5, 7, 8 and 9. Real servers throughout;
the MariaDB errors are injected, since a deadlock cannot be produced on demand.
"""

from __future__ import annotations

import decimal
import enum
import multiprocessing
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import sqlalchemy as sa

import dibs
from dibs.keys import Key
from dibs.records import Granted, checksum
from dibs.stores import AcquireRequest, NewArtifact, open_store
from dibs.stores import redis as redis_module
from dibs.stores.redis import RedisStore
from dibs.stores.sql import SQLStore
from dibs.stores.sql import limits as sql_limits
from dibs.stores.sql import translate as sql_translate
from tests.backends import mysql, postgres, redis, sqlite
from tests.scale import server_connections, wait_until
from tests.services import full_size

SPAWN = multiprocessing.get_context("spawn")
BACKENDS = {"sqlite": sqlite, "postgres": postgres, "mysql": mysql, "redis": redis}


@pytest.fixture
def url_of(tmp_path: Path) -> Iterator[Any]:
    """``url_of(backend)``: an isolated store URL on that backend, cleaned up after the test."""
    import contextlib

    with contextlib.ExitStack() as stack:
        yield lambda backend: stack.enter_context(BACKENDS[backend].isolated_url(tmp_path))


def _with(url: str, option: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{option}"


# -- 5. values too big for the store ---------------------------------------------------------------------


def _assert_refused_and_released(client: dibs.Reservations, too_big: bytes, limit: int) -> None:
    """The caller keeps its value, nothing is stored, the lease is released with the reason."""
    report = client.compute("big", lambda: too_big)
    assert report.value == too_big and not report.stored
    state = client.status("big")
    assert state.artifact is None and state.lease is None
    assert state.failure is not None and "ArtifactTooLarge" in state.failure.error
    assert f"{len(too_big):,} bytes" in state.failure.error and f"{limit:,} bytes" in state.failure.error
    assert isinstance(client.get_or_reserve("big", owner="next"), dibs.Acquired)  # at once, not after a ttl


def test_sqlite_refuses_a_value_over_its_length_limit_before_sending(url_of: Any) -> None:
    # It raised sqlalchemy's DataError ("string or blob too big"), left the key held and lost the value.
    limit = 100_000
    store = SQLStore(url_of("sqlite"))
    sa.event.listen(
        store.engine, "connect", lambda conn, _record: conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, limit)
    )
    client = dibs.Reservations(store, namespace="limits.size", serializer="bytes", ttl=600)
    _assert_refused_and_released(client, b"x" * (limit + 1), limit)
    fits = b"y" * (limit // 2)
    assert client.run("small", lambda: fits) == fits and client.status("small").status == "done"
    client.close()


class _Namespace(enum.StrEnum):
    LONG = ".".join(["limits", *["n" * 60] * 3])  # 193 characters


class _Name(str):
    """A name of a ``str`` subclass: validation and NFC normalisation keep its type."""


def _real_size(value: Any) -> int:
    """The bytes a value takes as text in a statement (PyMySQL writes a float as repr, plus ``e0``
    when the repr has no exponent)."""
    if isinstance(value, float):
        text = repr(value)
        return len(text) + (0 if "e" in text else 2)
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    return len(str(value).encode())


def test_the_size_estimate_is_never_below_the_real_size() -> None:
    # A str subclass (a StrEnum namespace) counted as a number (24 bytes), so the bound came in under
    # the real size and MySQL dropped the connection instead of the complete being refused.
    values: dict[str, Any] = {
        "p_namespace": _Namespace.LONG,
        "p_name": _Name("é" * 1024),
        "p_owner": "ö" * 100,
        "p_none": None,
        "p_true": True,
        "p_int": -(2**63),
        "p_big": 10**40,
        "p_float": -1.2345678901234567e-300,
        "p_float_plain": -0.00012345678901234567,
        "p_decimal": decimal.Decimal("1." + "9" * 60),
        "p_bytes": b"\xff" * 40,
        "p_payload": b"not counted",
    }
    for name, value in values.items():
        if name != "p_payload":
            assert sql_limits.others_size({name: value}) >= _real_size(value), name
    real = sum(_real_size(v) for name, v in values.items() if name != "p_payload")
    assert sql_limits.others_size(values) >= real


def test_sqlite_counts_a_long_key_of_a_str_subclass_against_its_length_limit(url_of: Any) -> None:
    # The payload alone fits; with the key it does not: the complete is refused before sending.
    limit = 100_000
    store = SQLStore(url_of("sqlite"))
    sa.event.listen(
        store.engine, "connect", lambda conn, _record: conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, limit)
    )
    payload = b"x" * (limit - sql_limits._ROW_OVERHEAD - 2000)
    for key, refused in (
        (Key("limits.size", "short"), False),
        (Key(_Namespace.LONG, _Name("é" * 1024)), True),
    ):
        got = store.acquire(key, AcquireRequest("alice", 600))
        assert isinstance(got, Granted)
        artifact = NewArtifact("bytes", payload, checksum(payload))
        if refused:
            with pytest.raises(dibs.ArtifactTooLarge):
                store.complete(key, got.lease.token, artifact)
            assert store.read(key).artifact is None
        else:
            assert store.complete(key, got.lease.token, artifact).size == len(payload)
    store.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgres", "mysql", "redis"])
def test_max_artifact_size_is_refused_before_sending_on_every_store(backend: str, url_of: Any) -> None:
    client = dibs.Reservations(
        _with(url_of(backend), "max_artifact_size=5000"), namespace="limits.size", serializer="bytes"
    )
    _assert_refused_and_released(client, b"x" * 5001, 5000)
    assert client.run("fits", lambda: b"y" * 5000) == b"y" * 5000
    assert client.status("fits").status == "done"
    client.close()


def test_postgres_knows_its_bytea_limit(url_of: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # Not 1 GB in a test: the same check, with the limit lowered.
    monkeypatch.setattr(sql_limits, "POSTGRES_MAX_BYTEA", 4096)
    client = dibs.Reservations(url_of("postgres"), namespace="limits.size", serializer="bytes")
    _assert_refused_and_released(client, b"x" * 4097, 4096)
    client.close()


def test_redis_reads_its_limits_from_the_server_and_assumes_the_default_when_refused(
    url_of: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import redis as redis_py

    url = url_of("redis")
    store = open_store(url)
    assert isinstance(store, RedisStore)
    admin = redis_py.Redis.from_url(url.split("?", 1)[0])
    bulk = int(admin.config_get("proto-max-bulk-len")["proto-max-bulk-len"])
    buffer = int(admin.config_get("client-query-buffer-limit")["client-query-buffer-limit"])
    admin.close()
    assert store.value_limit() == min(bulk, buffer - 4096)
    store.close()

    refused = open_store(url)
    assert isinstance(refused, RedisStore)

    def no_config(*_args: object) -> None:
        raise redis_py.exceptions.ResponseError("unknown command 'CONFIG'")

    monkeypatch.setattr(refused._reach.client(), "config_get", no_config)
    assert refused.value_limit() == redis_module.DEFAULT_VALUE_LIMIT
    refused.close()
    assert RedisStore(_with(url, "max_artifact_size=10")).value_limit() == 10


# -- 7. silent network just before complete ---------------------------------------------------------------


@pytest.mark.parametrize("backend", ["postgres", "mysql"])
def test_complete_over_a_silent_network_fails_within_the_timeout(backend: str, url_of: Any) -> None:
    # PostgreSQL blocked (no client-side timeout); PyMySQL had none either.
    from reliability.faults import FaultProxy

    url = url_of(backend)
    server = urlsplit(url)
    assert server.hostname is not None and server.port is not None
    with FaultProxy(server.hostname, server.port) as proxy:
        proxied = url.replace(f"{server.hostname}:{server.port}", f"127.0.0.1:{proxy.port}", 1)
        store = SQLStore(_with(proxied, "timeout=1"))
        key = Key("limits.time", "k")
        got = store.acquire(key, AcquireRequest("alice", 600))
        assert isinstance(got, Granted)
        proxy.stall(3600)  # the network goes silent: nothing is lost, nothing arrives
        outcome: list[BaseException | object] = []

        def complete() -> None:
            try:
                outcome.append(
                    store.complete(key, got.lease.token, NewArtifact("bytes", b"v", checksum(b"v")))
                )
            except BaseException as exc:  # reported below
                outcome.append(exc)

        caller = threading.Thread(target=complete, daemon=True)
        caller.start()
        caller.join(timeout=120)  # a liveness guard only: the bound is 1 s
        assert outcome, "complete is still blocked on a silent network"
        error = outcome[0]
        assert isinstance(error, dibs.StoreUnavailable), error
        assert "timeout (1s" in str(error) and "?timeout=" in str(error)
        # The next call needs a new connection: its attempt gives up too (connect_timeout).
        with pytest.raises(dibs.StoreUnavailable):
            store.versions([key])
        store.close()


def test_timeout_option_is_checked() -> None:
    with pytest.raises(dibs.ConfigurationError, match="timeout='soon' must be a number of seconds"):
        SQLStore("postgresql+psycopg://u@db/x?timeout=soon")
    with pytest.raises(dibs.ConfigurationError, match="max_artifact_size='-1'"):
        SQLStore("postgresql+psycopg://u@db/x?max_artifact_size=-1")


# -- 9. MariaDB: deadlocks, and a record that changes right after complete -----------------------------------


class _FailFirst:
    """Wraps a prepared statement: the first ``times`` calls raise ``error``, then it runs."""

    def __init__(self, prepared: Any, error: BaseException, times: int = 1) -> None:
        self._prepared, self._error, self.left = prepared, error, times

    def __getattr__(self, name: str) -> Any:
        return getattr(self._prepared, name)

    def execute(self, cursor: Any, values: Any) -> int:
        if self.left > 0:
            self.left -= 1
            raise self._error
        return int(self._prepared.execute(cursor, values))


def _deadlock() -> BaseException:
    import pymysql

    return pymysql.err.OperationalError(
        1213, "Deadlock found when trying to get lock; try restarting transaction"
    )


@pytest.mark.parametrize("operation", ["complete", "release", "acquire"])
def test_a_mariadb_deadlock_is_retried(operation: str, url_of: Any) -> None:
    # One StoreUnavailable("(1213, 'Deadlock found...')") reached a caller under a concurrent prune.
    store = SQLStore(url_of("mysql"))
    key = Key("limits.deadlock", "k")
    got = store.acquire(key, AcquireRequest("alice", 600))
    assert isinstance(got, Granted)
    if operation == "complete":
        store._complete = _FailFirst(store._complete, _deadlock())  # type: ignore[assignment]
        assert (
            store.complete(key, got.lease.token, NewArtifact("bytes", b"v", checksum(b"v"))).fence
            == got.lease.token.fence
        )
        assert store.read(key).artifact is not None
    elif operation == "release":
        store._release = _FailFirst(store._release, _deadlock())  # type: ignore[assignment]
        store.release(key, got.lease.token)
        assert store.read(key).lease is None
    else:
        store._swap_row = _FailFirst(store._swap_row, _deadlock())  # type: ignore[assignment]
        assert isinstance(store.acquire(key, AcquireRequest("alice", 600)), Granted)
    store.close()


def test_a_deadlock_that_persists_is_reported(url_of: Any) -> None:
    store = SQLStore(url_of("mysql"))
    key = Key("limits.deadlock", "k")
    got = store.acquire(key, AcquireRequest("alice", 600))
    assert isinstance(got, Granted)
    store._release = _FailFirst(store._release, _deadlock(), times=100)  # type: ignore[assignment]
    with pytest.raises(dibs.StoreUnavailable, match="Deadlock found"):
        store.release(key, got.lease.token)
    assert store._release.left == 100 - sql_translate.ROLLED_BACK_ATTEMPTS  # type: ignore[attr-defined]
    store.close()


class _ThenPrune:
    """Runs ``complete``'s statement, then removes the row at once, as a concurrent prune would."""

    def __init__(self, store: SQLStore, key: Key) -> None:
        self._prepared, self._store, self._key = store._complete, store, key

    def __getattr__(self, name: str) -> Any:
        return getattr(self._prepared, name)

    def execute(self, cursor: Any, values: Any) -> int:
        matched = int(self._prepared.execute(cursor, values))
        with self._store.engine.connect() as conn:
            t = self._store.t
            conn.execute(sa.delete(t).where(t.c.key_hash == self._key.digest))
        return matched


@pytest.mark.parametrize("backend", ["mysql", "postgres", "sqlite"])
def test_complete_reports_a_stored_artifact_even_if_it_is_removed_at_once(backend: str, url_of: Any) -> None:
    # MariaDB read the row back after the update: a prune in between made a stored artifact read as
    # "computed, but not stored ... released".
    store = SQLStore(url_of(backend))
    key = Key("limits.race", "k")
    got = store.acquire(key, AcquireRequest("alice", 600))
    assert isinstance(got, Granted)
    if not store._complete.columns:  # with RETURNING there is no second statement to race with
        store._complete = _ThenPrune(store, key)  # type: ignore[assignment]
    artifact = store.complete(key, got.lease.token, NewArtifact("bytes", b"v", checksum(b"v")))
    assert artifact.fence == got.lease.token.fence and artifact.producer == "alice"
    assert artifact.payload == b"v" and artifact.checksum == checksum(b"v") and artifact.size == 1
    store.close()


def test_complete_returns_what_a_read_returns(url_of: Any) -> None:
    store = SQLStore(url_of("mysql"))
    key = Key("limits.race", "same")
    got = store.acquire(key, AcquireRequest("alice", 600))
    assert isinstance(got, Granted)
    assert (
        store.complete(key, got.lease.token, NewArtifact("bytes", b"v", checksum(b"v")))
        == store.read(key).artifact
    )
    store.close()


# -- 8. connections of waiting processes --------------------------------------------------------------------

PROCESSES = 30 if full_size() else 3
THREADS = 4
# The reduced size also makes each process open its whole pool at once (3 connections), so that the
# test fails where idle connections are never closed; at full size that burst alone (30 x 4) would
# take the shared server's max_connections of 100, so there the processes only wait, as in the issue.
BURST = not full_size()


def _waiting_process(url: str, ready: Any, results: Any, burst: bool = True) -> None:
    """A process whose threads ask at once (a burst that opens every pooled connection, unless
    ``burst`` is false), then wait."""
    from dibs.runtime import runtime

    client = dibs.Reservations(url, namespace="limits.connections", ttl=300)
    store: Any = client.store
    barrier = threading.Barrier(3)

    def burst_call() -> None:
        with store._cursor() as cursor:
            barrier.wait(timeout=60)
            cursor.execute("SELECT 1")

    bursting = [threading.Thread(target=burst_call) for _ in range(3 if burst else 0)]
    for thread in bursting:
        thread.start()
    for thread in bursting:
        thread.join()
    outcomes: list[str] = []

    def wait() -> None:
        try:
            outcomes.append(type(client.acquire("popular", timeout=300)).__name__)
        except Exception as exc:  # reported to the parent
            outcomes.append(f"{type(exc).__name__}: {exc}")

    waiters = [threading.Thread(target=wait) for _ in range(THREADS)]
    for thread in waiters:
        thread.start()
    hub = runtime().hub(store)
    while hub is None or hub.waiters < THREADS:
        if outcomes:
            break
        threading.Event().wait(0.02)
        hub = runtime().hub(store)
    ready.put(True)
    for thread in waiters:
        thread.join()
    results.put(outcomes)
    client.close()


def test_a_waiting_process_holds_at_most_two_postgres_connections(tmp_path: Path) -> None:
    # Waiting processes kept 3.3 to 3.75 connections each (the pool never let go of one), and 30 of
    # them made the server refuse clients.
    from tests.scale import tagged_url

    with tagged_url("postgres", tmp_path) as (url, tag):
        holder = dibs.Reservations(url, namespace="limits.connections", ttl=300)
        got = holder.get_or_reserve("popular", owner="holder")
        assert isinstance(got, dibs.Acquired)
        ready, results = SPAWN.Queue(), SPAWN.Queue()
        processes = [
            SPAWN.Process(target=_waiting_process, args=(url, ready, results)) for _ in range(PROCESSES)
        ]
        for process in processes:
            process.start()
        try:
            for _ in processes:
                ready.get(timeout=300)
            # The holder's own process holds one pooled connection too (no listener: it never waited).
            bound = 2 * PROCESSES + 1

            def settled() -> bool:
                time.sleep(0.2)  # each look is a connection of its own: not too often
                count = server_connections("postgres", tag)
                return count is not None and count <= bound

            wait_until(settled, f"every waiting process to hold at most 2 connections ({bound} in all)")
            got.lease.complete({"rows": 42})
            outcomes = [results.get(timeout=300) for _ in processes]
        finally:
            for process in processes:
                process.join(timeout=60)
                if process.is_alive():
                    process.kill()
            holder.close()
    assert all(outcome == ["Hit"] * THREADS for outcome in outcomes), outcomes


def test_too_many_clients_says_what_to_change() -> None:
    import psycopg

    store = SQLStore("postgresql+psycopg://u@db.invalid/x?pool_size=2")
    error = store._unavailable(
        psycopg.OperationalError("connection failed: FATAL:  sorry, too many clients already")
    )
    assert "pool_size" in str(error) and "up to 2" in str(error)
    assert "PgBouncer" in str(error) and "listen_url" in str(error) and "docs/deploy.md" in str(error)
    store.close()

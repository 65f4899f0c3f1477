"""What the worker processes run (see :mod:`benchmarks.pool`); importable under ``spawn``."""

from __future__ import annotations

import json
import multiprocessing.connection
import os
import time
from pathlib import Path
from typing import Any

import dibs
from benchmarks.anchors import manager_for
from benchmarks.notify_fanout import Listener
from benchmarks.pool import WorkerContext
from benchmarks.proxies import PollingStore
from benchmarks.raw import RawPrimitive, open_raw
from dibs.stores import open_store

_CLIENTS: dict[tuple[str, str, str], dibs.Reservations] = {}
_RAWS: dict[tuple[str, str], RawPrimitive] = {}
_PREFECT: dict[str, Any] = {}
_LISTENERS: dict[str, Listener] = {}


def client_for(url: str, mode: str, namespace: str, ttl: float = 60.0) -> dibs.Reservations:
    """A cached client; ``mode`` ``"push"`` uses the store as configured, ``"poll"`` forces polling."""
    cache_key = (url, mode, namespace)
    client = _CLIENTS.get(cache_key)
    if client is None:
        store = open_store(url)
        client = dibs.Reservations(
            PollingStore(store) if mode == "poll" else store, namespace=namespace, ttl=ttl
        )
        _CLIENTS[cache_key] = client
    return client


def close_clients(ctx: WorkerContext, *, urls: list[str]) -> int:
    """Close the cached clients of ``urls`` (their servers are about to stop: no hub left listening)."""
    for cache_key in [k for k in _CLIENTS if k[0] in urls]:
        _CLIENTS.pop(cache_key).store.close()
    return os.getpid()


def close_all() -> None:
    for client in _CLIENTS.values():
        client.store.close()
    _CLIENTS.clear()
    for raw in _RAWS.values():
        raw.close()
    _RAWS.clear()
    for listener in _LISTENERS.values():
        listener.close()
    _LISTENERS.clear()


def warm(ctx: WorkerContext, *, url: str, mode: str, namespace: str, store: str | None = None) -> int:
    """Open (and cache) the client, and the raw baseline of ``store`` if given, so that the first
    measured round pays no connection set-up or lazy import."""
    client = client_for(url, mode, namespace)
    client.status(f"warm-{os.getpid()}")
    if store is not None:
        raw_for(store, url)
    return os.getpid()


def raw_for(store: str, url: str) -> RawPrimitive:
    raw = _RAWS.get((store, url))
    if raw is None:
        raw = _RAWS[(store, url)] = open_raw(store, url)
    return raw


def handoff_wait(
    ctx: WorkerContext, *, url: str, mode: str, namespace: str, key: str, expected: str
) -> float:
    """Wait for ``key`` (held by the parent) to complete; the monotonic time the artifact arrived."""
    client = client_for(url, mode, namespace)
    ctx.ready()
    got = client.acquire(key, owner=f"waiter-{os.getpid()}", timeout=120)
    arrived = time.monotonic()
    if not isinstance(got, dibs.Hit) or got.value != expected:
        raise AssertionError(f"waiter expected the artifact {expected!r}, got {got!r}")
    return arrived


def _listener(spec: dict[str, Any]) -> Listener:
    cache_key = json.dumps(spec, sort_keys=True)
    listener = _LISTENERS.get(cache_key)
    if listener is None:
        listener = _LISTENERS[cache_key] = Listener(spec)
    return listener


def raw_notify_warm(ctx: WorkerContext, *, spec: dict[str, Any]) -> int:
    """Start listening (:mod:`benchmarks.notify_fanout`) before anything is timed."""
    _listener(spec)
    return os.getpid()


def raw_notify_wait(ctx: WorkerContext, *, spec: dict[str, Any], key: str, expected: str) -> float:
    """Wait for the raw notification of ``key`` and read its value once; the monotonic time it arrived."""
    listener = _listener(spec)
    ctx.ready()
    value = listener.wait(key)
    arrived = time.monotonic()
    if value != expected:
        raise AssertionError(f"raw listener expected {expected!r}, got {value!r}")
    return arrived


def _lock_manager(spec: dict[str, Any]) -> Any:
    """A cached Prefect lock manager (see :mod:`benchmarks.anchors`)."""
    cache_key = json.dumps(spec, sort_keys=True)
    manager = _PREFECT.get(cache_key)
    if manager is None:
        manager = _PREFECT[cache_key] = manager_for(spec)
    return manager


def prefect_wait(
    ctx: WorkerContext, *, manager: dict[str, Any], lock: str, result: str, expected: str
) -> float:
    """A Prefect lock manager's waiter: ``wait_for_lock``, then read the holder's result file."""
    lock_manager = _lock_manager(manager)
    ctx.ready()
    if not lock_manager.wait_for_lock(lock, timeout=120):
        raise AssertionError(f"Prefect lock {lock} was not released in time")
    value = json.loads(Path(result).read_text())
    arrived = time.monotonic()
    if value != expected:
        raise AssertionError(f"Prefect waiter expected {expected!r}, got {value!r}")
    return arrived


def prefect_warm(ctx: WorkerContext, *, managers: list[dict[str, Any]]) -> int:
    """Import Prefect and build the lock managers (and their clients) before anything is timed."""
    for spec in managers:
        lock_manager = _lock_manager(spec)
        lock_manager.is_locked(f"warm-{os.getpid()}")
    return os.getpid()


def lock_takeover_wait(
    ctx: WorkerContext, *, spec: dict[str, Any], key: str, window: float
) -> dict[str, Any]:
    """Ask for a lock whose holder the parent is about to kill, as Prefect's transaction asks (with an
    acquire timeout of ``window``); whether it came, and when."""
    lock_manager = _lock_manager(spec)
    holder = f"successor-{os.getpid()}"
    ctx.ready()
    acquired = lock_manager.acquire_lock(key, holder=holder, acquire_timeout=window)
    at = time.monotonic()
    if acquired:
        lock_manager.release_lock(key, holder=holder)
    return {"acquired": bool(acquired), "at": at}


def race(
    ctx: WorkerContext, *, url: str, mode: str, namespace: str, keys: list[str], start_at: float
) -> dict[str, Any]:
    """``client.run`` every key; which keys this process computed, and when it finished."""
    client = client_for(url, mode, namespace)
    computed: list[str] = []

    def work(key: str) -> str:
        computed.append(key)
        return f"value-of-{key}"

    while time.monotonic() < start_at:
        time.sleep(0.0005)
    wrong = 0
    for key in keys:
        if client.run(key, work, key) != f"value-of-{key}":
            wrong += 1
    return {"computed": computed, "wrong": wrong, "finished": time.monotonic()}


def raw_race(ctx: WorkerContext, *, store: str, url: str, keys: list[str], start_at: float) -> dict[str, Any]:
    """The raw primitive's conditional insert on every key; which this process won, and when it finished."""
    raw = raw_for(store, url)
    owner = f"raw-{os.getpid()}"
    won: list[str] = []
    while time.monotonic() < start_at:
        time.sleep(0.0005)
    for key in keys:
        if raw.claim(key, owner, 60.0) is not None:
            won.append(key)
    return {"computed": won, "wrong": 0, "finished": time.monotonic()}


def takeover_wait(ctx: WorkerContext, *, url: str, namespace: str, key: str) -> dict[str, Any]:
    """Wait to acquire ``key`` from a holder the parent is about to kill; when, and from whom."""
    client = client_for(url, "push", namespace)
    ctx.ready()
    got = client.acquire(key, owner=f"successor-{os.getpid()}", timeout=120)
    acquired = time.monotonic()
    if not isinstance(got, dibs.Acquired):
        raise AssertionError(f"expected to take the lease over, got {got!r}")
    got.lease.release()
    return {"acquired": acquired, "took_over_from": got.took_over_from, "token": got.lease.token}


def hold_forever(
    url: str, namespace: str, key: str, ttl: float, conn: multiprocessing.connection.Connection
) -> None:
    """(A plain ``Process`` target.) Hold ``key`` with heartbeats until killed."""
    client = dibs.Reservations(url, namespace=namespace, ttl=ttl)
    outcome = client.get_or_reserve(key, owner=f"doomed-{os.getpid()}")
    if not isinstance(outcome, dibs.Acquired):
        conn.send(("error", repr(outcome)))
        return
    with outcome.lease.keep_alive():
        conn.send(("holding", time.monotonic()))
        while True:
            time.sleep(1)


def ping(ctx: WorkerContext) -> int:
    """Nothing: a started worker proves it runs (and has imported dibs)."""
    return os.getpid()

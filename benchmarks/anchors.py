"""Prefect's own lock managers, measured beside dibs: the anchors of the hand-off benchmark.

Prefect's SERIALIZABLE isolation takes a lock per cache key through a ``LockManager``: Prefect ships
``FileSystemLockManager`` (one machine) and prefect-redis ships ``RedisLockManager``. Both are
measured the way the hand-off benchmark measures dibs (``hand-off``: the holder holds the lock, N
waiter processes ``wait_for_lock`` and then read the holder's result), and both are put through the
takeover benchmark's question (``after SIGKILL``): a holder process takes the lock as Prefect's
transaction does (``acquire_lock(key, holder)``, no hold timeout: Prefect passes none) and is
SIGKILLed; does a waiter in ``acquire_lock(key, holder, acquire_timeout=W)`` ever get the lock, and
when? The same for prefect-dibs's ``DibsLockManager`` on the Redis store (ttl as in the takeover
benchmark), which expires a dead holder's lock after its ttl.

A manager is described by a small dict (``kind`` plus where it keeps its locks), so that worker and
holder processes build their own.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
import urllib.parse
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.pool import Pool, process_context
from benchmarks.settings import Settings
from benchmarks.stats import summarize

__all__ = ["LABELS", "after_sigkill", "cleanup", "manager_for", "redis_spec"]

LABELS = {
    "filesystem": "Prefect FileSystemLockManager",
    "redis": "prefect-redis RedisLockManager",
    "dibs": "prefect-dibs DibsLockManager (Redis store)",
}
#: How each one's waiters learn that the lock is free.
WAKE_UPS = {
    "filesystem": "poll 100 ms",
    "redis": "poll 100 ms",
    "dibs": "watch hub",
}
#: Where the benchmark's lock keys start (Redis: ``lock:<key>``), so that leftovers can be found.
KEY_PREFIX = "dibs-bench-anchor-"


def redis_spec(url: str) -> dict[str, Any]:
    """A RedisLockManager on the server of the Redis store at ``url`` (host, port, database, user)."""
    parts = urllib.parse.urlsplit(url)
    return {
        "kind": "redis",
        "host": parts.hostname or "localhost",
        "port": parts.port or 6379,
        "db": int(parts.path.strip("/") or 0),
        "username": urllib.parse.unquote(parts.username) if parts.username else None,
        "password": urllib.parse.unquote(parts.password) if parts.password else None,
    }


def manager_for(spec: dict[str, Any]) -> Any:
    """The lock manager ``spec`` describes (Prefect is imported here, in the process that uses it)."""
    kind = spec["kind"]
    if kind == "filesystem":
        from prefect.locking.filesystem import FileSystemLockManager

        return FileSystemLockManager(Path(spec["lock_dir"]))
    if kind == "redis":
        from prefect_redis.locking import RedisLockManager

        options = {name: spec[name] for name in ("host", "port", "db", "username", "password")}
        return RedisLockManager(**options)
    if kind == "dibs":
        from prefect_dibs import DibsLockManager

        return DibsLockManager(spec["url"], namespace="bench.anchor", ttl=spec["ttl"])
    raise ValueError(f"unknown lock manager kind {kind!r}")


def cleanup(spec: dict[str, Any], run_id: str) -> None:
    """Remove the Redis locks this run left (a SIGKILLed holder's lock never expires)."""
    if spec["kind"] != "redis":
        return
    import redis

    options = {name: spec[name] for name in ("host", "port", "db", "username", "password")}
    client = redis.Redis(**options)
    try:
        doomed = list(client.scan_iter(match=f"lock:{KEY_PREFIX}{run_id}*", count=500))
        if doomed:
            client.delete(*doomed)
    finally:
        client.close()


def hold_lock_forever(spec: dict[str, Any], key: str, conn: Any) -> None:
    """(A plain ``Process`` target.) Take the lock as Prefect's transaction does; hold it until killed."""
    manager = manager_for(spec)
    if not manager.acquire_lock(key, holder=f"doomed-{os.getpid()}", acquire_timeout=30):
        conn.send(("error", "could not take the lock"))
        return
    conn.send(("holding", time.monotonic()))
    while True:
        time.sleep(1)


def _expiry(spec: dict[str, Any], key: str) -> str:
    """What the store says about the dead holder's lock: when (if ever) it expires."""
    if spec["kind"] == "redis":
        import redis

        options = {name: spec[name] for name in ("host", "port", "db", "username", "password")}
        client = redis.Redis(**options)
        try:
            left = client.pttl(f"lock:{key}")
        finally:
            client.close()
        return "no expiry (PTTL -1)" if left == -1 else f"PTTL {left} ms"
    if spec["kind"] == "filesystem":
        manager = manager_for(spec)
        path = manager._lock_path_for_key(key)
        try:
            record = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            return "no lock file"
        return f"lock file expiration {record.get('expiration')!r}"
    return f"ttl {spec['ttl']:g} s after the last heartbeat"


def _killed_once(
    pool: Pool, spec: dict[str, Any], key: str, *, window: float, ttl: float, rng: random.Random
) -> dict[str, Any]:
    context = process_context()
    parent, child = context.Pipe()
    holder = context.Process(target=hold_lock_forever, args=(spec, key, child), daemon=True)
    holder.start()
    child.close()
    try:
        if not parent.poll(300):
            raise RuntimeError(f"the {spec['kind']} lock holder did not report within 300 s")
        kind, detail = parent.recv()
        if kind != "holding":
            raise RuntimeError(f"the {spec['kind']} lock holder failed: {detail}")
        pool.start(0, "lock_takeover_wait", spec=spec, key=key, window=window)
        pool.wait_ready(0)
        time.sleep(0.2 + rng.uniform(0, ttl / 3))  # a random heartbeat phase for the dibs holder
        killed = time.monotonic()
        assert holder.pid is not None
        os.kill(holder.pid, signal.SIGKILL)
        holder.join()
        expiry = _expiry(spec, key)
        outcome = pool.result(0, timeout=window + 300)
    finally:
        if holder.is_alive():
            holder.kill()
        holder.join()
        parent.close()
    return {
        "acquired": outcome["acquired"],
        "latency_s": outcome["at"] - killed,
        "expiry": expiry,
    }


def after_sigkill(
    pool: Pool, specs: dict[str, dict[str, Any]], settings: Settings, log: Callable[[str], None]
) -> dict[str, Any]:
    """Each manager's waiters after their holder is SIGKILLed: got the lock or not, and when."""
    ttl, window = settings.takeover_ttl, settings.lock_kill_window
    rng = random.Random(5)
    run_id = uuid.uuid4().hex[:8]
    results: dict[str, Any] = {"window_s": window, "ttl_s": ttl, "managers": {}}
    for kind, spec in specs.items():
        try:
            runs = [
                _killed_once(
                    pool, spec, f"{KEY_PREFIX}{run_id}-kill-{kind}-{number}", window=window, ttl=ttl, rng=rng
                )
                for number in range(settings.lock_kill_repeats)
            ]
        finally:
            cleanup(spec, run_id)
        got = [run["latency_s"] for run in runs if run["acquired"]]
        row = {
            "label": LABELS[kind],
            "repeats": len(runs),
            "acquired": len(got),
            "latency_s": summarize(got).to_dict(),
            "expiry": runs[-1]["expiry"] if runs else "-",
        }
        results["managers"][kind] = row
        took = f"median {row['latency_s']['median']:.2f} s" if got else f"not within {window:g} s"
        log(f"lock manager after SIGKILL, {kind}: {len(got)}/{len(runs)} waiters got the lock ({took})")
    return results

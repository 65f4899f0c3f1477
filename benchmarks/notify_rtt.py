"""The stores' own notification round trip, the floor a push hand-off is measured against (issue 20).

One process, two threads, as the watch hub has them: a listener waits for the store's notification and
then reads one value, as the hub reads the changed key; the notifier sends and records when. Each
sample is the time from just before the notification is sent to the listener's read having returned:

* PostgreSQL: ``NOTIFY`` on one connection, ``LISTEN`` on another (woken by ``notifies()``), then one
  ``SELECT``;
* Redis: ``PUBLISH`` from one client, a pattern subscription's message on another, then one ``GET``;
* SQLite: a committed ``INSERT`` on one connection, another connection's ``PRAGMA data_version``
  polled every 0.5 ms (dibs probes every 4 ms), then one ``SELECT``.
"""

from __future__ import annotations

import sqlite3
import statistics
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.raw import _postgres_parts
from benchmarks.stats import percentile

SAMPLES = 40


def _run(
    listen: Callable[[threading.Event], None], notify: Callable[[], object], samples: int
) -> list[float]:
    """``listen(ready)`` blocks until one notification has arrived and the read is done."""
    times: list[float] = []

    def listener(ready: threading.Event, done: threading.Event, arrived: list[float]) -> None:
        listen(ready)
        arrived.append(time.monotonic())
        done.set()

    for _ in range(samples):
        ready, done = threading.Event(), threading.Event()
        arrived: list[float] = []
        thread = threading.Thread(target=listener, args=(ready, done, arrived), name="bench-notify-listener")
        thread.start()
        ready.wait(10)
        time.sleep(0.002)  # the listener is parked in its wait
        sent = time.monotonic()
        notify()
        done.wait(10)
        thread.join(10)
        if arrived:
            times.append(arrived[0] - sent)
    return times


def _postgres(url: str, samples: int) -> list[float]:
    import psycopg

    conninfo, _ = _postgres_parts(url)
    channel = f"bench_rtt_{uuid.uuid4().hex[:8]}"
    listener = psycopg.connect(conninfo, autocommit=True)
    notifier = psycopg.connect(conninfo, autocommit=True)
    try:
        listener.execute(f"LISTEN {channel}")

        def listen(ready: threading.Event) -> None:
            ready.set()
            for _ in listener.notifies(timeout=10, stop_after=1):
                pass
            listener.execute("SELECT 1").fetchone()

        return _run(listen, lambda: notifier.execute(f"NOTIFY {channel}, 'k'"), samples)
    finally:
        listener.close()
        notifier.close()


def _redis(url: str, samples: int) -> list[float]:
    import redis

    parts = urllib.parse.urlsplit(url)
    plain = urllib.parse.urlunsplit(parts._replace(query=""))
    prefix = f"bench-rtt-{uuid.uuid4().hex[:8]}:"
    client, reader = redis.Redis.from_url(plain), redis.Redis.from_url(plain)
    pubsub = reader.pubsub(ignore_subscribe_messages=True)
    pubsub.psubscribe(prefix + "*")
    try:

        def listen(ready: threading.Event) -> None:
            ready.set()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if pubsub.get_message(timeout=1.0) is not None:
                    break
            reader.get(prefix + "value")

        return _run(listen, lambda: client.publish(prefix + "k", "x"), samples)
    finally:
        pubsub.close()
        client.close()
        reader.close()


def _sqlite(samples: int) -> list[float]:
    folder = Path(tempfile.mkdtemp(prefix="dibs-bench-rtt-"))
    path = folder / "rtt.db"
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    writer.execute("PRAGMA journal_mode = WAL")
    writer.execute("CREATE TABLE t (v INTEGER)")
    reader = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:

        def listen(ready: threading.Event) -> None:
            seen = reader.execute("PRAGMA data_version").fetchone()[0]
            ready.set()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if reader.execute("PRAGMA data_version").fetchone()[0] != seen:
                    break
                time.sleep(0.0005)
            reader.execute("SELECT count(*) FROM t").fetchone()

        return _run(listen, lambda: writer.execute("INSERT INTO t VALUES (1)"), samples)
    finally:
        reader.close()
        writer.close()
        for leftover in folder.iterdir():
            leftover.unlink()
        folder.rmdir()


def measure(family: str, url: str, samples: int = SAMPLES) -> dict[str, Any] | None:
    """p50 / p99 (ms) of the raw notification round trip of the store ``family``; ``None`` for a store
    without notifications (its hub polls)."""
    if family == "postgres":
        times = _postgres(url, samples)
    elif family == "redis":
        times = _redis(url, samples)
    elif family == "sqlite":
        times = _sqlite(samples)
    else:
        return None
    if not times:
        return None
    return {
        "p50_ms": statistics.median(times) * 1e3,
        "p99_ms": percentile(times, 99) * 1e3,
        "samples": len(times),
    }

"""5. Waiter load: what a waiting process asks the store while a key stays busy for a long time.

Since the watch hub, load is per process: a process's waiters share one store object and one hub,
the hub follows the store with one change feed, and each waiter only asks the store itself as a
backstop. So the benchmark plays waiting processes: each is one store object behind a counting proxy
(:class:`~benchmarks.proxies.CountingStore`, which gets its own hub, as a process does) with either
**one** waiter or **many** (``waiter_threads``, each on a key of its own), all waiting with
``Reservations.acquire(timeout=W)`` in threads of this process, on keys the benchmark holds (a long
ttl, so no heartbeat is needed). Modes: ``push`` (the store as configured: its waiters are woken by
the hub) and ``poll`` (:class:`~benchmarks.proxies.PollingStore`'s behaviour: no hub, each waiter asks
with the capped backoff).

Counted per waiting process:

* **store requests**: every call through the Store interface (the waiters' ``acquire`` and ``read``,
  the hub's batched ``read_many``); the rate over the whole wait and in the steady state (its second
  half, after the backoff has grown to its cap: requests there over the time they span), in total
  and per waiter;
* **the feed's own looks**, apart: they are one stream per process whatever the number of waiters. A
  polling feed's ``tokens`` (MySQL's versions query, Azure's ETag HEADs or listing, the file store's
  ``stat`` of each watched record, SQLite's versions query) and ``probe`` (SQLite's ``data_version``,
  read from shared memory, never a server), and among the probes those that an inotify watch on
  SQLite's ``-wal`` file woke (Linux; the others are its 0.1 s backstop). PostgreSQL's ``LISTEN``
  and Redis's ``PSUBSCRIBE`` send nothing while nothing changes.

For SQL stores the statements SQLAlchemy runs are also counted (``before_cursor_execute``), for
information: the store's prepared statements run on DBAPI cursors, so the proxy's count is the one
that matters.
"""

from __future__ import annotations

import collections
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import dibs
from benchmarks.proxies import CountingStore
from benchmarks.settings import Settings
from benchmarks.targets import Target
from dibs.stores import open_store

NAMESPACE = "bench.waiters"


class _Process:
    """One simulated waiting process: a counted store, its client, and the keys its waiters wait on."""

    def __init__(self, target: Target, mode: str, keys: list[str]) -> None:
        self.target = target
        self.mode = mode
        self.store = CountingStore(open_store(target.url), polling=mode == "poll")
        self.statements: collections.Counter[str] = collections.Counter()
        engine = getattr(self.store.inner, "engine", None)
        if engine is not None:
            import sqlalchemy as sa

            def count_statement(*_: Any, _counter: collections.Counter[str] = self.statements) -> None:
                _counter["statements"] += 1

            sa.event.listen(engine, "before_cursor_execute", count_statement)
        self.client = dibs.Reservations(self.store, namespace=NAMESPACE, ttl=60)
        self.keys = [self.client.key(name) for name in keys]

    def report(self, started: float, ended: float, seconds: float) -> dict[str, Any]:
        half = started + (ended - started) / 2
        total = len(self.store.query_times(started, ended + 1))
        # Each waiter's last request is the one its deadline forces (its pause cut short): not steady.
        steady = self.store.query_times(half, ended - 0.5)
        span = steady[-1] - steady[0] if len(steady) > 1 else 0.0
        steady_rate = (len(steady) - 1) / span if span > 0 else 0.0
        looks = self.store.feed_looks(started, ended + 1)
        waiters = len(self.keys)
        return {
            "waiters": waiters,
            "queries": total,
            "queries_per_s": total / seconds,
            "steady_queries_per_s": steady_rate,
            "steady_queries_per_s_per_waiter": steady_rate / waiters,
            "hub_reads": len([t for t in self.store.calls.get("read_many", []) if started <= t]),
            "feed_tokens_per_s": looks["feed.tokens"] / seconds,
            "feed_probes_per_s": looks["feed.probe"] / seconds,
            "feed_inotify_per_s": looks["feed.inotify"] / seconds,
            "feed_keys_per_look": (
                self.store.feed_keys_looked_at / looks["feed.tokens"] if looks["feed.tokens"] else 0.0
            ),
            "sql_statements_via_sqlalchemy": self.statements.get("statements", 0),
        }


def run(targets: list[Target], settings: Settings, log: Callable[[str], None]) -> dict[str, Any]:
    seconds = settings.waiter_seconds
    many = settings.waiter_threads
    results: dict[str, Any] = {"wait_s": seconds, "many": many, "stores": {}}
    processes: list[_Process] = []
    holders: list[dibs.Reservations] = []
    errors: list[str] = []
    for target in targets:
        holder = dibs.Reservations(target.url, namespace=NAMESPACE, ttl=seconds + 120)
        holders.append(holder)
        for mode in ("push", "poll") if target.pushes else ("poll",):
            for count in (1, many):
                names = [f"{uuid.uuid4().hex[:10]}-{mode}-{count}-{index}" for index in range(count)]
                for name in names:
                    held = holder.get_or_reserve(name, owner="holder")
                    assert isinstance(held, dibs.Acquired), held
                processes.append(_Process(target, mode, names))

    def wait(client: dibs.Reservations, key: dibs.Key) -> None:
        try:
            client.acquire(key, owner="waiter", timeout=seconds)
        except dibs.WaitTimeout:
            return
        except Exception as exc:  # reported after the threads end
            errors.append(f"{key}: {type(exc).__name__}: {exc}")
            return
        errors.append(f"{key}: the waiter got the key although it was held")

    started = time.monotonic()
    threads = [
        threading.Thread(target=wait, args=(process.client, key), daemon=True)
        for process in processes
        for key in process.keys
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ended = time.monotonic()
    for process in processes:
        row = process.report(started, ended, seconds)
        label = "one" if row["waiters"] == 1 else "many"
        results["stores"].setdefault(process.target.name, {}).setdefault(process.mode, {})[label] = row
        log(
            f"waiters {process.target.name} {process.mode} x{row['waiters']}: "
            f"{row['queries_per_s']:.2f} requests/s overall, {row['steady_queries_per_s']:.2f}/s steady "
            f"({row['steady_queries_per_s_per_waiter']:.3f}/s per waiter); feed: "
            f"{row['feed_tokens_per_s']:.1f} looks/s, {row['feed_probes_per_s']:.0f} probes/s, "
            f"{row.get('feed_inotify_per_s', 0.0):.1f} inotify wake-ups/s"
        )
        process.store.close()
    for holder in holders:
        holder.close()
    if errors:
        raise AssertionError("; ".join(errors))
    return results

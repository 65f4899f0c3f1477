"""5. Waiter load: how often a waiter queries the store while a key stays busy for a long time.

The benchmark process holds a key (a long ttl, so no heartbeat is needed) and one waiter per store
and mode waits on it with ``Reservations.acquire(timeout=W)`` through a counting proxy of the
:class:`~dibs.stores.Store` interface, all waiters at once in threads of this process. The proxy
counts every request that reaches the store service (``acquire``, ``read``...); the rate is reported
over the whole wait and in the steady state (its second half, after the backoff has grown to its
cap: the inverse of the mean time between consecutive requests there). Modes: ``push`` (the
store's watch; only stores that notify) and ``poll`` (watch disabled).

Cheap local probes made by some watches are counted separately, because they never reach a server:
SQLite's watch reads ``PRAGMA data_version`` from shared memory, the file store's watch ``stat``\\s the
record. For SQL stores the statements sent are also counted with SQLAlchemy's
``before_cursor_execute`` event where SQLAlchemy runs them (the store's prepared statements run on
DBAPI cursors, so the proxy's count is the one that matters).
"""

from __future__ import annotations

import collections
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import dibs
from benchmarks.proxies import CountingStore
from benchmarks.settings import Settings
from benchmarks.targets import Target
from dibs.stores import open_store

NAMESPACE = "bench.waiters"


@contextmanager
def _counting_probes() -> Iterator[collections.Counter[str]]:
    """Count SQLite data_version probes and file-store stat probes, per store URL / record path."""
    probes: collections.Counter[str] = collections.Counter()
    patches: list[tuple[Any, str, Any]] = []
    try:
        from dibs.stores import sql

        original_probe = sql._DataVersionFeed._data_version

        def counted_probe(self: Any) -> int:
            probes[f"sqlite:{id(self._store)}"] += 1
            return int(original_probe(self))

        patches.append((sql._DataVersionFeed, "_data_version", original_probe))
        sql._DataVersionFeed._data_version = counted_probe  # type: ignore[method-assign]
    except (ImportError, AttributeError):
        pass
    try:
        from dibs.stores import filesystem

        original_signature = filesystem._signature

        def counted_signature(path: Any) -> Any:
            probes[f"file:{path}"] += 1
            return original_signature(path)

        patches.append((filesystem, "_signature", original_signature))
        filesystem._signature = counted_signature
    except (ImportError, AttributeError):
        pass
    try:
        yield probes
    finally:
        for owner, name, original in patches:
            setattr(owner, name, original)


def run(targets: list[Target], settings: Settings, log: Callable[[str], None]) -> dict[str, Any]:
    seconds = settings.waiter_seconds
    results: dict[str, Any] = {"wait_s": seconds, "stores": {}}
    jobs: list[tuple[Target, str, CountingStore, dibs.Reservations, dibs.Key, collections.Counter[str]]] = []
    holders: list[dibs.Reservations] = []
    errors: list[str] = []
    with _counting_probes() as probes:
        for target in targets:
            holder = dibs.Reservations(target.url, namespace=NAMESPACE, ttl=seconds + 120)
            holders.append(holder)
            for mode in ("push", "poll") if target.pushes else ("poll",):
                name = f"{uuid.uuid4().hex[:10]}-{mode}"
                held = holder.get_or_reserve(name, owner="holder")
                assert isinstance(held, dibs.Acquired), held
                store = CountingStore(open_store(target.url), polling=mode == "poll")
                statements: collections.Counter[str] = collections.Counter()
                engine = getattr(store.inner, "engine", None)
                if engine is not None:
                    import sqlalchemy as sa

                    def count_statement(*_: Any, _counter: collections.Counter[str] = statements) -> None:
                        _counter["statements"] += 1

                    sa.event.listen(engine, "before_cursor_execute", count_statement)
                client = dibs.Reservations(store, namespace=NAMESPACE, ttl=60)
                jobs.append((target, mode, store, client, client.key(name), statements))

        started = time.monotonic()

        def wait(client: dibs.Reservations, key: dibs.Key) -> None:
            try:
                client.acquire(key, owner="waiter", timeout=seconds)
            except dibs.WaitTimeout:
                return
            except Exception as exc:  # reported after the threads end
                errors.append(f"{key}: {type(exc).__name__}: {exc}")
                return
            errors.append(f"{key}: the waiter got the key although it was held")

        threads = [threading.Thread(target=wait, args=(job[3], job[4]), daemon=True) for job in jobs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        ended = time.monotonic()
        for target, mode, store, _client, key, statements in jobs:
            half = started + (ended - started) / 2
            total = len(store.query_times(started, ended + 1))
            # The last request is the one the deadline forces (its pause cut short): not steady state.
            steady = store.query_times(half, ended + 1)[:-1]
            steady_rate = (len(steady) - 1) / (steady[-1] - steady[0]) if len(steady) > 1 else 0.0
            local = sum(count for name, count in probes.items() if name == f"sqlite:{id(store.inner)}")
            local += sum(
                count for name, count in probes.items() if name.startswith("file:") and key.digest in name
            )
            row = {
                "queries": total,
                "queries_per_s": total / seconds,
                "steady_queries_per_s": steady_rate,
                "hub_reads": len(store.calls.get("read_many", [])),
                "local_probes_per_s": local / seconds,
                "sql_statements_via_sqlalchemy": statements.get("statements", 0),
            }
            results["stores"].setdefault(target.name, {})[mode] = row
            log(
                f"waiters {target.name} {mode}: {row['queries_per_s']:.2f} queries/s overall, "
                f"{row['steady_queries_per_s']:.2f}/s steady, local probes {row['local_probes_per_s']:.0f}/s"
            )
            store.close()
    for holder in holders:
        holder.close()
    if errors:
        raise AssertionError("; ".join(errors))
    return results

"""What a namespace's history costs the reads a person makes and the per-key calls (issue 30): every
figure a ratio against a baseline measured in the same run.

``python -m benchmarks.history [--sizes 0,10000,100000,1000000] [--stores sqlite,postgres,redis]
[--out benchmarks/results/issue30]``

For each store, one namespace is grown to each size in turn (finished keys; how depends on the store:
SQL bulk-inserts copies of a row dibs wrote, the file store writes copies of a record dibs wrote, Redis
copies a hash dibs wrote with its index entries (:mod:`benchmarks.grow_redis`), Azure writes copies of
a record blob through the store's own record write, from a pool of threads), and at each size it
measures:

* ``top``: one ``dibs top --once`` snapshot (:func:`dibs._cli.top.snapshot`), median of 5 (of 1 when
  one takes over 5 s: a store that scans); the ratio is against the same snapshot at the smallest
  size that has keys;
* ``page``: one ``dibs ls`` page of 100 keys from a cursor in the middle of the namespace, median of 5;
  the ratio likewise;
* ``airflow page``: what the Reservations page reads of a store and namespace with no task waiting
  (:func:`dibs_provider.plugins._keys._page_in`: each status a page at a time until 500 rows);
* ``ls``: records per second of a streamed ``dibs ls`` (pages of 1,000), over the first 100,000 (or
  20 s);
* ``new key``: ``acquire`` + ``complete`` of a fresh key in the grown namespace, interleaved operation
  by operation with the same on an empty namespace of its own store (the baseline): p50 and the ratio
  of p50s;
* ``hit``: ``acquire`` of a finished key (an artifact found), interleaved the same way;
* on PostgreSQL, the bytes of WAL a new key writes on each side, the two measured one after the other;
* ``prune``: keys per second of ``prune(0)`` clearing a namespace of 10,000 finished keys beside the
  grown one, and the same store removing 1,000 keys one call per key (SQL: a read and a guarded
  ``UPDATE`` per key, as prune did before; other stores: ``forget``): a ratio.

Nothing here is a threshold: the machine may be busy, so compare ratios of one run, not runs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import dibs
from benchmarks.targets import open_targets
from dibs._cli.top import snapshot
from dibs.keys import Key
from dibs.records import Granted, KeyState, checksum
from dibs.stores import AcquireRequest, NewArtifact, Store, codec, open_store, pages, transitions
from dibs.stores.filesystem import FileStore
from dibs.stores.name_index import Layout
from dibs.stores.sql import SQLStore

NAMESPACE = "history"
PRUNED = "history.pruned"
#: How many records ``ls`` throughput streams at most (the rate, not the whole history, is the point).
LS_UP_TO = 100_000
#: How long ``ls`` throughput streams at most: a store that scans re-reads the namespace for each page.
LS_SECONDS = 20.0
#: One ``top`` slower than this is not repeated: the store scans, and five scans prove nothing more.
SLOW = 5.0

Grow = Callable[[str, int, int], None]


def _name(i: int) -> str:
    return f"day-{i:07d}"


def _template(store: Store, namespace: str) -> KeyState:
    """A finished key written by dibs itself, whose record the growers copy."""
    dibs.Reservations(store, namespace=namespace).run("template", lambda: 1)
    return store.read(Key(namespace, "template"))


def _sql_grower(store: SQLStore) -> Grow:
    """Bulk-inserted copies of the template's row: the store's API would take minutes per 10^5."""

    def grow(namespace: str, start: int, stop: int) -> None:
        _template(store, namespace)
        with store.engine.begin() as conn:
            template = dict(
                conn.execute(
                    sa.select(store.t).where(store.t.c.namespace == namespace, store.t.c.name == "template")
                )
                .mappings()
                .one()
            )
            for chunk in range(start, stop, 10_000):
                rows = []
                for i in range(chunk, min(stop, chunk + 10_000)):
                    key = Key(namespace, _name(i))
                    rows.append(
                        {
                            **template,
                            "key_hash": key.digest,
                            "name": key.name,
                            "created_at": template["created_at"] - i,
                        }
                    )
                conn.execute(sa.insert(store.t), rows)

    return grow


def _file_grower(store: FileStore) -> Grow:
    """Copies of the template's record and payload files, and the index file of each artifact, written
    as the store lays them out (without the store's fsyncs, which would make growing 10^5 keys take
    many minutes); a second apart, as the SQL growers make them."""
    layout = Layout("")

    def grow(namespace: str, start: int, stop: int) -> None:
        template = _template(store, namespace)
        assert template.artifact is not None
        payload = store.artifact_path(template.key, template.artifact.fence).read_bytes()
        for i in range(start, stop):
            key = Key(namespace, _name(i))
            artifact = dataclasses.replace(template.artifact, created_at=template.artifact.created_at - i)
            record = store.record_path(key)
            record.parent.mkdir(parents=True, exist_ok=True)
            body = store.artifact_path(key, template.artifact.fence)
            body.parent.mkdir(parents=True, exist_ok=True)
            body.write_bytes(payload)
            made = store.root / layout.made("artifact", key, artifact.created_at)
            made.parent.mkdir(parents=True, exist_ok=True)
            made.touch()
            record.write_bytes(codec.encode(dataclasses.replace(template, key=key, artifact=artifact)))

    return grow


def _azure_grower(store: Store, threads: int = 8) -> Grow:
    """Copies of the template's record blob, written by the store's own record write (so each carries
    the summary its listing reads) from a pool of threads (within the SDK's 10 connections): one
    request a key, where the store's calls make four. The copies' artifacts name payload blobs that are
    not there: nothing here reads them (a listing reads no payload; the hit is the template's own)."""
    from dibs.stores.azure import AzureBlobStore
    from dibs.stores.azure.copies import Echo

    assert isinstance(store, AzureBlobStore)

    def grow(namespace: str, start: int, stop: int) -> None:
        template = _template(store, namespace)

        def one(i: int) -> None:
            key = Key(namespace, _name(i))
            written = store._write(key, None, dataclasses.replace(template, key=key))
            assert written is True or written is Echo.SAME  # SAME: a retried create found its own

        with ThreadPoolExecutor(threads) as pool:
            for _ in pool.map(one, range(start, stop), chunksize=64):
                pass

    return grow


def _api_grower(store: Store, threads: int = 8) -> Grow:
    """Keys taken through ``acquire`` and ``complete`` from a pool of threads, so that the store keeps
    whatever it keeps beside the records (Redis's indexes, Azure's metadata) as it does for users."""

    def one(key: Key) -> None:
        outcome = store.acquire(key, AcquireRequest("history", 60))
        assert isinstance(outcome, Granted), outcome
        store.complete(key, outcome.lease.token, NewArtifact("json", b"1", checksum(b"1")))

    def grow(namespace: str, start: int, stop: int) -> None:
        with ThreadPoolExecutor(threads) as pool:
            for _ in pool.map(one, (Key(namespace, _name(i)) for i in range(start, stop)), chunksize=256):
                pass

    return grow


def _redis_grower(store: Store) -> Grow:
    """Copies of the template's hash and their index entries (:mod:`benchmarks.grow_redis`)."""
    from benchmarks.grow_redis import grow as grow_redis
    from dibs.stores.redis import RedisStore

    assert isinstance(store, RedisStore)

    def grow(namespace: str, start: int, stop: int) -> None:
        _template(store, namespace)
        # Keys a second apart, as the SQL growers make them (a day each would reach before 1970).
        grow_redis(store, namespace, stop + 1, name="day-{:07d}", step=1.0, start=start)

    return grow


def _grower(store: Store) -> Grow:
    if isinstance(store, SQLStore):
        return _sql_grower(store)
    if store.scheme == "redis" and not store.scans:
        return _redis_grower(store)
    if store.scheme == "azure":
        return _azure_grower(store)
    if isinstance(store, FileStore):
        return _file_grower(store)
    return _api_grower(store)


@contextlib.contextmanager
def _stores(name: str) -> Iterator[tuple[Store, Store]]:
    """The store to grow and an empty one of the same kind (the baseline), each on a space of its own
    (schema, table, prefix, container, folder) removed afterwards."""
    with open_targets((name,)) as (grown_targets, skipped), open_targets((name,)) as (empty_targets, _):
        if not grown_targets or not empty_targets:
            raise SystemExit(f"{name}: {skipped.get(name, 'not available')}")
        grown, empty = open_store(grown_targets[0].url), open_store(empty_targets[0].url)
        try:
            yield grown, empty
        finally:
            grown.close()
            empty.close()


def _median(run: Callable[[], object], repeats: int = 5) -> float:
    times: list[float] = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
        if times[0] > SLOW:
            break
    return statistics.median(times)


def _interleaved(grown: Callable[[int], None], empty: Callable[[int], None], ops: int) -> tuple[float, float]:
    """p50 seconds of one call on each side, taken in turn so that both see the same machine."""
    times: dict[int, list[float]] = {0: [], 1: []}
    for i in range(ops):
        for side, call in ((0, grown), (1, empty)):
            started = time.perf_counter()
            call(i)
            times[side].append(time.perf_counter() - started)
    return statistics.median(times[0]), statistics.median(times[1])


def _new_key(store: Store) -> Callable[[int], None]:
    def call(i: int) -> None:
        key = Key(NAMESPACE, f"new-{uuid.uuid4().hex}-{i}")
        outcome = store.acquire(key, AcquireRequest("bench", 60))
        assert isinstance(outcome, Granted), outcome
        store.complete(key, outcome.lease.token, NewArtifact("json", b"1", checksum(b"1")))

    return call


def _wal_per_new_key(store: Store, ops: int) -> float | None:
    """Bytes of PostgreSQL's WAL per new key (the server's WAL position before and after ``ops`` keys
    on ``store`` alone; anything else the server writes meanwhile counts too): a new key in a large
    table touches index pages that a checkpoint has flushed since, each then logged whole once, where
    a small table's pages are logged whole once per checkpoint."""
    if not isinstance(store, SQLStore) or store.dialect != "postgresql":
        return None
    query = "SELECT pg_current_wal_lsn()::text"
    with store.engine.connect() as conn:
        before = conn.exec_driver_sql(query).scalar_one()
        new_key = _new_key(store)
        for i in range(ops):
            new_key(i)
        written = conn.exec_driver_sql(
            f"SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '{before}')"
        ).scalar_one()
    return round(float(written) / ops)


def _hit(store: Store) -> Callable[[int], None]:
    key = Key(NAMESPACE, "template")

    def call(_: int) -> None:
        outcome = store.acquire(key, AcquireRequest("bench", 60))
        assert not isinstance(outcome, Granted), outcome

    return call


def _ls_rate(store: Store) -> float:
    """Records per second of ``dibs ls`` streaming pages of 1,000 (:meth:`Store.list_pages
    <dibs.stores.base.Store.list_pages>`), over the first :data:`LS_UP_TO` (or :data:`LS_SECONDS`)."""
    listed = 0
    started = time.perf_counter()
    for page in store.list_pages(NAMESPACE, limit=1000):
        listed += len(page.states)
        if listed >= LS_UP_TO or time.perf_counter() - started >= LS_SECONDS:
            break
    return listed / (time.perf_counter() - started)


def _airflow_page(store: Store) -> Callable[[], object]:
    from dibs_provider.plugins._keys import _page_in  # Airflow's import, once, outside the timing

    return lambda: _page_in(store, NAMESPACE, {}, state=None, name=None)


def _prune_rates(store: Store, grow: Grow, size: int) -> tuple[float, float]:
    """Keys/s of ``prune(0)`` of 10,000 keys, and of removing 1,000 one call per key (namespaces of
    their own beside the grown one)."""
    batch, each = f"{PRUNED}.{size}", f"{PRUNED}.{size}.each"
    grow(batch, 0, 10_000)
    started = time.perf_counter()
    batched = store.prune(batch, 0.0)
    batched_rate = batched / (time.perf_counter() - started)
    grow(each, 0, 1_000)
    keys = [s.key for s in store.list_page(each, limit=1001).states]
    started = time.perf_counter()
    one_by_one = 0
    for key in keys:
        if isinstance(store, SQLStore):  # the removal as it was: a read and a guarded UPDATE per key
            one_by_one += store._repair(
                key, lambda s: transitions.prune(s, 0.0) is not None, store._clear_row, "prune"
            )
        else:
            one_by_one += store.forget(key)
    each_rate = one_by_one / (time.perf_counter() - started)
    return batched_rate, each_rate


def measure(store_name: str, sizes: list[int], ops: int) -> list[dict[str, Any]]:
    results = []
    with _stores(store_name) as (grown, empty):
        grow = _grower(grown)
        _template(grown, NAMESPACE)  # the hit's key, on both sides
        _template(empty, NAMESPACE)
        client = dibs.Reservations(grown, namespace=NAMESPACE)
        airflow_page = _airflow_page(grown)
        grown_to = 0
        first: dict[str, float] = {}
        for size in sizes:
            started = time.perf_counter()
            grow(NAMESPACE, grown_to, size)
            grown_to = size
            grew = time.perf_counter() - started
            top = _median(lambda: snapshot(client))
            middle = pages.cursor_of(Key(NAMESPACE, _name(size // 2)))
            page = _median(lambda: grown.list_page(NAMESPACE, after=middle, limit=100))  # noqa: B023
            shown = _median(airflow_page, repeats=3)
            ls_rate = _ls_rate(grown)
            new_key, new_key_empty = _interleaved(_new_key(grown), _new_key(empty), ops)
            hit, hit_empty = _interleaved(_hit(grown), _hit(empty), ops)
            wal, wal_empty = _wal_per_new_key(grown, ops), _wal_per_new_key(empty, ops)
            batched, each = _prune_rates(grown, grow, size)
            if size and not first:  # ratios against the smallest size that has keys to show
                first = {"top": top, "page": page, "airflow_page": shown}
            base = first or {"top": top, "page": page, "airflow_page": shown}
            row = {
                "store": store_name,
                "keys": size,
                "grow_s": round(grew, 2),
                "top_s": round(top, 4),
                "top_ratio": round(top / base["top"], 2),
                "page_s": round(page, 4),
                "page_ratio": round(page / base["page"], 2),
                "airflow_page_s": round(shown, 4),
                "airflow_page_ratio": round(shown / base["airflow_page"], 2),
                "ls_records_per_s": round(ls_rate),
                "new_key_p50_ms": round(new_key * 1000, 3),
                "new_key_empty_p50_ms": round(new_key_empty * 1000, 3),
                "new_key_ratio": round(new_key / new_key_empty, 2),
                "hit_p50_ms": round(hit * 1000, 3),
                "hit_empty_p50_ms": round(hit_empty * 1000, 3),
                "hit_ratio": round(hit / hit_empty, 2),
                "prune_keys_per_s": round(batched),
                "prune_key_by_key_per_s": round(each),
                "prune_ratio": round(batched / each, 1),
            }
            if wal is not None and wal_empty is not None:
                row["wal_per_new_key"], row["wal_per_new_key_empty"] = wal, wal_empty
            print(json.dumps(row), flush=True)
            results.append(row)
    return results


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f} ms" if seconds < 10 else f"{seconds:,.0f} s"


def _markdown(results: list[dict[str, Any]], argv: dict[str, Any]) -> str:
    lines = [
        "# History: cost against a namespace's size (issue 30)",
        "",
        f"`python -m benchmarks.history --sizes {argv['sizes']} --stores {argv['stores']} "
        f"--ops {argv['ops']}`, on the shared 2-core machine. Ratios: `top` and the pages against the "
        "smallest size with keys; `new key` and `hit` against an empty namespace of the same kind of store "
        "(interleaved); `prune` batched against one call per key.",
        "",
        "| store | keys | top --once | x first | ls page (100) | x first | Airflow page | x first "
        "| ls records/s | new key p50 | x empty | hit p50 | x empty | prune keys/s | one by one | x |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | ---: | ---: |",
    ]
    for r in results:
        lines.append(
            f"| {r['store']} | {r['keys']:,} | {_ms(r['top_s'])} | {r['top_ratio']} | "
            f"{_ms(r['page_s'])} | {r['page_ratio']} | "
            f"{_ms(r['airflow_page_s'])} | {r['airflow_page_ratio']} | "
            f"{r['ls_records_per_s']:,} | {r['new_key_p50_ms']} ms | {r['new_key_ratio']} | "
            f"{r['hit_p50_ms']} ms | {r['hit_ratio']} | "
            f"{r['prune_keys_per_s']:,} | {r['prune_key_by_key_per_s']:,} | {r['prune_ratio']} |"
        )
    wal = [r for r in results if "wal_per_new_key" in r]
    if wal:
        lines += [
            "",
            "PostgreSQL's WAL per new key, bytes (the grown namespace's table, and the empty one's):",
            "",
        ]
        lines += [
            f"- {r['keys']:,} keys: {r['wal_per_new_key']:,} ({r['wal_per_new_key_empty']:,})" for r in wal
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.history", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="0,10000,100000")
    parser.add_argument("--stores", default="sqlite,postgres,redis")
    parser.add_argument("--ops", type=int, default=50, help="calls per side per size for new key and hit")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/issue30"))
    parser.add_argument("--name", default="history", help="the result files' name (NAME.json, NAME.md)")
    args = parser.parse_args(argv)
    logging.getLogger("azure").setLevel(logging.WARNING)  # the SDK logs every request and response
    sizes = [int(size) for size in args.sizes.split(",")]
    results = []
    for store in args.stores.split(","):
        results += measure(store, sizes, args.ops)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / f"{args.name}.md").write_text(_markdown(results, vars(args)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What a namespace's history costs the reads a person makes and the per-key calls (issue 30): every
figure a ratio against a baseline measured in the same run.

``python -m benchmarks.history [--sizes 1000,10000,100000] [--stores sqlite,postgres]
[--out benchmarks/results/issue30]``

For each store, one table is grown to each size in turn (finished keys, one a day back in time,
bulk-inserted as copies of a row dibs wrote: the store's API would take minutes per 10^5), and at
each size it measures:

* ``top``: one ``dibs top --once`` snapshot (:func:`dibs._cli.top.snapshot`), median of 5; the
  ratio is against the same snapshot at the first size;
* ``page``: one ``dibs ls`` page of 100 keys from a cursor in the middle of the namespace, median of
  5; the ratio against the first size's;
* ``new key``: ``acquire`` + ``complete`` of a fresh key in the grown namespace, interleaved
  operation by operation with the same on an empty table of the same database (the baseline): p50 and
  the ratio of p50s;
* ``prune``: keys per second of ``prune(0)`` clearing a namespace of 10,000 finished keys in the
  grown table (one statement per batch), and the same store removing 1,000 keys key by key as it did
  before (one read and one guarded ``UPDATE`` per key: the baseline), as a ratio.

Nothing here is a threshold: the machine may be busy, so compare ratios of one run, not runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import dibs
from dibs._cli.top import snapshot
from dibs.keys import Key
from dibs.records import Granted, checksum
from dibs.stores import AcquireRequest, NewArtifact, pages, transitions
from dibs.stores.sql import SQLStore

NAMESPACE = "history"
PRUNED = "history.pruned"


@contextmanager
def _urls(store: str) -> Iterator[tuple[str, str]]:
    """Two URLs on ``store``: the table to grow and an empty one (the baseline); removed afterwards."""
    if store == "sqlite":
        with tempfile.TemporaryDirectory() as folder:
            yield f"sqlite:///{folder}/grown.db", f"sqlite:///{folder}/empty.db"
        return
    base = os.environ.get("DIBS_BENCH_POSTGRES_URL") or os.environ.get(
        "DIBS_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
    )
    schemas = [f"dibs_history_{uuid.uuid4().hex[:8]}" for _ in range(2)]
    engine = sa.create_engine(base, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        for schema in schemas:
            conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    try:
        yield f"{base}?schema={schemas[0]}", f"{base}?schema={schemas[1]}"
    finally:
        with engine.connect() as conn:
            for schema in schemas:
                conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
        engine.dispose()


def _grow(store: SQLStore, namespace: str, start: int, stop: int) -> None:
    """Finished keys ``start`` to ``stop`` of ``namespace``, copied from one dibs wrote."""
    client = dibs.Reservations(store, namespace=namespace)
    client.run("template", lambda: 1)
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
                key = Key(namespace, f"day-{i:07d}")
                rows.append(
                    {
                        **template,
                        "key_hash": key.digest,
                        "name": key.name,
                        "created_at": template["created_at"] - i,
                    }
                )
            conn.execute(sa.insert(store.t), rows)


def _median(run: Callable[[], object], repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _new_keys(grown: SQLStore, empty: SQLStore, ops: int) -> tuple[float, float]:
    """p50 seconds of acquire + complete of a fresh key on each store, interleaved."""
    times: dict[int, list[float]] = {0: [], 1: []}
    payload = b"1"
    for i in range(ops):
        for side, store in ((0, grown), (1, empty)):
            key = Key(NAMESPACE, f"new-{uuid.uuid4().hex}-{i}")
            started = time.perf_counter()
            outcome = store.acquire(key, AcquireRequest("bench", 60))
            assert isinstance(outcome, Granted)
            store.complete(key, outcome.lease.token, NewArtifact("bytes", payload, checksum(payload)))
            times[side].append(time.perf_counter() - started)
    return statistics.median(times[0]), statistics.median(times[1])


def _prune_rates(store: SQLStore, size: int) -> tuple[float, float]:
    """Keys/s of a batched prune of 10,000 keys, and of the key-by-key removal of 1,000 (namespaces of
    their own beside the grown one)."""
    batch, each = f"{PRUNED}.{size}", f"{PRUNED}.{size}.each"
    _grow(store, batch, 0, 10_000)
    started = time.perf_counter()
    batched = store.prune(batch, 0.0)
    batched_rate = batched / (time.perf_counter() - started)
    _grow(store, each, 0, 1_000)
    keys = [s.key for s in store.list_page(each, limit=1001).states]
    started = time.perf_counter()
    one_by_one = 0
    for key in keys:
        one_by_one += store._repair(  # the removal as it was: a read and a guarded UPDATE per key
            key, lambda s: transitions.prune(s, 0.0) is not None, store._clear_row, "prune"
        )
    each_rate = one_by_one / (time.perf_counter() - started)
    return batched_rate, each_rate


def measure(store_name: str, sizes: list[int], ops: int) -> list[dict[str, Any]]:
    results = []
    with _urls(store_name) as (grown_url, empty_url):
        grown, empty = SQLStore(grown_url), SQLStore(empty_url)
        client = dibs.Reservations(grown, namespace=NAMESPACE)
        grown_to = 0
        first: dict[str, float] = {}
        for size in sizes:
            started = time.perf_counter()
            _grow(grown, NAMESPACE, grown_to, size)
            grown_to = size
            grew = time.perf_counter() - started
            top = _median(lambda: snapshot(client))
            middle = pages.cursor_of(Key(NAMESPACE, f"day-{size // 2:07d}"))
            page = _median(lambda m=middle: grown.list_page(NAMESPACE, after=m, limit=100))
            new_key, new_key_empty = _new_keys(grown, empty, ops)
            batched, each = _prune_rates(grown, size)
            first = first or {"top": top, "page": page}
            row = {
                "store": store_name,
                "keys": size,
                "grow_s": round(grew, 2),
                "top_s": round(top, 4),
                "top_ratio": round(top / first["top"], 2),
                "page_s": round(page, 4),
                "page_ratio": round(page / first["page"], 2),
                "new_key_p50_ms": round(new_key * 1000, 2),
                "new_key_empty_p50_ms": round(new_key_empty * 1000, 2),
                "new_key_ratio": round(new_key / new_key_empty, 2),
                "prune_keys_per_s": round(batched),
                "prune_key_by_key_per_s": round(each),
                "prune_ratio": round(batched / each, 1),
            }
            print(json.dumps(row), flush=True)
            results.append(row)
        grown.close()
        empty.close()
    return results


def _markdown(results: list[dict[str, Any]], argv: dict[str, Any]) -> str:
    lines = [
        "# History: cost against a namespace's size (issue 30)",
        "",
        f"`python -m benchmarks.history --sizes {argv['sizes']} --stores {argv['stores']} "
        f"--ops {argv['ops']}`, "
        "on the shared 2-core machine. Ratios: `top` and `page` against the first size's, `new key` against "
        "an empty table of the same database (interleaved), `prune` batched against key by key.",
        "",
        "| store | keys | top --once | x first | ls page (100) | x first | new key p50 | x empty "
        "| prune keys/s | key by key | x |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        lines.append(
            f"| {r['store']} | {r['keys']:,} | {r['top_s'] * 1000:.1f} ms | {r['top_ratio']} | "
            f"{r['page_s'] * 1000:.1f} ms | {r['page_ratio']} | "
            f"{r['new_key_p50_ms']} ms | {r['new_key_ratio']} | "
            f"{r['prune_keys_per_s']:,} | {r['prune_key_by_key_per_s']:,} | {r['prune_ratio']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.history", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument("--ops", type=int, default=50, help="fresh keys per side per size")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/issue30"))
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.sizes.split(",")]
    results = []
    for store in args.stores.split(","):
        results += measure(store, sizes, args.ops)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "history.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "history.md").write_text(_markdown(results, vars(args)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

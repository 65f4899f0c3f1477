"""1. Uncontended overhead: reserve + complete one fresh key, against the store's raw primitive.

Four kinds of operation, each on fresh keys, interleaved one operation at a time so that load from
other processes hits them alike; every operation is timed on its own:

* ``raw``: the hand-written baseline of :mod:`benchmarks.raw` (claim + finish);
* ``store``: ``store.acquire`` + ``store.complete`` (the store interface; keys and payload prepared);
* ``client``: ``Reservations.get_or_reserve`` + ``Lease.complete`` (key parsing, owner, JSON, checksum);
* ``run``: ``Reservations.run(key, fn)``, the whole compute-once path with its heartbeat thread.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import dibs
from benchmarks.raw import open_raw
from benchmarks.settings import Settings
from benchmarks.stats import ratio, summarize
from benchmarks.targets import Target
from dibs.records import Granted, checksum
from dibs.stores import AcquireRequest, NewArtifact, open_store

KINDS = ("raw", "store", "client", "run")
VALUE = {"path": "s3://bucket/features/part-00000.parquet", "rows": 123456}
PAYLOAD = dibs.JSONSerializer().dumps(VALUE)


def _measure_target(target: Target, settings: Settings) -> dict[str, Any]:
    run_id = uuid.uuid4().hex[:8]
    namespace = "bench.overhead"
    store = open_store(target.url)
    client = dibs.Reservations(store, namespace=namespace, ttl=60)
    raw = open_raw(target.name, target.url)
    digest = checksum(PAYLOAD)
    counter = {kind: 0 for kind in KINDS}

    def name(kind: str) -> str:
        counter[kind] += 1
        return f"{run_id}-{kind}-{counter[kind]}"

    def raw_op() -> Callable[[], None]:
        key = name("raw")

        def op() -> None:
            token = raw.claim(key, "bench", 60.0)
            assert token is not None and raw.finish(key, token, PAYLOAD)

        return op

    def store_op() -> Callable[[], None]:
        key = dibs.Key(namespace, name("store"))

        def op() -> None:
            outcome = store.acquire(key, AcquireRequest("bench", 60.0))
            assert isinstance(outcome, Granted)
            store.complete(key, outcome.lease.token, NewArtifact("json", PAYLOAD, digest))

        return op

    def client_op() -> Callable[[], None]:
        key = name("client")

        def op() -> None:
            outcome = client.get_or_reserve(key)
            assert isinstance(outcome, dibs.Acquired)
            outcome.lease.complete(VALUE)

        return op

    def run_op() -> Callable[[], None]:
        key = name("run")

        def op() -> None:
            client.run(key, lambda: VALUE)

        return op

    makers = {"raw": raw_op, "store": store_op, "client": client_op, "run": run_op}
    samples: dict[str, list[float]] = {kind: [] for kind in KINDS}
    try:
        for kind in KINDS:  # warm-up: connections, statement caches, lazy imports
            for _ in range(settings.overhead_warmup):
                makers[kind]()()
        for round_number in range(settings.overhead_rounds):
            for index in range(settings.overhead_batch):
                # One operation of each kind after the other, the first kind rotating, so that a slow
                # moment of the machine (a burst of fsyncs from another process) hits every kind alike.
                shift = (round_number + index) % len(KINDS)
                for kind in KINDS[shift:] + KINDS[:shift]:
                    op = makers[kind]()
                    started = time.perf_counter()
                    op()
                    samples[kind].append(time.perf_counter() - started)
    finally:
        raw.close()
        store.close()
    summaries = {kind: summarize(values) for kind, values in samples.items()}
    base = summaries["raw"]
    return {
        "label": target.label,
        "us": {kind: summary.to_dict(1e6) for kind, summary in summaries.items()},
        "ratio": {kind: ratio(summaries[kind].median, base.median) for kind in KINDS if kind != "raw"},
        "ratio_p99": {kind: ratio(summaries[kind].p99, base.p99) for kind in KINDS if kind != "raw"},
    }


def run(targets: list[Target], settings: Settings, log: Callable[[str], None]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for target in targets:
        results[target.name] = _measure_target(target, settings)
        us, ratios = results[target.name]["us"], results[target.name]["ratio"]
        log(
            f"overhead {target.name}: raw {us['raw']['median']:.0f} us, store {us['store']['median']:.0f} us "
            f"({ratios['store']:.2f}x), client {us['client']['median']:.0f} us ({ratios['client']:.2f}x), "
            f"run {us['run']['median']:.0f} us ({ratios['run']:.2f}x)"
        )
    return results

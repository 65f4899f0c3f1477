"""2. Hand-off latency: the holder completes, and each of N waiter processes returns with the artifact.

Per round: the benchmark process takes a fresh key (``get_or_reserve``), N worker processes call
``Reservations.acquire`` on it and block, the holder waits a random 50 to 250 ms (so polling waiters
are caught at every point of their backoff), then calls ``Lease.complete``. A waiter's latency is
from the moment ``complete`` is *called* (so it includes writing the artifact) to the moment its
``acquire`` returned the :class:`~dibs.Hit`, both read from the machine's monotonic clock, which
all processes share.

Each store runs with its push wake-up (its ``watch``) and with polling forced (a store wrapper whose
``watch`` only sleeps and whose ``notifies`` is false). The anchor is Prefect's own mechanism,
measured the same way in the same run: ``FileSystemLockManager`` (the lock manager of Prefect's
SERIALIZABLE isolation), the holder holding the lock, waiters in ``wait_for_lock`` then reading a
result file; latency from the holder's ``release_lock`` (the result file is already written: this
favours Prefect slightly) to the waiter having the value.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dibs
from benchmarks.pool import Pool
from benchmarks.settings import Settings
from benchmarks.stats import ratio, summarize
from benchmarks.targets import Target

NAMESPACE = "bench.handoff"


def _rounds(
    pool: Pool,
    count: int,
    *,
    rounds: int,
    settings: Settings,
    rng: random.Random,
    begin: Callable[[str], Any],
    start_waiter: Callable[[int, str], None],
    finish: Callable[[Any, str], None],
) -> dict[str, Any]:
    """The measurement loop shared by dibs and the Prefect anchor."""
    latencies: list[float] = []
    slowest: list[float] = []
    finishing: list[float] = []
    run_id = uuid.uuid4().hex[:10]
    for number in range(rounds):
        key = f"{run_id}-{count}-{number}"
        held = begin(key)
        for index in range(count):
            start_waiter(index, key)
        for index in range(count):
            pool.wait_ready(index)
        time.sleep(rng.uniform(*settings.handoff_hold))
        started = time.monotonic()
        finish(held, key)
        finishing.append(time.monotonic() - started)
        arrivals = [pool.result(index) for index in range(count)]
        latencies.extend(arrival - started for arrival in arrivals)
        slowest.append(max(arrivals) - started)
    return {
        "waiters": count,
        "rounds": rounds,
        "latency_ms": summarize(latencies).to_dict(1e3),
        "slowest_waiter_ms": summarize(slowest).to_dict(1e3),
        "holder_call_ms": summarize(finishing).to_dict(1e3),
    }


def _dibs(
    pool: Pool, target: Target, mode: str, count: int, *, settings: Settings, rng: random.Random
) -> dict[str, Any]:
    for index in range(count):
        pool.start(index, "warm", url=target.url, mode=mode, namespace=NAMESPACE)
    for index in range(count):
        pool.result(index)
    holder = dibs.Reservations(target.url, namespace=NAMESPACE, ttl=120)

    def begin(key: str) -> dibs.Acquired:
        got = holder.get_or_reserve(key, owner="holder")
        assert isinstance(got, dibs.Acquired), got
        return got

    def start_waiter(index: int, key: str) -> None:
        pool.start(
            index,
            "handoff_wait",
            url=target.url,
            mode=mode,
            namespace=NAMESPACE,
            key=key,
            expected=f"artifact-of-{key}",
        )

    def finish(held: dibs.Acquired, key: str) -> None:
        held.lease.complete(f"artifact-of-{key}")

    try:
        return _rounds(
            pool,
            count,
            rounds=settings.handoff_rounds[count],
            settings=settings,
            rng=rng,
            begin=begin,
            start_waiter=start_waiter,
            finish=finish,
        )
    finally:
        holder.close()


def _prefect(pool: Pool, count: int, settings: Settings, rng: random.Random, scratch: Path) -> dict[str, Any]:
    from prefect.locking.filesystem import FileSystemLockManager

    locks, results = scratch / "locks", scratch / "results"
    results.mkdir(parents=True, exist_ok=True)
    manager = FileSystemLockManager(locks)

    def begin(key: str) -> None:
        # The holder's result is written while it holds the lock (waiters read it only once the lock
        # is gone), so the clock starts at the release itself.
        assert manager.acquire_lock(key, holder="holder", hold_timeout=120)
        staged = results / f".{key}.tmp"
        staged.write_text(json.dumps(f"artifact-of-{key}"))
        os.replace(staged, results / f"{key}.json")

    def start_waiter(index: int, key: str) -> None:
        pool.start(
            index,
            "prefect_wait",
            lock_dir=str(locks),
            result_dir=str(results),
            key=key,
            expected=f"artifact-of-{key}",
        )

    def finish(_: None, key: str) -> None:
        manager.release_lock(key, holder="holder")

    return _rounds(
        pool,
        count,
        rounds=settings.handoff_rounds[count],
        settings=settings,
        rng=rng,
        begin=begin,
        start_waiter=start_waiter,
        finish=finish,
    )


def run(targets: list[Target], settings: Settings, log: Callable[[str], None], pool: Pool) -> dict[str, Any]:
    rng = random.Random(2)
    first, last = str(min(settings.handoff_waiters)), str(max(settings.handoff_waiters))
    results: dict[str, Any] = {"stores": {}, "prefect": {}}
    for target in targets:
        modes = ("push", "poll") if target.pushes else ("poll",)
        per_store: dict[str, Any] = {}
        for mode in modes:
            per_mode: dict[str, Any] = {}
            for count in settings.handoff_waiters:
                per_mode[str(count)] = _dibs(pool, target, mode, count, settings=settings, rng=rng)
                latency = per_mode[str(count)]["latency_ms"]
                log(
                    f"handoff {target.name} {mode} N={count}: p50 {latency['median']:.1f} ms, "
                    f"p99 {latency['p99']:.1f} ms"
                )
            per_mode["scaling"] = ratio(
                per_mode[last]["latency_ms"]["median"], per_mode[first]["latency_ms"]["median"]
            )
            per_store[mode] = per_mode
        results["stores"][target.name] = per_store
    try:
        import prefect.locking.filesystem  # noqa: F401
    except ImportError as exc:
        results["prefect"] = {"skipped": f"Prefect is not installed ({exc})"}
        log("handoff: Prefect anchor skipped (not installed)")
        return results
    scratch = Path(tempfile.mkdtemp(prefix="dibs-bench-prefect-"))
    try:
        for index in range(max(settings.prefect_waiters)):
            pool.start(index, "prefect_warm")
        for index in range(max(settings.prefect_waiters)):
            pool.result(index)
        for count in settings.prefect_waiters:
            results["prefect"][str(count)] = _prefect(pool, count, settings, rng, scratch)
            latency = results["prefect"][str(count)]["latency_ms"]
            log(f"handoff prefect N={count}: p50 {latency['median']:.1f} ms, p99 {latency['p99']:.1f} ms")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    anchor = {
        count: results["prefect"][str(count)]["latency_ms"]["median"] for count in settings.prefect_waiters
    }
    if len(anchor) > 1:
        results["prefect"]["scaling"] = ratio(anchor[max(anchor)], anchor[min(anchor)])
    for per_store in results["stores"].values():
        for per_mode in per_store.values():
            for count in settings.handoff_waiters:
                row = per_mode[str(count)]
                row["vs_prefect"] = ratio(row["latency_ms"]["median"], anchor.get(count, math.nan))
    return results

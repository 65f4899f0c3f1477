"""2. Hand-off latency: the holder completes, and each of N waiter processes returns with the artifact.

Per round: the benchmark process takes a fresh key (``get_or_reserve``), N worker processes call
``Reservations.acquire`` on it and block, the holder waits a random 50 to 250 ms (so polling waiters
are caught at every point of their backoff), then calls ``Lease.complete``. A waiter's latency is
from the moment ``complete`` is *called* (so it includes writing the artifact) to the moment its
``acquire`` returned the :class:`~dibs.Hit`, both read from the machine's monotonic clock, which
all processes share.

Each store runs in two modes: ``push``, the store as configured, whose waiters are woken by their
process's watch hub (:mod:`dibs.hub`: a LISTEN connection, a Redis subscription, SQLite's
``data_version``, a versions or ETag poller), and ``poll``, the same store behind
:class:`~benchmarks.proxies.PollingStore`, which offers no change feed, so there is no hub and each
waiter asks the store itself with its capped backoff.

The anchors are Prefect's own lock managers, measured the same way in the same run (see
:mod:`benchmarks.anchors`): ``FileSystemLockManager`` (the lock manager of Prefect's SERIALIZABLE
isolation) and prefect-redis's ``RedisLockManager``, the holder holding the lock, waiters in
``wait_for_lock`` then reading a result file; latency from the holder's ``release_lock`` (the result
file is already written: this favours Prefect slightly) to the waiter having the value. Then each
anchor, and prefect-dibs's ``DibsLockManager``, is put through a SIGKILL of its holder.
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
from benchmarks import anchors, notify_fanout
from benchmarks.pool import Pool
from benchmarks.settings import Settings
from benchmarks.stats import ratio, summarize
from benchmarks.targets import Target

NAMESPACE = "bench.handoff"


class _Series:
    """Rounds of one kind of hand-off (dibs, a raw notification, an anchor) at one waiter count,
    run one at a time by the caller, so that kinds can be interleaved round by round."""

    def __init__(
        self,
        pool: Pool,
        count: int,
        *,
        settings: Settings,
        rng: random.Random,
        begin: Callable[[str], Any],
        start_waiter: Callable[[int, str], None],
        finish: Callable[[Any, str], None],
    ) -> None:
        self.pool, self.count, self.settings, self.rng = pool, count, settings, rng
        self.begin, self.start_waiter, self.finish = begin, start_waiter, finish
        self.latencies: list[float] = []
        self.slowest: list[float] = []
        self.finishing: list[float] = []

    def round(self, key: str) -> None:
        pool, count = self.pool, self.count
        held = self.begin(key)
        for index in range(count):
            self.start_waiter(index, key)
        for index in range(count):
            pool.wait_ready(index)
        time.sleep(self.rng.uniform(*self.settings.handoff_hold))
        started = time.monotonic()
        self.finish(held, key)
        self.finishing.append(time.monotonic() - started)
        arrivals = [pool.result(index) for index in range(count)]
        self.latencies.extend(arrival - started for arrival in arrivals)
        self.slowest.append(max(arrivals) - started)

    def summary(self) -> dict[str, Any]:
        return {
            "waiters": self.count,
            "rounds": len(self.slowest),
            "latency_ms": summarize(self.latencies).to_dict(1e3),
            "slowest_waiter_ms": summarize(self.slowest).to_dict(1e3),
            "holder_call_ms": summarize(self.finishing).to_dict(1e3),
        }


def _interleaved(series: list[_Series], rounds: int) -> list[dict[str, Any]]:
    """``rounds`` rounds of each series, round by round (a busy spell of the machine hits them all)."""
    run_id = uuid.uuid4().hex[:10]
    for number in range(rounds):
        # Each round in the other order: the one run right after another's wake-ups does not always
        # find the machine as the other left it.
        order = list(enumerate(series))
        for index, each in order if number % 2 == 0 else reversed(order):
            each.round(f"{run_id}-{each.count}-{number}-{index}")
    return [each.summary() for each in series]


def _dibs(
    pool: Pool, target: Target, mode: str, count: int, *, settings: Settings, rng: random.Random
) -> tuple[_Series, dibs.Reservations]:
    """The dibs hand-off's series, and the holder's client (the caller closes it)."""
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

    series = _Series(
        pool, count, settings=settings, rng=rng, begin=begin, start_waiter=start_waiter, finish=finish
    )
    return series, holder


def _raw(
    pool: Pool, writer: notify_fanout.Writer, count: int, *, settings: Settings, rng: random.Random
) -> _Series:
    """The store's raw notification fan-out to ``count`` listener processes
    (:mod:`benchmarks.notify_fanout`)."""

    def start_waiter(index: int, key: str) -> None:
        pool.start(index, "raw_notify_wait", spec=writer.spec, key=key, expected=f"value-of-{key}")

    def finish(_: None, key: str) -> None:
        writer.send(key, f"value-of-{key}")

    return _Series(
        pool,
        count,
        settings=settings,
        rng=rng,
        begin=lambda key: None,
        start_waiter=start_waiter,
        finish=finish,
    )


def _raw_writer(pool: Pool, target: Target, settings: Settings, scratch: Path) -> notify_fanout.Writer | None:
    """The raw notification's writer for ``target``, its listeners started in every worker."""
    if not target.pushes or target.family not in notify_fanout.FAMILIES:
        return None
    writer = notify_fanout.Writer(target.family, target.url, scratch)
    workers = max(settings.handoff_waiters)
    for index in range(workers):
        pool.start(index, "raw_notify_warm", spec=writer.spec)
    for index in range(workers):
        pool.result(index)
    return writer


def _anchor(
    pool: Pool, spec: dict[str, Any], count: int, *, settings: Settings, rng: random.Random, scratch: Path
) -> dict[str, Any]:
    results = scratch / "results"
    results.mkdir(parents=True, exist_ok=True)
    manager = anchors.manager_for(spec)

    def lock(key: str) -> str:
        return f"{anchors.KEY_PREFIX}{key}"  # findable, so that a Redis lock left behind is removed

    def begin(key: str) -> None:
        # The holder's result is written while it holds the lock (waiters read it only once the lock
        # is gone), so the clock starts at the release itself.
        assert manager.acquire_lock(lock(key), holder="holder", hold_timeout=120)
        staged = results / f".{key}.tmp"
        staged.write_text(json.dumps(f"artifact-of-{key}"))
        os.replace(staged, results / f"{key}.json")

    def start_waiter(index: int, key: str) -> None:
        pool.start(
            index,
            "prefect_wait",
            manager=spec,
            lock=lock(key),
            result=str(results / f"{key}.json"),
            expected=f"artifact-of-{key}",
        )

    def finish(_: None, key: str) -> None:
        manager.release_lock(lock(key), holder="holder")

    series = _Series(
        pool, count, settings=settings, rng=rng, begin=begin, start_waiter=start_waiter, finish=finish
    )
    return _interleaved([series], settings.handoff_rounds[count])[0]


def _anchor_specs(targets: list[Target], scratch: Path) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """The Prefect lock managers this machine can run, and why the others are skipped."""
    specs: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    redis_target = next((t for t in targets if t.family == "redis"), None)
    try:
        import prefect.locking.filesystem  # noqa: F401
    except ImportError as exc:
        reason = f"Prefect is not installed ({exc})"
        return {}, {"filesystem": reason, "redis": reason, "dibs": reason}
    specs["filesystem"] = {"kind": "filesystem", "lock_dir": str(scratch / "locks")}
    try:
        import prefect_redis.locking  # noqa: F401
    except ImportError as exc:
        skipped["redis"] = f"prefect-redis is not installed ({exc}; it is in the dev group)"
    else:
        if redis_target is None:
            skipped["redis"] = "no Redis server (the Redis store is skipped)"
        else:
            specs["redis"] = anchors.redis_spec(redis_target.url)
    return specs, skipped


def _store(
    pool: Pool,
    target: Target,
    *,
    settings: Settings,
    log: Callable[[str], None],
    rng: random.Random,
    scratch: Path,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every mode of one store, and its raw notification fan-out (if it has one), which is
    interleaved round by round with the ``push`` mode."""
    counts = settings.handoff_waiters
    first, last = str(min(counts)), str(max(counts))
    per_store: dict[str, Any] = {}
    raw: dict[str, Any] = {}
    writer = _raw_writer(pool, target, settings, scratch)
    try:
        for mode in ("push", "poll") if target.pushes else ("poll",):
            per_mode: dict[str, Any] = {}
            for count in counts:
                series, holder = _dibs(pool, target, mode, count, settings=settings, rng=rng)
                try:
                    if mode == "push" and writer is not None:
                        raw_series = _raw(pool, writer, count, settings=settings, rng=rng)
                        row, raw[str(count)] = _interleaved(
                            [series, raw_series], settings.handoff_rounds[count]
                        )
                    else:
                        (row,) = _interleaved([series], settings.handoff_rounds[count])
                finally:
                    holder.close()
                per_mode[str(count)] = row
                latency = row["latency_ms"]
                text = f"p50 {latency['median']:.1f} ms, p99 {latency['p99']:.1f} ms"
                if mode == "push" and str(count) in raw:
                    row["vs_raw"] = ratio(latency["median"], raw[str(count)]["latency_ms"]["median"])
                    text += f"; raw notification p50 {raw[str(count)]['latency_ms']['median']:.2f} ms"
                log(f"handoff {target.name} {mode} N={count}: {text}")
            per_mode["scaling"] = ratio(
                per_mode[last]["latency_ms"]["median"], per_mode[first]["latency_ms"]["median"]
            )
            per_store[mode] = per_mode
    finally:
        if writer is not None:
            writer.close()
    if raw:
        raw["scaling"] = ratio(raw[last]["latency_ms"]["median"], raw[first]["latency_ms"]["median"])
        raw["how"] = notify_fanout.HOW[target.family]
    return per_store, raw


def run(targets: list[Target], settings: Settings, log: Callable[[str], None], pool: Pool) -> dict[str, Any]:
    rng = random.Random(2)
    results: dict[str, Any] = {"stores": {}, "raw_notify": {}, "anchors": {}}
    raw_scratch = Path(tempfile.mkdtemp(prefix="dibs-bench-fanout-"))
    try:
        for target in targets:
            per_store, raw = _store(pool, target, settings=settings, log=log, rng=rng, scratch=raw_scratch)
            results["stores"][target.name] = per_store
            if raw:
                results["raw_notify"][target.name] = raw
    finally:
        shutil.rmtree(raw_scratch, ignore_errors=True)
    scratch = Path(tempfile.mkdtemp(prefix="dibs-bench-prefect-"))
    specs, skipped = _anchor_specs(targets, scratch)
    results["anchors_skipped"] = skipped
    for kind, reason in skipped.items():
        log(f"handoff: the {anchors.LABELS[kind]} anchor is skipped: {reason}")
    try:
        for index in range(max(settings.prefect_waiters)):
            pool.start(index, "prefect_warm", managers=list(specs.values()))
        for index in range(max(settings.prefect_waiters)):
            pool.result(index)
        for kind, spec in specs.items():
            per_kind: dict[str, Any] = {"label": anchors.LABELS[kind], "wake_up": anchors.WAKE_UPS[kind]}
            for count in settings.prefect_waiters:
                # The holder's locks have a hold timeout here: none outlives the benchmark.
                row = per_kind[str(count)] = _anchor(
                    pool, spec, count, settings=settings, rng=rng, scratch=scratch
                )
                log(
                    f"handoff {kind} lock manager N={count}: p50 {row['latency_ms']['median']:.1f} ms, "
                    f"p99 {row['latency_ms']['p99']:.1f} ms"
                )
            medians = {n: per_kind[str(n)]["latency_ms"]["median"] for n in settings.prefect_waiters}
            if len(medians) > 1:
                per_kind["scaling"] = ratio(medians[max(medians)], medians[min(medians)])
            results["anchors"][kind] = per_kind
        if settings.lock_kill_repeats and specs:
            killed = dict(specs)
            redis_target = next((t for t in targets if t.family == "redis"), None)
            if redis_target is not None and "redis" in specs:
                killed["dibs"] = {"kind": "dibs", "url": redis_target.url, "ttl": settings.takeover_ttl}
            results["after_sigkill"] = anchors.after_sigkill(pool, killed, settings, log)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for per_store in results["stores"].values():
        for per_mode in per_store.values():
            for count in settings.handoff_waiters:
                row = per_mode[str(count)]
                for kind, anchor in results["anchors"].items():
                    median = anchor.get(str(count), {}).get("latency_ms", {}).get("median", math.nan)
                    row.setdefault("vs_anchor", {})[kind] = ratio(row["latency_ms"]["median"], median)
    return results

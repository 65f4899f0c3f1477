"""3. Contention throughput: P processes race through the same K keys; every key must compute once.

Each process calls ``Reservations.run(key, fn)`` on every key (the store as configured, push
wake-up included). ``fn`` is trivial, so the run measures the coordination alone: a process that
loses a key either finds the artifact or waits for it. Afterwards every key must have been computed
by exactly one process and every process must have received every key's value.

The baseline is the raw primitive's rate: the same P processes each attempting its conditional
insert (:meth:`benchmarks.raw.RawPrimitive.claim`) on every key; exactly one claim per key must win.
Rates are K / (time from the common start to the last process finishing).

Two key orders: ``shuffled`` (each process walks the keys in its own random order: collisions happen
at random moments) and ``lockstep`` (all walk the same order, so every key is contended at once:
the worst case, where throughput is bounded by the hand-off latency). dibs and the baseline
alternate, repetition by repetition.
"""

from __future__ import annotations

import collections
import random
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

from benchmarks.pool import Pool
from benchmarks.settings import Settings
from benchmarks.stats import ratio
from benchmarks.targets import Target

NAMESPACE = "bench.contention"


class ExactlyOnceViolated(AssertionError):
    pass


def _race(
    pool: Pool,
    task: str,
    *,
    common: dict[str, Any],
    keys: list[str],
    order: str,
    processes: int,
    rng: random.Random,
) -> float:
    """Run one race; keys/s. Raises :class:`ExactlyOnceViolated` if a key ran twice or never."""
    start_at = time.monotonic() + 0.25
    kwargs_for = []
    for _ in range(processes):
        walk = list(keys) if order == "lockstep" else rng.sample(keys, len(keys))
        kwargs_for.append({**common, "keys": walk, "start_at": start_at})
    outcomes = pool.run_all(task, kwargs_for)
    counts = collections.Counter(key for outcome in outcomes for key in outcome["computed"])
    twice = [key for key, count in counts.items() if count > 1]
    never = [key for key in keys if key not in counts]
    wrong = sum(outcome["wrong"] for outcome in outcomes)
    if twice or never or wrong:
        raise ExactlyOnceViolated(
            f"{task}: {len(twice)} keys computed more than once (e.g. {twice[:3]}), {len(never)} never "
            f"(e.g. {never[:3]}), {wrong} wrong values"
        )
    elapsed = float(max(outcome["finished"] for outcome in outcomes)) - start_at
    return len(keys) / elapsed


def run(targets: list[Target], settings: Settings, log: Callable[[str], None], pool: Pool) -> dict[str, Any]:
    processes = settings.contention_processes
    orders = ("shuffled", "lockstep") if settings.contention_lockstep else ("shuffled",)
    rng = random.Random(3)
    results: dict[str, Any] = {"processes": processes, "keys": settings.contention_keys, "stores": {}}
    for target in targets:
        count = settings.contention_keys_by_store.get(target.name, settings.contention_keys)
        per_store: dict[str, Any] = {"keys": count}
        warm = {"url": target.url, "mode": "push", "namespace": NAMESPACE, "store": target.name}
        pool.run_all("warm", [warm] * processes)
        tasks = {
            "raw": ("raw_race", {"store": target.name, "url": target.url}),
            "dibs": ("race", {"url": target.url, "mode": "push", "namespace": NAMESPACE}),
        }
        for order in orders:
            rates: dict[str, list[float]] = {"dibs": [], "raw": []}
            for repetition in range(settings.contention_repeats):
                run_id = uuid.uuid4().hex[:8]
                for kind in ("raw", "dibs") if repetition % 2 == 0 else ("dibs", "raw"):
                    keys = [f"{run_id}-{kind}-{index}" for index in range(count)]
                    task, common = tasks[kind]
                    rate = _race(
                        pool, task, common=common, keys=keys, order=order, processes=processes, rng=rng
                    )
                    rates[kind].append(rate)
            dibs_rate, raw_rate = statistics.median(rates["dibs"]), statistics.median(rates["raw"])
            per_store[order] = {
                "dibs_keys_per_s": dibs_rate,
                "raw_keys_per_s": raw_rate,
                "ratio": ratio(dibs_rate, raw_rate),
                "runs": rates,
                "exactly_once": True,
            }
            log(
                f"contention {target.name} {order}: dibs {dibs_rate:.0f} keys/s, raw {raw_rate:.0f} keys/s "
                f"({ratio(dibs_rate, raw_rate):.0%}), exactly once"
            )
        results["stores"][target.name] = per_store
    return results

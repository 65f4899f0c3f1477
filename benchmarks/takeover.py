"""4. Takeover latency: how long after its holder is SIGKILLed a waiter holds the key.

A fresh process takes the key with the configured ttl and heartbeats it (every ttl / 3, the
default); a waiter process blocks in ``Reservations.acquire``. At a random moment (so at a random
phase of the heartbeat cycle) the benchmark SIGKILLs the holder, and measures until the waiter's
``acquire`` returns the lease (``took_over_from`` naming the dead holder).

The lease expires between 2/3 ttl (killed just before a heartbeat) and one ttl (just after) after the
kill; the waiter then needs its next poll, which the client schedules for the holder's expiry plus
its initial backoff (20 ms), and the write that takes the key over. Goal: at most ttl + one
heartbeat interval; the report also gives the worst overshoot past the ttl in milliseconds, the
part that is dibs's own (the ideal is the 20 ms poll plus one write).

A heartbeat that comes later than the ttl on a starved machine lets the waiter take the key over
*before* the kill; such a run is reported (``premature``) and left out of the latencies.
"""

from __future__ import annotations

import os
import random
import signal
import time
import uuid
from collections.abc import Callable
from typing import Any

import dibs
from benchmarks.pool import Pool, process_context
from benchmarks.settings import Settings
from benchmarks.stats import summarize
from benchmarks.targets import Target
from benchmarks.tasks import hold_forever

NAMESPACE = "bench.takeover"


def _once(pool: Pool, target: Target, ttl: float, rng: random.Random) -> dict[str, Any]:
    key = f"{uuid.uuid4().hex[:10]}"
    context = process_context()
    parent, child = context.Pipe()
    holder = context.Process(target=hold_forever, args=(target.url, NAMESPACE, key, ttl, child), daemon=True)
    holder.start()
    child.close()
    try:
        if not parent.poll(120):
            raise RuntimeError(f"the holder on {target.name} did not report within 120s")
        kind, _ = parent.recv()
        if kind != "holding":
            raise RuntimeError(f"the holder on {target.name} could not take the key: {_}")
        pool.start(0, "takeover_wait", url=target.url, namespace=NAMESPACE, key=key)
        pool.wait_ready(0)
        time.sleep(0.2 + rng.uniform(0, ttl / 3))  # the waiter is waiting; a random heartbeat phase
        killed = time.monotonic()
        assert holder.pid is not None
        os.kill(holder.pid, signal.SIGKILL)
        outcome = pool.result(0)
    finally:
        if holder.is_alive():
            holder.kill()
        holder.join()
        parent.close()
    if not str(outcome["took_over_from"] or "").startswith("doomed-"):
        raise AssertionError(
            f"the waiter took the key from {outcome['took_over_from']!r}, not the killed holder"
        )
    return {"latency": outcome["acquired"] - killed, "premature": outcome["acquired"] < killed}


def run(targets: list[Target], settings: Settings, log: Callable[[str], None], pool: Pool) -> dict[str, Any]:
    ttl = settings.takeover_ttl
    interval = dibs.Backoff().initial
    rng = random.Random(4)
    results: dict[str, Any] = {
        "ttl_s": ttl,
        "heartbeat_interval_s": ttl / 3,
        "poll_interval_s": interval,
        "stores": {},
    }
    for target in targets:
        runs = [_once(pool, target, ttl, rng) for _ in range(settings.takeover_repeats)]
        summary = summarize([run["latency"] for run in runs if not run["premature"]])
        results["stores"][target.name] = {
            "latency_s": summary.to_dict(),
            "median_over_ttl": summary.median / ttl,
            "max_over_ttl": summary.maximum / ttl,
            "max_past_ttl_ms": (summary.maximum - ttl) * 1e3,
            "premature": sum(run["premature"] for run in runs),
            "goal_met": summary.maximum <= ttl + ttl / 3,
        }
        log(
            f"takeover {target.name}: median {summary.median:.3f}s, max {summary.maximum:.3f}s "
            f"(ttl {ttl:g}s, {(summary.maximum - ttl) * 1e3:+.0f} ms past it)"
        )
    return results

"""Where a push hand-off's milliseconds go (issue 20): one holder, one waiter process, stage by stage.

``python -m benchmarks.handoff_stages [--stores postgres,sqlite,redis] [--rounds 300]``

Each round, the holder (this process) reserves a fresh key, a waiter process blocks in
``Reservations.acquire`` on it, the holder waits 50 to 250 ms and calls ``Lease.complete``. Both
processes record monotonic timestamps (one clock for the machine) at each stage, by wrapping the
methods involved for the run only (nothing in dibs is changed):

* holder: ``complete`` called, the store's ``complete`` entered, its statement or script sent and
  answered, ``complete`` returned;
* waiter: the feed's first sight of the change (a ``NOTIFY`` yielded by psycopg, a Redis ``pmessage``,
  the inotify watch on SQLite's ``-wal`` file waking (Linux), SQLite's ``data_version`` probe that saw
  it), the feed's ``changes`` returning it, the hub's read
  (``read_many``), the hand-over to the waiter's subscription, the waiter's thread awake, the
  artifact decoded, ``acquire`` returned.

It prints, per store, the median time of each stage since ``complete`` was called and the median
of each step from the stage before. The machine may be busy: compare steps, not absolute values.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import math
import multiprocessing
import multiprocessing.connection
import os
import random
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

#: (label, monotonic ns, this process's CPU ns) of this process, since the round began.
_EVENTS: list[tuple[str, int, int]] = []


def _mark(label: str) -> None:
    _EVENTS.append((label, time.monotonic_ns(), time.process_time_ns()))


def _wrap(owner: Any, name: str, label: str, *, exit_if: Callable[[Any], bool] | None = None) -> None:
    """Record ``label>`` when ``owner.name`` is called and ``label<`` when it returns (if ``exit_if``
    of its result holds); a generator function records ``label`` at each item instead."""
    original = getattr(owner, name)
    if inspect.isgeneratorfunction(original):

        @functools.wraps(original)
        def items(*args: Any, **kwargs: Any) -> Any:
            for item in original(*args, **kwargs):
                _mark(label)
                yield item

        setattr(owner, name, items)
        return

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        _mark(f"{label}>")
        result = original(*args, **kwargs)
        if exit_if is None or exit_if(result):
            _mark(f"{label}<")
        return result

    setattr(owner, name, timed)


def _install() -> None:
    """Wrap the methods of every stage, in whichever process calls it."""
    import psycopg
    import redis.client

    from dibs import artifacts, hub
    from dibs.stores import _inotify
    from dibs.stores import redis as redis_store
    from dibs.stores.redis import feed as redis_feed
    from dibs.stores.sql import feed, statements, store

    # holder
    _wrap(statements.Prepared, "fetch_all", "sql")
    _wrap(statements.Prepared, "execute", "sql")
    _wrap(redis_store.RedisStore, "_run", "script")
    # waiter: the feed
    _wrap(psycopg.Connection, "notifies", "notified")
    _wrap(
        redis.client.PubSub,
        "get_message",
        "message",
        exit_if=lambda m: m is not None and m.get("type") == "pmessage",
    )
    _wrap(_inotify.FileWatch, "wait", "inotify", exit_if=bool)
    _wrap(feed.DataVersionFeed, "probe", "data_version", exit_if=bool)
    _wrap(feed.DataVersionFeed, "tokens", "versions")
    for cls in (feed.ListenFeed, feed.DataVersionFeed, redis_feed.PatternFeed):
        _wrap(cls, "changes", "changes", exit_if=bool)
    # waiter: the hub and the waiter's thread
    # the hub's read: on the feed's connection (PostgreSQL, SQLite), else the store's
    for cls in (feed.ListenFeed, feed.DataVersionFeed):
        _wrap(cls, "read_many", "read", exit_if=lambda states: states is not None)
    _wrap(store.SQLStore, "read_many", "read")
    _wrap(redis_store.RedisStore, "read_many", "read")
    _wrap(hub.Subscription, "_offer", "offer")
    _wrap(hub.Subscription, "wait", "wait", exit_if=lambda state: state is not None)
    _wrap(artifacts.ArtifactReader, "hit", "decode")


#: What every store's waiter does once its hub heard of the change.
_HUB_AND_WAITER = (
    ("feed.changes returned", "W:changes<"),
    ("hub read sent", "W:read>"),
    ("hub read returned", "W:read<"),
    ("offered to the waiter", "W:offer>"),
    ("waiter's thread awake", "W:wait<"),
    ("decode began", "W:decode>"),
    ("decode done", "W:decode<"),
    ("acquire returned", "W:acquired"),
)

#: The stages in the order they happen, as (stage, label), the label's first event at or after
#: ``complete`` was called counting (``>`` entered, ``<`` returned; ``H:`` holder, ``W:`` waiter).
STAGES: dict[str, tuple[tuple[str, str], ...]] = {
    "postgres": (
        ("complete called", "H:complete"),
        ("statement sent", "H:sql>"),
        ("statement answered", "H:sql<"),
        ("complete returned", "H:complete<"),
        ("NOTIFY yielded by psycopg", "W:notified"),
        *_HUB_AND_WAITER,
    ),
    "sqlite": (
        ("complete called", "H:complete"),
        ("statement sent", "H:sql>"),
        ("statement committed", "H:sql<"),
        ("complete returned", "H:complete<"),
        ("-wal write heard (inotify)", "W:inotify<"),
        ("data_version changed", "W:data_version<"),
        ("versions read", "W:versions<"),
        *_HUB_AND_WAITER,
    ),
    "redis": (
        ("complete called", "H:complete"),
        ("script sent", "H:script>"),
        ("script answered", "H:script<"),
        ("complete returned", "H:complete<"),
        ("pmessage read", "W:message<"),
        *_HUB_AND_WAITER,
    ),
}
STAGES["sqlite-full"] = STAGES["sqlite"]


def _waiter(url: str, namespace: str, conn: multiprocessing.connection.Connection) -> None:
    """The waiter process: for each key it is sent, ``acquire`` it and send back its events."""
    _install()
    import dibs

    client = dibs.Reservations(url, namespace=namespace, ttl=60)
    client.status(f"warm-{os.getpid()}")
    while True:
        key = conn.recv()
        if key is None:
            break
        _EVENTS.clear()
        conn.send("ready")
        got = client.acquire(key, owner=f"waiter-{os.getpid()}", timeout=60)
        _mark("acquired")
        assert isinstance(got, dibs.Hit) and got.value == f"artifact-of-{key}", got
        conn.send(list(_EVENTS))
    client.close()


def _first(events: list[tuple[str, int, int]], label: str, since: int) -> int | None:
    return next((t for name, t, _ in events if name == label and t >= since), None)


def _cpu_at(events: list[tuple[str, int, int]], label: str, since: int) -> tuple[int, int] | None:
    """(monotonic ns, process CPU ns) of ``label``'s first event at or after ``since``."""
    return next(((t, cpu) for name, t, cpu in events if name == label and t >= since), None)


#: The waiter's first sight of the change, per store: where its CPU time is counted from.
FIRST_SIGHT = {
    "postgres": "W:notified",
    "sqlite": "W:inotify<",
    "sqlite-full": "W:inotify<",
    "redis": "W:message<",
}


def _account(
    name: str,
    events: list[tuple[str, int, int]],
    since: dict[str, list[float]],
    steps: dict[str, list[float]],
    cost: tuple[list[float], list[float]],
) -> None:
    """Add one waiter's round to the samples: each stage's time since ``complete`` and step, and the
    waiter's wall and CPU time from its first sight of the change to its return."""
    start = _first(events, "H:complete", 0)
    assert start is not None
    previous = start
    for stage, label in STAGES[name]:
        at = _first(events, label, start)
        if at is None:
            continue
        since[stage].append((at - start) / 1e6)
        steps[stage].append((at - previous) / 1e6)
        previous = at
    sight = _cpu_at(events, FIRST_SIGHT[name], start)
    done = _cpu_at(events, "W:acquired", start)
    if sight is not None and done is not None:
        cost[0].append((done[0] - sight[0]) / 1e6)
        cost[1].append((done[1] - sight[1]) / 1e6)


def measure(
    name: str, url: str, rounds: int, rng: random.Random, waiters: int = 1
) -> tuple[list[tuple[str, float, float]], tuple[float, float]]:
    """The stages of ``rounds`` hand-offs on ``url`` to ``waiters`` processes: (stage, median ms
    since complete, median ms step), over every waiter of every round; and the median wall time and
    waiter-process CPU time (ms, all its threads) from the waiter's first sight of the change to
    ``acquire`` returning: with more waiter processes than cores, the wall time beyond the CPU time is
    time spent runnable but not running (or waiting on the server)."""
    import dibs

    namespace = "bench.stages"
    ctx = multiprocessing.get_context("spawn")
    pipes, processes = [], []
    for _ in range(waiters):
        ours, theirs = ctx.Pipe()
        process = ctx.Process(target=_waiter, args=(url, namespace, theirs), daemon=True)
        process.start()
        pipes.append(ours)
        processes.append(process)
    holder = dibs.Reservations(url, namespace=namespace, ttl=120)
    stages = STAGES[name]
    since: dict[str, list[float]] = {stage: [] for stage, _ in stages}
    steps: dict[str, list[float]] = {stage: [] for stage, _ in stages}
    walls: list[float] = []
    cpus: list[float] = []
    run = uuid.uuid4().hex[:8]
    try:
        for number in range(rounds + 5):  # the first five warm up
            key = f"{run}-{number}"
            held = holder.get_or_reserve(key, owner="holder")
            assert isinstance(held, dibs.Acquired), held
            for pipe in pipes:
                pipe.send(key)
            for pipe in pipes:
                assert pipe.recv() == "ready"
            time.sleep(rng.uniform(0.05, 0.25))
            _EVENTS.clear()
            _mark("complete")
            held.lease.complete(f"artifact-of-{key}")
            _mark("complete<")
            mine = [(f"H:{label}", t, cpu) for label, t, cpu in _EVENTS]
            for pipe in pipes:
                theirs_events = [(f"W:{label}", t, cpu) for label, t, cpu in pipe.recv()]
                if number < 5:
                    continue
                _account(name, mine + theirs_events, since, steps, (walls, cpus))
    finally:
        for pipe in pipes:
            pipe.send(None)
        for process in processes:
            process.join(30)
        holder.close()
    rows = [
        (stage, statistics.median(since[stage]), statistics.median(steps[stage]))
        for stage, _ in stages
        if since[stage]
    ]
    cost = (statistics.median(walls), statistics.median(cpus)) if walls else (math.nan, math.nan)
    return rows, cost


def main(argv: list[str] | None = None) -> None:
    from benchmarks.targets import open_targets

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stores", default="postgres,sqlite,redis")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--waiters", type=int, default=1, help="waiter processes per round")
    args = parser.parse_args(argv)
    _install()
    rng = random.Random(20)
    with open_targets(tuple(args.stores.split(","))) as (targets, skipped):
        for store, why in skipped.items():
            print(f"{store}: skipped ({why})")
        for target in targets:
            rows, (wall, cpu) = measure(target.name, target.url, args.rounds, rng, args.waiters)
            print(
                f"\n{target.label}, {args.rounds} rounds, {args.waiters} waiter(s): "
                "median ms since complete was called | step"
            )
            for stage, at, step in rows:
                print(f"  {stage:<28} {at:8.3f}   {step:+8.3f}")
            print(
                f"  waiter process, first sight of the change to acquire returned: wall {wall:.3f} ms, "
                f"CPU {cpu:.3f} ms (median)"
            )


if __name__ == "__main__":
    main()

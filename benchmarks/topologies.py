"""10. The Redis topologies production runs (issue 29): one server, a Redis Cluster, a Sentinel set.

Servers started here, alike (the same ``redis-server``, the same settings: ``tests/redis_topologies.py``):

* ``direct``: one standalone server (``redis://``), the baseline;
* ``cluster``: three masters (``redis+cluster://``, naming two of them);
* ``sentinel``: a master, a replica and three Sentinels (``redis+sentinel://``);
* ``sentinel+wait``: the same with ``min_replicas=1``: every grant and complete waits until the
  replica has it (``WAIT`` on the connection that wrote).

For each, side by side and interleaved round by round (a busy spell hits them all):

* **hand-off**: benchmark 2's measure (:mod:`benchmarks.handoff`): the holder completes a fresh key
  and each of N waiter processes returns with the artifact; latency from the ``complete`` call to the
  waiter having it, each waiter woken by its process's watch hub (the one subscription);
* **reserve + complete**: one process, one fresh key after another (``Reservations.get_or_reserve`` +
  ``Lease.complete``), µs per key;
* **connections**: what one process's store holds on each data node (``CLIENT LIST``, by the client
  name its URL sets) while it reserves and completes keys on every node and one of its threads waits
  on a key held elsewhere (so its watch hub listens), and what a store that only waits holds.

Each as a ratio to ``direct``; issue 29's goal for the hand-off is within 10x of it.
"""

from __future__ import annotations

import contextlib
import os
import random
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dibs
from benchmarks import handoff
from benchmarks.pool import Pool
from benchmarks.settings import Settings
from benchmarks.stats import ratio, summarize
from benchmarks.targets import Target

NAMESPACE = "bench.topologies"
KINDS = ("direct", "cluster", "sentinel", "sentinel+wait")


@contextlib.contextmanager
def _servers(scratch: Path) -> Iterator[tuple[dict[str, str], dict[str, list[Any]]]]:
    """The URLs of each kind (one fresh prefix), and the data nodes of each (for ``CLIENT LIST``)."""
    from tests.redis_topologies import Cluster, SentinelSet, _data_node, wait_until

    prefix = f"dibs-bench-{uuid.uuid4().hex[:10]}:"
    direct = _data_node("direct", scratch).start()
    with contextlib.ExitStack() as stack:
        stack.callback(direct.stop)
        wait_until(direct.answers, "the direct server to answer", [direct])
        cluster = stack.enter_context(Cluster.start(scratch / "cluster"))
        group = stack.enter_context(SentinelSet.start(scratch / "sentinel"))
        urls = {
            "direct": f"redis://127.0.0.1:{direct.port}/0?prefix={prefix}",
            "cluster": cluster.url(prefix),
            "sentinel": group.url(prefix),
            "sentinel+wait": group.url(prefix, min_replicas=1, replica_timeout=1),
        }
        nodes = {"direct": [direct], "cluster": cluster.servers, "sentinel": [group.master, *group.replicas]}
        nodes["sentinel+wait"] = nodes["sentinel"]
        yield urls, nodes


def _handoff(
    pool: Pool, urls: dict[str, str], settings: Settings, log: Callable[[str], None]
) -> dict[str, Any]:
    rng = random.Random(10)
    results: dict[str, Any] = {}
    for count in settings.topology_waiters:
        series, holders = [], []
        try:
            for kind in KINDS:
                target = Target(kind, kind, urls[kind], True, "watch hub: one pattern subscription")
                each, holder = handoff._dibs(pool, target, "push", count, settings=settings, rng=rng)
                series.append(each)
                holders.append(holder)
            rows = handoff._interleaved(series, settings.topology_rounds[count])
        finally:
            for holder in holders:
                holder.close()
        direct = rows[0]["latency_ms"]["median"]
        for kind, row in zip(KINDS, rows, strict=True):
            row["vs_direct"] = ratio(row["latency_ms"]["median"], direct)
            results.setdefault(kind, {})[str(count)] = row
        log(
            f"topologies hand-off N={count}: "
            + ", ".join(
                f"{kind} p50 {row['latency_ms']['median']:.2f} ms ({row['vs_direct']:.2f}x)"
                for kind, row in zip(KINDS, rows, strict=True)
            )
        )
    return results


def _reserve_complete(urls: dict[str, str], settings: Settings, log: Callable[[str], None]) -> dict[str, Any]:
    clients = {kind: dibs.Reservations(url, namespace=NAMESPACE, ttl=60) for kind, url in urls.items()}
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    try:
        for client in clients.values():  # connections, scripts and the cluster's map, untimed
            client.get_or_reserve(f"warm-{uuid.uuid4().hex}", owner="bench").lease.complete("v")  # type: ignore[union-attr]
        for number in range(settings.topology_ops):
            for kind in KINDS if number % 2 == 0 else reversed(KINDS):
                key = f"rc-{number}-{uuid.uuid4().hex[:8]}"
                started = time.perf_counter()
                got = clients[kind].get_or_reserve(key, owner="bench")
                assert isinstance(got, dibs.Acquired), got
                got.lease.complete("value")
                times[kind].append(time.perf_counter() - started)
    finally:
        for client in clients.values():
            client.store.close()  # and its watch hub, before the servers stop
            client.close()
    direct = statistics.median(times["direct"])
    out = {
        kind: {"us": summarize(values).to_dict(1e6), "vs_direct": ratio(statistics.median(values), direct)}
        for kind, values in times.items()
    }
    log(
        "topologies reserve+complete: "
        + ", ".join(
            f"{kind} {row['us']['median']:.0f} µs ({row['vs_direct']:.2f}x)" for kind, row in out.items()
        )
    )
    return out


def _named(nodes: list[Any], name: str) -> list[int]:
    counts = []
    for server in nodes:
        with contextlib.closing(server.client()) as client:
            counts.append(sum(1 for c in client.client_list() if c.get("name") == name))
    return counts


def _connections(
    urls: dict[str, str], nodes: dict[str, list[Any]], log: Callable[[str], None]
) -> dict[str, Any]:
    """Connections per node of a process's store (one per URL and process) while it reserves and
    completes 30 keys spread over every node and one of its threads waits on a key held elsewhere
    (so its watch hub listens), and of a store that only waits."""
    out: dict[str, Any] = {}
    for kind in KINDS:
        tags = {role: f"{role}{uuid.uuid4().hex[:6]}" for role in ("holder", "working", "waiting")}
        clients = {
            role: dibs.Reservations(f"{urls[kind]}&client_name={tag}", namespace=NAMESPACE, ttl=60)
            for role, tag in tags.items()
        }
        threads = []
        try:
            held = clients["holder"].get_or_reserve(f"held-{uuid.uuid4().hex}", owner="holder")
            assert isinstance(held, dibs.Acquired)
            for role in ("working", "waiting"):
                thread = threading.Thread(
                    target=clients[role].acquire,
                    args=(held.lease.key.name, f"{role}-waiter"),
                    kwargs={"timeout": 60},
                )
                thread.start()
                threads.append(thread)
            for number in range(30):
                got = clients["working"].get_or_reserve(
                    f"conn-{number}-{uuid.uuid4().hex[:6]}", owner="bench"
                )
                assert isinstance(got, dibs.Acquired)
                got.lease.complete("v")
            # Each waiting store's hub subscribes once its wait began: counted while they still wait.
            deadline = time.monotonic() + 30
            while sum(_named(nodes[kind], tags["waiting"])) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            working, waiting = _named(nodes[kind], tags["working"]), _named(nodes[kind], tags["waiting"])
            held.lease.complete("v")
            for thread in threads:
                thread.join(60)
        finally:
            for client in clients.values():
                client.store.close()
                client.close()
        out[kind] = {"working": working, "only_waiting": waiting}
        log(
            f"topologies connections {kind}: working and waiting {working}, only waiting {waiting} (per node)"
        )
    return out


def run(settings: Settings, log: Callable[[str], None], pool: Pool) -> dict[str, Any]:
    from tests.redis_topologies import missing

    why = missing()
    if why is not None:  # as a store that is not there: skipped, unless services are required
        if os.environ.get("DIBS_REQUIRE_SERVICES", "").strip().lower() in {"1", "true", "yes"}:
            return {"problems": [f"cannot start Redis servers: {why}"]}
        log(f"topologies: skipped: {why}")
        return {"skipped": why}
    scratch = Path(tempfile.mkdtemp(prefix="dibs-bench-topologies-"))
    with _servers(scratch) as (urls, nodes):
        log("topologies: servers up (one server, a 3-master cluster, a Sentinel set)")
        try:
            return {
                "handoff": _handoff(pool, urls, settings, log),
                "reserve_complete": _reserve_complete(urls, settings, log),
                "connections": _connections(urls, nodes, log),
            }
        finally:  # the workers' clients of these servers, before the servers stop
            for index in range(max(settings.topology_waiters)):
                pool.start(index, "close_clients", urls=list(urls.values()))
            for index in range(max(settings.topology_waiters)):
                pool.result(index)

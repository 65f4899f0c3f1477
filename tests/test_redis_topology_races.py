"""Real OS processes racing on shared keys through a Redis Cluster, and through a Sentinel set while
it fails over (issue 29). Serial (``tests/serial.py``): they spawn processes and count connections.

Sizes: 4 processes x 60 keys on the cluster and 3 x 40 across the failover; ``DIBS_FULL=1`` runs 8 x
1,000 and 8 x 400.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import workers
from tests.cli_harness import eventually
from tests.redis_topologies import Cluster, SentinelSet, delete_prefix, missing, shared_cluster, unique_prefix
from tests.services import full_size, unavailable

pytest.importorskip("redis")
from dibs.stores.redis import DEFAULT_MAX_CONNECTIONS

SPAWN = multiprocessing.get_context("spawn")
PATIENCE = 300.0


@pytest.fixture(autouse=True)
def _servers_installed() -> None:
    why = missing()
    if why is not None:
        unavailable(f"these tests start their own Redis servers, but {why}")


@contextlib.contextmanager
def _racers(target: Any, url: str, keys: list[str], folder: Path, count: int) -> Iterator[list[Any]]:
    """``count`` spawned workers running ``target`` on ``keys`` (each from its own offset, so that they
    collide all along), released together once every one is ready; joined at the end."""
    children = [
        SPAWN.Process(target=target, args=(url, keys[w:] + keys[:w], str(folder), w)) for w in range(count)
    ]
    for child in children:
        child.start()
    try:
        eventually(
            lambda: (
                all((folder / f"ready-{w}").exists() for w in range(count))
                or any(c.exitcode not in (None, 0) for c in children)
            ),
            "every worker to be ready",
            PATIENCE,
        )
        (folder / "go").touch()
        yield children
    finally:
        (folder / "exit").touch()
        for child in children:
            child.join(PATIENCE)
            if child.exitcode is None:
                child.kill()
    assert [child.exitcode for child in children] == [0] * count


def _results(folder: Path, count: int) -> list[dict[str, Any]]:
    return [workers.read_lines(folder / f"results-{w}.jsonl")[0] for w in range(count)]


def _clients_named(cluster: Cluster, name: str) -> dict[int, int]:
    """Connections whose client name is ``name``, per node (``CLIENT LIST`` on every node)."""
    counts = {}
    for server in cluster.servers:
        with contextlib.closing(server.client()) as client:
            counts[server.port] = sum(1 for c in client.client_list() if c.get("name") == name)
    return counts


def test_processes_racing_on_a_cluster_compute_each_key_exactly_once(tmp_path: Path) -> None:
    processes, key_count = (8, 1000) if full_size() else (4, 60)
    cluster, prefix = shared_cluster(), unique_prefix()
    keys = [f"partition-{i:04d}" for i in range(key_count)]
    tag = f"race{time.monotonic_ns()}"
    url = cluster.url(prefix, client_name=tag)
    try:
        with _racers(workers.race_and_stay, url, keys, tmp_path, processes):
            eventually(
                lambda: all((tmp_path / f"results-{w}.jsonl").exists() for w in range(processes)),
                "every worker to finish its keys",
                PATIENCE,
            )
            # Every process is alive with its store open: its connections, per node, stay within the
            # store's bound (DEFAULT_MAX_CONNECTIONS per node and process, the feed's included).
            per_node = _clients_named(cluster, tag)
            assert sum(per_node.values()) <= processes * DEFAULT_MAX_CONNECTIONS * len(cluster.servers)
            assert all(count <= processes * DEFAULT_MAX_CONNECTIONS for count in per_node.values()), per_node
        executions = Counter(line["key"] for line in workers.read_lines(tmp_path / "executions.jsonl"))
        assert set(executions) == set(keys)
        assert not {key: n for key, n in executions.items() if n != 1}, "some key was computed twice"
        for report in _results(tmp_path, processes):
            assert report["results"] == {key: f"value-of-{key}" for key in keys}
    finally:
        clients = [server.client() for server in cluster.servers]
        delete_prefix(clients, prefix)
        for client in clients:
            client.close()


def test_a_sentinel_failover_during_grants_never_repeats_a_token(tmp_path: Path) -> None:
    """With ``min_replicas=1``, processes take keys while the Sentinels fail the master over: no token
    is granted twice for a key, and every key is computed exactly once (a grant or a complete the
    replica has not confirmed is never reported; the workers retry what the store could not answer)."""
    processes, key_count = (8, 400) if full_size() else (3, 40)
    keys = [f"key-{i:04d}" for i in range(key_count)]
    folder = tmp_path / "work"
    folder.mkdir()
    with SentinelSet.start(tmp_path / "servers") as group:
        url = group.url(unique_prefix(), min_replicas=1, replica_timeout=0.5)
        with _racers(workers.grant_through_failover, url, keys, folder, processes):
            # Fail over once the workers are well into the keys (each stops at its first third until
            # the failover starts), while they are still taking them.
            eventually(
                lambda: len(workers.read_lines(folder / "grants.jsonl")) >= key_count // 3,
                "a third of the keys to be granted",
                PATIENCE,
            )
            failed_over_at = time.time()
            (folder / workers.FAILING_OVER).touch()  # the workers take the other keys now
            group.failover(natural=full_size())  # full size: the Sentinels' own 8-10 s split brain
            eventually(
                lambda: all((folder / f"results-{w}.jsonl").exists() for w in range(processes)),
                "every worker to finish its keys",
                PATIENCE,
            )
        grants = workers.read_lines(folder / "grants.jsonl")
        tokens = Counter((grant["key"], grant["token"]) for grant in grants)
        assert not {grant: n for grant, n in tokens.items() if n != 1}, "a token was granted twice"
        per_key = Counter(grant["key"] for grant in grants)
        assert set(per_key) == set(keys)
        assert not {key: n for key, n in per_key.items() if n != 1}, "some key was computed twice"
        assert any(grant["at"] > failed_over_at for grant in grants), "no key was granted after the failover"
        for report in _results(folder, processes):
            assert report["results"] == {key: f"value-of-{key}" for key in keys}

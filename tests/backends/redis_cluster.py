"""A fresh key prefix on a 3-master Redis Cluster started by the tests (``tests/redis_topologies.py``),
reached by a ``redis+cluster://`` URL naming two of its nodes; its keys deleted afterwards.

The cluster is one per test process, started at its first use: each test works under a prefix of its
own, as on the shared server (``tests/backends/redis.py``), so tests never see each other's keys.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.redis_topologies import delete_prefix, missing, shared_cluster, unique_prefix
from tests.services import unavailable


@contextmanager
def isolated_url(tmp_path: Path, *, tagged: bool = False) -> Iterator[str]:
    """With ``tagged``, the prefix carries a hash tag (``{dibs-test-...}:``): every key in one slot."""
    why = missing()
    if why is not None:
        unavailable(f"the Redis Cluster tests start their own cluster, but {why}")
    cluster = shared_cluster()
    prefix = unique_prefix()
    if tagged:
        prefix = "{" + prefix.rstrip(":") + "}:"
    try:
        yield cluster.url(prefix)
    finally:
        clients = [server.client() for server in cluster.servers if server.alive()]
        try:
            delete_prefix(clients, prefix)
        finally:
            for client in clients:
                with contextlib.suppress(Exception):
                    client.close()

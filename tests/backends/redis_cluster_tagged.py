"""A fresh key prefix with a hash tag (``{dibs-test-...}:``) on the tests' 3-master Redis Cluster: every
key of the store in one slot, so the scripts keep the namespaces' indexes there
(:mod:`dibs.stores.redis.index`), as they do on one server; the untagged ``redis_cluster`` backend
runs the same contract without them (the scan)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.redis_topologies import delete_prefix, missing, shared_cluster, unique_prefix
from tests.services import unavailable


@contextmanager
def isolated_url(tmp_path: Path) -> Iterator[str]:
    why = missing()
    if why is not None:
        unavailable(f"the Redis Cluster tests start their own cluster, but {why}")
    cluster = shared_cluster()
    prefix = "{" + unique_prefix().rstrip(":") + "}:"
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

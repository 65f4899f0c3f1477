"""A fresh key prefix with a hash tag (``{dibs-test-...}:``) on the tests' 3-master Redis Cluster: every
key of the store in one slot, so the scripts keep the namespaces' indexes there
(:mod:`dibs.stores.redis.index`), as they do on one server; the untagged ``redis_cluster`` backend
runs the same contract without them (the scan)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.backends import redis_cluster


@contextmanager
def isolated_url(tmp_path: Path) -> Iterator[str]:
    with redis_cluster.isolated_url(tmp_path, tagged=True) as url:
        yield url

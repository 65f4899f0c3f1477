"""A fresh key prefix on a Sentinel set started by the tests (``tests/redis_topologies.py``: a master,
a replica, three Sentinels), reached by a ``redis+sentinel://`` URL naming the Sentinels; its keys
deleted afterwards (on the master: the replica follows).

The set is one per test process, started at its first use; each test works under a prefix of its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.redis_topologies import delete_prefix, missing, shared_sentinels, unique_prefix
from tests.services import unavailable


@contextmanager
def isolated_url(tmp_path: Path) -> Iterator[str]:
    why = missing()
    if why is not None:
        unavailable(f"the Redis Sentinel tests start their own Sentinel set, but {why}")
    sentinels = shared_sentinels()
    prefix = unique_prefix()
    try:
        yield sentinels.url(prefix)
    finally:
        with contextlib.closing(sentinels.master.client()) as client:
            delete_prefix([client], prefix)

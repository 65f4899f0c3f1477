"""Grow a Redis store's namespace to many finished keys fast, indexes included (issue 30): for the
history benchmark and the admin-read tests.

The store's API costs two scripts a key (~10^4 keys/s at best); this copies the hash of one key dibs
wrote (pipelined ``HSET``), with the name and the artifact's time changed, and writes the index
entries of a finished key (class ``d`` in ``cls``, the artifact's time in ``art``: see
:mod:`dibs.stores.redis.index`) as whole ``ZADD`` commands of a batch each. The indexes are marked
complete first (the store's own backfill of what is there already), so no later read rebuilds them.
Measured on a quiet 2-core machine: ~10^5 keys/s, so 10^6 keys in about ten seconds.

Only for a store nothing else writes to meanwhile (a benchmark's or a test's own prefix): the copies
are written outside the scripts.
"""

from __future__ import annotations

from typing import Any

from dibs.keys import Key
from dibs.stores.redis import RedisStore
from dibs.stores.requests import AcquireRequest, NewArtifact

__all__ = ["grow"]

#: Keys written per pipeline.
BATCH = 5_000
DAY = 86_400.0


def grow(
    store: RedisStore,
    namespace: str,
    count: int,
    *,
    template: str = "template",
    name: str = "day-{:06d}",
    step: float = DAY,
    start: int = 0,
) -> None:
    """``count`` finished keys in ``namespace``: ``template`` (completed through the store, if it is not
    done yet) and ``count - 1`` copies named ``name.format(i)``, the i-th made ``step * (i + 1)``
    seconds before the template (one a day, back in time; closer together when a day each would go
    back past half the Unix epoch, since a time before 1970 is no time a record holds). With ``start``,
    only the copies from the ``start``-th on (a namespace grown in steps)."""
    first = Key(namespace, template)
    state = store.read(first)
    if state.artifact is None:
        granted = store.acquire(first, AcquireRequest("grow", 60.0))
        token = granted.lease.token  # type: ignore[union-attr]
        store.complete(first, token, NewArtifact("pickle", b"\x80\x04K\x01.", "grown"))
    store._indexed()  # the marker set (what is there placed), so no read rebuilds at 10^6 keys
    client = store._reach.node_of(store.record_key(first))
    stored: dict[bytes, bytes] = client.hgetall(store.record_key(first))  # type: ignore[assignment]
    fields: dict[Any, Any] = {field.decode(): value for field, value in stored.items()}
    made = float(fields["artifact_created_at"])
    step = min(step, made / 2 / max(count, 1))
    indexes = store._indexes.of(namespace)
    for first_copy in range(start, count - 1, BATCH):
        pipe = client.pipeline(transaction=False)
        classes: dict[str, float] = {}
        times: dict[str, float] = {}
        for i in range(first_copy, min(first_copy + BATCH, count - 1)):
            key = Key(namespace, name.format(i))
            at = made - step * (i + 1)
            pipe.hset(
                store.record_key(key), mapping={**fields, "name": key.name, "artifact_created_at": repr(at)}
            )
            classes["d" + key.name] = 0.0
            times[key.name] = at
        pipe.zadd(indexes.cls, classes)
        pipe.zadd(indexes.art, times)
        pipe.execute()

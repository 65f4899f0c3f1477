"""The Redis store's admin reads and removals go through its per-namespace indexes (issue 30).

Counted, never timed: the records each read fetches are counted by wrapping the one method that reads
them (:meth:`IndexedReads.read <dibs.stores.redis.admin.IndexedReads.read>`), the drop batches by
wrapping the one that sends them, or by the script calls a server of the test's own counts (``INFO
commandstats``), and a whole listing (the SCAN) is made to fail. The namespaces are
grown with :func:`benchmarks.grow_redis.grow` (hash copies and their index entries).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from benchmarks.grow_redis import grow

import dibs
from dibs._cli.top import LEASES, RECENT, snapshot
from dibs.keys import Key
from dibs.stores.redis.admin import REMOVAL_BATCH, IndexedReads
from dibs.stores.requests import AcquireRequest

redis = pytest.importorskip("redis")
from dibs.stores.redis import RedisStore  # noqa: E402 -- only once redis-py is known to be there

NAMESPACE = "history"


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    from tests.backends.redis import isolated_url

    with isolated_url(tmp_path) as found:
        yield found


@pytest.fixture
def read_counts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many records each indexed read of this process fetched; a whole listing fails the test."""
    counts: list[int] = []
    read = IndexedReads.read

    def counting(self: IndexedReads, keys: Any, skipped: Any) -> Any:
        counts.append(len(keys))
        return read(self, keys, skipped)

    monkeypatch.setattr(IndexedReads, "read", counting)
    monkeypatch.setattr(RedisStore, "_scanned", lambda *args: pytest.fail("the store scanned every record"))
    return counts


def _client(store: RedisStore) -> Any:
    return store._reach.client()


@pytest.mark.parametrize("keys", [300, 3_000])
def test_top_reads_a_bounded_number_of_records_whatever_the_namespace_size(
    url: str, read_counts: list[int], keys: int
) -> None:
    store = RedisStore(url)
    assert not store.scans  # top reads its five bounded reads, not one listing
    grow(store, NAMESPACE, keys)
    client = dibs.Reservations(store, namespace=NAMESPACE, ttl=600)
    for name in ("held-1", "held-2"):
        client.get_or_reserve(name, owner="worker")
    failing = client.get_or_reserve("broken", owner="flaky")
    assert isinstance(failing, dibs.Acquired)
    failing.lease.release("ValueError: no rows")

    read_counts.clear()
    doc = snapshot(client)
    # What the screen shows, and nothing else: the same at 300 keys and at 3,000.
    assert sum(read_counts) <= 2 * LEASES + 2 * RECENT
    assert sum(read_counts) == 2 + 0 + RECENT + 1
    assert doc["counts"] == {"held": 2, "expired": 0, "done": keys, "failed": 1}
    assert [row["key"] for row in doc["held"]] == [f"{NAMESPACE}/held-1", f"{NAMESPACE}/held-2"]
    newest = [row["key"] for row in doc["recent_artifacts"]]
    assert newest == [f"{NAMESPACE}/template", *(f"{NAMESPACE}/day-{i:06d}" for i in range(RECENT - 1))]

    read_counts.clear()  # a page of a status reads its page (and one more, to know another follows)
    page = store.list_page(NAMESPACE, state="done", limit=7)
    assert len(page.states) == 7 and page.after is not None and sum(read_counts) == 8
    read_counts.clear()
    assert [s.key.name for s in store.list_page(NAMESPACE, state="held", limit=7).states] == [
        "held-1",
        "held-2",
    ]
    assert sum(read_counts) == 2
    store.close()


def test_prune_runs_in_batches_and_keeps_every_fence(
    url: str, read_counts: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One drop_many script per batch, not one call per key; progress told per batch; every
    pruned key keeps its fence (its next holder gets token 2); a live lease is never pruned."""
    store = RedisStore(url)
    keys = 2 * REMOVAL_BATCH + REMOVAL_BATCH // 2
    grow(store, NAMESPACE, keys)
    pipelines: list[int] = []
    drop_batch = IndexedReads._drop_batch

    def counting(self: IndexedReads, namespace: str, names: Any, part: str, older: float) -> int:
        pipelines.append(len(names))
        return drop_batch(self, namespace, names, part, older)

    monkeypatch.setattr(IndexedReads, "_drop_batch", counting)
    told: list[int] = []
    client = dibs.Reservations(store, namespace=NAMESPACE, ttl=600)
    held = client.get_or_reserve("held-now", owner="worker")
    assert isinstance(held, dibs.Acquired)
    assert client.prune(0.0, progress=told.append) == keys  # everything old but the live lease
    assert pipelines == [REMOVAL_BATCH, REMOVAL_BATCH, REMOVAL_BATCH // 2]  # the live lease is no candidate
    assert told == [REMOVAL_BATCH, 2 * REMOVAL_BATCH, keys]
    assert store.count_states(NAMESPACE) == {"held": 1, "expired": 0, "done": 0, "failed": 0}
    assert [s.key.name for s in store.list(NAMESPACE)] == ["held-now"]
    raw = _client(store)
    pruned = store.record_key(Key(NAMESPACE, "day-000001"))
    assert raw.hget(pruned, "fence") == b"1" and raw.hget(pruned, "attempts") == b"0"  # a tombstone
    assert sorted(raw.hkeys(pruned)) == [b"attempts", b"fence", b"format", b"name", b"namespace"]
    again = client.get_or_reserve("day-000001", owner="next")
    assert isinstance(again, dibs.Acquired) and again.lease.token == 2
    again.lease.release()
    pipelines.clear()
    assert client.reap() == 1  # the released key, holding nothing, becomes a tombstone
    assert pipelines == [1]
    assert client.prune(0.0) == 0 and client.reap() == 0
    held.lease.release()
    store.close()


def test_reap_clears_expired_leases_from_the_index_and_not_a_renewed_one(
    url: str, read_counts: list[int]
) -> None:
    store = RedisStore(url)
    gone, kept = Key(NAMESPACE, "gone"), Key(NAMESPACE, "kept")
    store.acquire(gone, AcquireRequest("a", 0.0))
    renewed = store.acquire(kept, AcquireRequest("b", 0.0))
    assert store.count_states(NAMESPACE)["expired"] == 2
    store.heartbeat(kept, renewed.lease.token, 600)  # type: ignore[union-attr]
    assert store.reap(NAMESPACE) == 1
    assert store.read(gone).status == "free" and store.read(kept).status == "held"
    assert store.count_states(NAMESPACE) == {"held": 1, "expired": 0, "done": 0, "failed": 0}
    store.close()


def _index_keys(store: RedisStore) -> list[bytes]:
    return list(_client(store).scan_iter(match=f"{store.prefix}idx:*"))


def test_records_from_before_the_indexes_are_placed_once(
    url: str, read_counts: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    """A store whose records the indexes do not hold (written by an older dibs: here, the indexes and
    their marker deleted) builds them at its first admin read, logs it, and answers from them."""
    store = RedisStore(url)
    grow(store, NAMESPACE, 40)
    dibs.Reservations(store, namespace="other.ns", ttl=600).get_or_reserve("held", owner="w")
    before = {key: _client(store).type(key) for key in _index_keys(store)}
    _client(store).delete(*before)
    assert _index_keys(store) == []

    fresh = RedisStore(url)
    with caplog.at_level(logging.INFO, logger="dibs.stores.redis.store"):
        page = fresh.list_page(None, limit=100)
    assert len(page.states) == 41 and page.after is None
    assert [s.key for s in page.states] == sorted(s.key for s in page.states)
    assert "building the index" in caplog.text and "indexed 41 records" in caplog.text
    assert {key: _client(store).type(key) for key in _index_keys(store)} == before  # what the scripts wrote
    assert fresh.count_states(NAMESPACE)["done"] == 40
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="dibs.stores.redis.store"):
        RedisStore(url).count_states(None)
    assert "building" not in caplog.text  # once: the marker says so
    store.close()
    fresh.close()


def test_a_stale_index_entry_is_not_shown_and_is_repaired(url: str, read_counts: list[int]) -> None:
    """An entry whose record says otherwise (a record changed by an older dibs, or by hand) is judged on
    the record: never listed for what the index says, and placed again."""
    store = RedisStore(url)
    client = dibs.Reservations(store, namespace=NAMESPACE, ttl=600)
    client.run("done", lambda: 1)
    client.get_or_reserve("held", owner="w")
    keys = store._indexes.of(NAMESPACE)
    raw = _client(store)
    raw.zadd(keys.cls, {"dghost": 0, "fheld": 0, "d": 0, "d\x07bell": 0})  # and two that name no key
    raw.zadd(keys.art, {"ghost": 1.0})
    assert [s.key.name for s in store.list_page(NAMESPACE, limit=10).states] == ["done", "held"]
    assert [s.key.name for s in store.list_page(NAMESPACE, state="failed", limit=10).states] == []
    assert [s.key.name for s in store.latest(NAMESPACE, "artifact", limit=5)] == ["done"]
    assert sorted(raw.zrange(keys.cls, 0, -1)) == [b"d", b"d\x07bell", b"ddone", b"hheld"]  # repaired
    assert raw.zrange(keys.art, 0, -1) == [b"done"]
    store.close()


def test_a_cluster_prefix_without_a_hash_tag_scans_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """On a Redis Cluster the indexes need the prefix's hash tag (one slot); without one every admin
    read scans, correctly, and the first says how to make them bounded."""
    from tests.redis_topologies import delete_prefix, missing, shared_cluster, unique_prefix

    if missing() is not None:
        pytest.skip(f"the Redis Cluster tests start their own cluster, but {missing()}")
    cluster = shared_cluster()
    prefix = unique_prefix()
    store = RedisStore(cluster.url(prefix))
    try:
        assert not store._indexes.enabled and store.scans
        dibs.Reservations(store, namespace=NAMESPACE, ttl=600).run("k", lambda: 1)
        with caplog.at_level(logging.WARNING, logger="dibs.stores.redis.store"):
            assert store.count_states(NAMESPACE)["done"] == 1
            assert [s.key.name for s in store.list_page(NAMESPACE).states] == ["k"]
        assert caplog.text.count("has no hash tag") == 1
        assert not [
            key for server in cluster.servers for key in server.client().scan_iter(match=f"{prefix}idx:*")
        ]
        assert store.prune(NAMESPACE, 0.0) == 1
    finally:
        store.close()
        delete_prefix([server.client() for server in cluster.servers if server.alive()], prefix)


def _indexes_now(store: RedisStore) -> dict[bytes, object]:
    """Every index key under the store's prefix with what it holds (members and scores, or members)."""
    raw = _client(store)
    found: dict[bytes, object] = {}
    for key in _index_keys(store):
        kind = raw.type(key)
        if kind == b"zset":
            found[key] = raw.zrange(key, 0, -1, withscores=True)
        elif kind == b"set":
            found[key] = sorted(raw.smembers(key))
        else:
            found[key] = raw.get(key)
    return found


def test_what_the_scripts_keep_step_by_step_is_what_a_rebuild_places(url: str) -> None:
    """Every write moves a record in the indexes by what changed (the prelude's ``place``): after a run
    of every kind of write, the indexes equal those a rebuild makes from the records alone."""
    from dibs.stores.requests import NewArtifact

    store = RedisStore(url)
    assert store.rebuild_index() == 0  # the marker set first: no read below places anything again
    ns = NAMESPACE

    def token(key: Key, owner: str = "a", ttl: float = 600.0, **terms: Any) -> Any:
        granted = store.acquire(key, AcquireRequest(owner, ttl, **terms))
        return granted.lease.token  # type: ignore[union-attr]

    def done(key: Key, value: bytes = b"v") -> None:
        store.complete(key, token(key), NewArtifact("pickle", value, "c"))

    k = {name: Key(ns, name) for name in ("done", "refresh", "failed", "stopped", "freed", "gone", "held")}
    done(k["done"])
    done(k["refresh"])
    refresh = token(k["refresh"], "b", max_age=0)  # a lease beside the artifact (class r)
    store.heartbeat(k["refresh"], refresh, 900)
    store.release(k["failed"], token(k["failed"]), "boom")
    store.release(k["stopped"], token(k["stopped"]), "stop", counted=False)
    store.release(k["freed"], token(k["freed"]))
    store.release(k["gone"], token(k["gone"]))
    assert store.discard(k["gone"])
    held = token(k["held"], ttl=0.0)
    store.heartbeat(k["held"], held, 600)
    assert store.forget(k["done"]) and not store.forget(k["gone"])
    done(k["done"], b"again")
    store.release(k["done"], token(k["done"], max_age=0), "refresh failed")  # an artifact and a failure
    assert store.force_release(k["held"])
    token(k["held"], "c", ttl=0.0)  # expired, nobody took over
    token(Key("other.ns", "x"))
    assert store.reap(ns) == 2  # the expired lease, and the freed key
    assert store.prune(ns, 3600.0) == 0
    kept = _indexes_now(store)

    raw = _client(store)
    raw.delete(*_index_keys(store))
    assert store.rebuild_index() == 8  # every record, tombstones included (placed nowhere)
    assert _indexes_now(store) == kept
    classes = sorted(raw.zrange(store._indexes.of(ns).cls, 0, -1))
    assert classes == [b"ddone", b"ffailed", b"fstopped", b"rrefresh"]
    assert store.prune(ns, 0.0) == 3  # all but the live lease beside its artifact
    assert raw.zrange(store._indexes.of(ns).cls, 0, -1) == [b"rrefresh"]
    store.close()


# -- prune and reap: one drop_many script per batch ----------------------------------------------------


@pytest.fixture
def own_url(tmp_path: Path) -> Iterator[str]:
    """A store URL on a ``redis-server`` of the test's own: its ``INFO commandstats`` counts this
    test's script calls alone (on the shared server a neighbouring worker's would count too)."""
    from tests.components import free_port
    from tests.redis_topologies import RedisServer, missing, wait_until
    from tests.services import unavailable

    why = missing()
    if why is not None:
        unavailable(f"this test counts a server's script calls, on a server of its own: {why}")
    port = free_port()
    config = ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path / "own"), "--save", ""]
    server = RedisServer("redis-own", tmp_path / "own", port, config).start()
    try:
        wait_until(server.answers, "the test's own Redis to answer", [server])
        yield f"redis://127.0.0.1:{port}/0?prefix=dibs-test:"
    finally:
        server.stop()


def _script_calls(store: RedisStore) -> int:
    """Every ``EVALSHA`` the store's server has run (``INFO commandstats``)."""
    stats = _client(store).info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def _ready(store: RedisStore) -> None:
    """The marker set and drop_many loaded, so that counted calls are prune's own (no backfill, no
    run refused with ``NOSCRIPT`` and sent again)."""
    store.count_states(NAMESPACE)
    _client(store).script_load(store._drop_many.registered.script)


def test_a_prune_runs_one_script_call_per_batch_and_keeps_every_fence(own_url: str) -> None:
    """N prunable keys cost ceil(N / REMOVAL_BATCH) script calls, counted by the server; each key
    left a tombstone with its fence (its next holder gets the next token), in every batch."""
    store = RedisStore(own_url)
    keys = 2 * REMOVAL_BATCH + 37
    grow(store, NAMESPACE, keys)
    _ready(store)
    told: list[int] = []
    before = _script_calls(store)
    assert store.prune(NAMESPACE, 0.0, progress=told.append) == keys
    assert _script_calls(store) - before == -(-keys // REMOVAL_BATCH) == 3
    assert told == [REMOVAL_BATCH, 2 * REMOVAL_BATCH, keys]  # progress told per batch
    assert store.count_states(NAMESPACE) == {"held": 0, "expired": 0, "done": 0, "failed": 0}
    raw = _client(store)
    for name in ("template", "day-000000", f"day-{REMOVAL_BATCH:06d}", f"day-{keys - 2:06d}"):
        record = store.record_key(Key(NAMESPACE, name))
        assert sorted(raw.hkeys(record)) == [b"attempts", b"fence", b"format", b"name", b"namespace"]
        granted = store.acquire(Key(NAMESPACE, name), AcquireRequest("next", 60))
        assert granted.lease.token.fence == 2  # type: ignore[union-attr]
    before = _script_calls(store)
    assert store.prune(NAMESPACE, 0.0) == 0  # live leases now: no candidate, no call
    assert _script_calls(store) == before
    store.close()


def test_a_mixed_batch_changes_only_the_prunable_records(
    own_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """One script call judges a batch whose candidates are partly not prunable, as the indexes may
    say by the time it runs (here their entries written by hand): a lease renewed since, and a
    foreign or damaged value under the prefix. Only the prunable records change; the lease is held
    as it was; the foreign values are skipped, logged, and left byte for byte."""
    store = RedisStore(own_url)
    grow(store, NAMESPACE, 10)
    _ready(store)
    raw = _client(store)
    art = store._indexes.of(NAMESPACE).art
    held = store.acquire(Key(NAMESPACE, "held"), AcquireRequest("worker", 600))
    foreign = store.record_key(Key(NAMESPACE, "foreign"))
    damaged = store.record_key(Key(NAMESPACE, "damaged"))
    raw.set(foreign, b"not a hash")
    raw.hset(
        damaged,
        mapping={
            "format": "dibs.redis/1",
            "namespace": NAMESPACE,
            "name": "damaged",
            "fence": "x",
            "attempts": "1",
        },
    )
    # All three among the oldest artifacts, so the one batch of candidates holds them and the ten.
    raw.zadd(art, {"held": 1.0, "foreign": 2.0, "damaged": 3.0})
    held_before, damaged_before = raw.hgetall(store.record_key(Key(NAMESPACE, "held"))), raw.hgetall(damaged)
    before = _script_calls(store)
    with caplog.at_level(logging.WARNING, logger="dibs.stores.base"):
        assert store.prune(NAMESPACE, 0.0) == 10
    assert _script_calls(store) - before == 1
    skipped = [r.getMessage() for r in caplog.records if "skipping an unreadable record" in r.getMessage()]
    assert len(skipped) == 2
    assert any("not a hash" in m for m in skipped) and any("fence" in m for m in skipped)
    assert raw.get(foreign) == b"not a hash" and raw.hgetall(damaged) == damaged_before
    assert raw.hgetall(store.record_key(Key(NAMESPACE, "held"))) == held_before
    state = store.read(Key(NAMESPACE, "held"))
    assert state.status == "held" and state.lease is not None
    assert state.lease.token == held.lease.token  # type: ignore[union-attr]
    assert store.count_states(NAMESPACE) == {"held": 1, "expired": 0, "done": 0, "failed": 0}
    store.close()


def test_reap_runs_one_script_call_per_batch_and_publishes_each_expiry(own_url: str) -> None:
    """Reap through drop_many: one call for the expired leases of a batch; each cleared lease is
    published on its key's channel ('expired', what waiters wake on), a live one is not touched."""
    store = RedisStore(own_url)
    expired = [Key(NAMESPACE, f"gone-{i}") for i in range(5)]
    for key in expired:
        store.acquire(key, AcquireRequest("a", 0.0))
    live = Key(NAMESPACE, "live")
    store.acquire(live, AcquireRequest("b", 600))
    _ready(store)
    raw = _client(store)
    listener = raw.pubsub()
    listener.psubscribe(f"{store.prefix}chan:*")
    assert listener.get_message(timeout=5)["type"] == "psubscribe"
    before = _script_calls(store)
    assert store.reap(NAMESPACE) == 5
    assert _script_calls(store) - before == 1
    heard = []
    while (message := listener.get_message(timeout=1)) is not None:
        heard.append((message["channel"], message["data"]))
    listener.close()
    assert sorted(heard) == sorted((store.channel(key).encode(), b"expired") for key in expired)
    assert {store.read(key).status for key in expired} == {"free"} and store.read(live).status == "held"
    store.close()


def test_prune_on_a_cluster_under_a_hash_tag_runs_batches(caplog: pytest.LogCaptureFixture) -> None:
    """On a Redis Cluster whose prefix has a hash tag, every key of a namespace is in one slot: prune
    takes the batched script there too (not the scan), and keeps the fences."""
    from tests.redis_topologies import delete_prefix, missing, shared_cluster, unique_prefix

    if missing() is not None:
        pytest.skip(f"the Redis Cluster tests start their own cluster, but {missing()}")
    cluster = shared_cluster()
    prefix = "{" + unique_prefix().rstrip(":") + "}:"
    store = RedisStore(cluster.url(prefix))
    try:
        assert store._indexes.enabled
        keys = REMOVAL_BATCH + 3
        grow(store, NAMESPACE, keys)
        node = store._reach.node_of(store._indexes.marker)
        node.script_load(store._drop_many.registered.script)
        before = int(node.info("commandstats")["cmdstat_evalsha"]["calls"])
        assert store.prune(NAMESPACE, 0.0) == keys
        assert int(node.info("commandstats")["cmdstat_evalsha"]["calls"]) - before == 2
        granted = store.acquire(Key(NAMESPACE, "day-000005"), AcquireRequest("next", 60))
        assert granted.lease.token.fence == 2  # type: ignore[union-attr]
    finally:
        store.close()
        delete_prefix([server.client() for server in cluster.servers if server.alive()], prefix)

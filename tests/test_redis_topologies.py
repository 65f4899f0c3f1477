"""The Redis store on the topologies production runs (issue 29): a Redis Cluster, a Sentinel set,
replicas with ``min_replicas``, a user whose ACL is scoped to the prefix.

Every server is a real ``redis-server`` started by the test (``tests/redis_topologies.py``): a
3-master cluster and a Sentinel set shared by the tests of a process (each test under a prefix of
its own), and topologies of a test's own where it breaks one (a node killed, a failover). The shared
behaviour (the store contract and the model test) runs on both topologies in ``tests/contract``;
several processes racing across a failover are in ``tests/test_redis_topology_races.py``.

Each row of the issue's table for Redis has its regression here: no URL form for a cluster or a
Sentinel set; a plain ``redis://`` at a cluster node answering ``MOVED`` as a passing failure; ``dibs
ls`` listing one node's keys; a demoted master answering ``READONLY`` until the URL changed; a holder
told its lease was "released" when a failover lost it; a token granted twice across a failover; a
user scoped to the prefix refused the feed's pattern.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import re
import signal
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from reliability.faults import FaultProxy

import dibs
from dibs.errors import ConfigurationError, LeaseLost, StoreUnavailable
from dibs.keys import Key
from dibs.records import Granted, Held, LeaseRecord, Present, checksum
from dibs.stores import AcquireRequest, NewArtifact, open_store
from tests.cli_harness import dibs as run_dibs
from tests.redis_topologies import (
    Cluster,
    RedisServer,
    SentinelSet,
    _data_node,
    delete_prefix,
    missing,
    shared_cluster,
    shared_sentinels,
    unique_prefix,
)
from tests.services import unavailable

redis = pytest.importorskip("redis")
from dibs.stores.redis import RedisStore  # noqa: E402 -- only once redis-py is known to be there

GENEROUS = 60.0
DOCS = Path(__file__).resolve().parent.parent / "docs" / "deploy-redis.md"


@pytest.fixture(autouse=True)
def _servers_installed() -> None:
    why = missing()
    if why is not None:
        unavailable(f"these tests start their own Redis servers, but {why}")


@pytest.fixture
def prefix() -> str:
    return unique_prefix()


@pytest.fixture
def cluster(prefix: str) -> Iterator[Cluster]:
    cluster = shared_cluster()
    yield cluster
    clients = [server.client() for server in cluster.servers if server.alive()]
    delete_prefix(clients, prefix)
    for client in clients:
        client.close()


@pytest.fixture
def sentinels(prefix: str) -> Iterator[SentinelSet]:
    group = shared_sentinels()
    yield group
    with contextlib.closing(group.master.client()) as client:
        delete_prefix([client], prefix)


@pytest.fixture
def stores() -> Iterator[Any]:
    """Opens stores by URL; all are closed after the test."""
    opened: list[Any] = []

    def open_(url: str) -> RedisStore:
        store = open_store(url)
        assert isinstance(store, RedisStore)
        opened.append(store)
        return store

    yield open_
    for store in opened:
        store.close()


def _granted(outcome: object) -> LeaseRecord:
    assert isinstance(outcome, Granted), outcome
    return outcome.lease


def _complete(store: RedisStore, lease: LeaseRecord, payload: bytes = b"value") -> None:
    store.complete(lease.key, lease.token, NewArtifact("bytes", payload, checksum(payload)))


def _keys_on_every_master(cluster: Cluster, store: RedisStore, count: int) -> list[Key]:
    """At least ``count`` keys, and as many more as it takes to have one on each live master (asked
    of the cluster, not assumed: the prefix, random, decides the slots)."""
    live = {server.port for server in cluster.servers if server.alive()}
    keys: list[Key] = []
    masters: set[int] = set()
    while len(keys) < count or masters != live:
        key = Key("topology.keys", f"k{len(keys):03d}")
        keys.append(key)
        masters.add(cluster.master_of(store.record_key(key)).port)
    return keys


# -- Redis Cluster ----------------------------------------------------------------------------------


def test_a_cluster_url_lists_and_reaps_the_keys_of_every_master(
    cluster: Cluster, prefix: str, stores: Any
) -> None:
    """Regression: there was no cluster URL (``redis+cluster://`` refused), and a listing through a
    plain URL at one node saw that node's keys only."""
    store = stores(cluster.url(prefix))
    keys = _keys_on_every_master(cluster, store, 30)
    for number, key in enumerate(keys):
        lease = _granted(store.acquire(key, AcquireRequest("alice", 0 if number % 3 == 0 else 600)))
        if number % 3 == 1:
            _complete(store, lease)
    listing = list(store.list())
    assert sorted(state.key for state in listing) == sorted(keys)
    assert {state.status for state in listing} == {"held", "done", "expired"}
    assert store.reap() == len(keys[0::3])  # every expired lease, on whichever master it lives
    assert sorted(state.key for state in store.list()) == sorted(keys[1::3] + keys[2::3])


def test_dibs_ls_and_the_python_api_take_the_cluster_url(cluster: Cluster, prefix: str, stores: Any) -> None:
    url = cluster.url(prefix)
    names = [key.name for key in _keys_on_every_master(cluster, stores(url), 12)]
    client = dibs.Reservations(url, namespace="topology.keys", ttl=60)
    try:
        for name in names:
            assert client.run(name, lambda n=name: n.upper()) == name.upper()
    finally:
        client.close()
    listing = json.loads(run_dibs("ls", "--json", "--namespace", "topology.keys", store=url).stdout)
    assert sorted(row["key"] for row in listing) == sorted(names)
    assert {row["status"] for row in listing} == {"done"}


def test_a_plain_url_at_a_cluster_node_is_a_configuration_error_naming_the_cluster_url(
    cluster: Cluster, prefix: str, stores: Any
) -> None:
    """Regression: two keys in three answered ``MOVED`` as ``StoreUnavailable`` (a passing failure,
    so ``on_store_unavailable="run"`` ran keys unreserved) and the third worked."""
    node = cluster.servers[0]
    store = stores(f"redis://127.0.0.1:{node.port}/0?prefix={prefix}")
    for number in range(6):  # on every node, the node's own included
        with pytest.raises(ConfigurationError, match=r"node of a Redis Cluster; use 'redis\+cluster://"):
            store.acquire(Key("topology.plain", f"k{number}"), AcquireRequest("alice", 60))


def test_without_info_rights_a_moved_key_still_names_the_cluster_url(
    cluster: Cluster, prefix: str, stores: Any
) -> None:
    # A user that may not run INFO skips the check at connect: the node's own keys can be read, and a
    # key of another node (MOVED) is the same configuration error, never a passing failure; so is a
    # write of the node's own key, whose script names the namespace's index keys too (CROSSSLOT).
    node = cluster.servers[0]
    user, password = f"u{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    with contextlib.closing(node.client()) as admin:
        admin.acl_setuser(
            user,
            enabled=True,
            passwords=[f"+{password}"],
            keys=["*"],
            channels=["*"],
            commands=["+@all", "-info"],
        )
    try:
        store = stores(f"redis://{user}:{password}@127.0.0.1:{node.port}/0?prefix={prefix}")
        # The first key of the node's own and the first of another node's, by the cluster's slot map
        # (the prefix is the test's own, so which keys those are changes from run to run).
        served: dict[bool, Key] = {}
        for number in itertools.count():
            key = Key("topology.plain", f"k{number}")
            served.setdefault(cluster.master_of(store.record_key(key)) is node, key)
            if len(served) == 2:
                break
        assert store.read(served[True]).status == "free"
        with pytest.raises(ConfigurationError, match=r"MovedError.*use 'redis\+cluster://"):
            store.read(served[False])
        for key in served.values():
            with pytest.raises(ConfigurationError, match=r"(CrossSlot|Moved)Error.*use 'redis\+cluster://"):
                store.acquire(key, AcquireRequest("alice", 60))
    finally:
        with contextlib.closing(node.client()) as admin:
            admin.acl_deluser(user)
            delete_prefix([admin], prefix)


def test_a_cluster_url_at_a_standalone_server_is_a_configuration_error(tmp_path: Path, stores: Any) -> None:
    server = _data_node("plain", tmp_path).start()
    try:
        _wait(server.answers)
        store = stores(f"redis+cluster://127.0.0.1:{server.port}/?prefix=p:")
        with pytest.raises(ConfigurationError, match=r"not in cluster mode.*use 'redis://host:port/0'"):
            store.read(Key("topology.plain", "k"))
        plain = stores(f"redis://127.0.0.1:{server.port}/0?prefix=p:")
        assert plain.read(Key("topology.plain", "k")).status == "free"
    finally:
        server.stop()


def _wait(condition: Any, what: str = "a server to answer") -> Any:
    from tests.cli_harness import eventually

    return eventually(condition, what, GENEROUS)


def _subscriptions(cluster: Cluster, channel: str) -> int:
    """How many subscriptions hear ``channel`` in the whole cluster: each node's ``PUBLISH`` answers
    how many of its own clients heard it (the cluster hands the message to every node)."""
    total = 0
    for server in cluster.servers:
        if server.alive():
            with contextlib.closing(server.client()) as client:
                total += int(client.publish(channel, b"probe"))
    return total


def test_one_subscription_on_one_node_hears_the_keys_of_every_master(
    cluster: Cluster, prefix: str, stores: Any
) -> None:
    store = stores(cluster.url(prefix))
    keys = _keys_on_every_master(cluster, store, 12)
    assert _subscriptions(cluster, store.channel(keys[0])) == 0
    feed = store.change_feed()
    feed.open()
    try:
        assert _subscriptions(cluster, store.channel(keys[0])) == 1  # one connection, on one node
        assert feed.changes({}, GENEROUS)  # the probes themselves
        while feed.changes({}, 0.05):
            pass
        for key in keys:
            _complete(store, _granted(store.acquire(key, AcquireRequest("alice", 60))))
        heard: set[str] = set()
        watched = {key.digest: key for key in keys}
        while heard != set(watched):
            got = feed.changes(watched, GENEROUS)
            assert got, f"heard {len(heard)} of {len(watched)} keys"
            heard |= set(got)
    finally:
        feed.close()


def test_the_feed_moves_to_another_node_when_its_node_fails(tmp_path: Path, prefix: str, stores: Any) -> None:
    # A cluster of the test's own (a node is killed), serving the other masters' slots meanwhile.
    with Cluster.start(tmp_path, full_coverage=False) as cluster:
        store = stores(cluster.url(prefix, nodes=3))
        for key in _keys_on_every_master(cluster, store, 12):  # scripts loaded on every node before
            _complete(store, _granted(store.acquire(key, AcquireRequest("alice", 60))))
        feed = store.change_feed()
        feed.open()
        try:
            port = feed._pubsub.connection.port  # type: ignore[attr-defined]
            cluster.node(port).stop(signal.SIGKILL)
            with pytest.raises(StoreUnavailable):
                while True:  # the broken connection is noticed at the next look
                    feed.changes({}, 1.0)
            feed.close()
            for _ in range(len(cluster.servers)):  # the hub opens it again; each open tries a new node
                try:
                    feed.open()
                    break
                except StoreUnavailable:
                    feed.close()
            else:
                raise AssertionError("the feed found no live node to listen on")
            assert feed._pubsub.connection.port != port  # type: ignore[attr-defined]
            key = next(
                k
                for k in (Key("topology.failing", f"k{n}") for n in range(100))
                if cluster.master_of(store.record_key(k)).alive()
            )
            _complete(store, _granted(store.acquire(key, AcquireRequest("alice", 60))))
            got: set[str] = set()
            deadline = time.monotonic() + GENEROUS
            while key.digest not in got:  # nothing watched: only the key's own message can name it
                assert time.monotonic() < deadline, "the feed heard nothing on its new node"
                got = set(feed.changes({}, GENEROUS))
        finally:
            feed.close()


def test_keys_whose_slot_moves_are_followed(cluster: Cluster, prefix: str, stores: Any) -> None:
    store = stores(cluster.url(prefix))
    key, other = Key("topology.moving", "k"), Key("topology.moving", "other")
    lease = _granted(store.acquire(key, AcquireRequest("alice", 60)))
    _granted(store.acquire(other, AcquireRequest("alice", 60)))
    record_key = store.record_key(key)
    slot = int(cluster.servers[0].client().execute_command("CLUSTER KEYSLOT", record_key))

    def elsewhere() -> Any:
        return next(s for s in cluster.servers if s.alive() and s is not cluster.master_of(record_key))

    cluster.move_slot(slot, elsewhere())  # the store's slot map is now out of date: MOVED, followed
    assert store.heartbeat(key, lease.token, 60).token == lease.token
    cluster.move_slot(slot, elsewhere())
    assert [state.key for state in store.read_many([key, other])] == [key, other]  # a pipeline's MOVED
    cluster.move_slot(slot, elsewhere())
    _complete(store, lease)
    assert sorted(state.key for state in store.list()) == [key, other]
    assert isinstance(store.acquire(key, AcquireRequest("bob", 60)), Present)


def test_min_replicas_on_a_cluster_waits_on_the_replicas_of_the_keys_own_master(
    tmp_path: Path, prefix: str, stores: Any
) -> None:
    with Cluster.start(tmp_path) as cluster:
        replicated = cluster.servers[0]
        cluster.add_replica(replicated)
        store = stores(cluster.url(prefix, min_replicas=1, replica_timeout=0.2))
        keys = [Key("topology.wait", f"k{number}") for number in range(40)]
        on_replicated = [k for k in keys if cluster.master_of(store.record_key(k)) is replicated]
        elsewhere = [k for k in keys if cluster.master_of(store.record_key(k)) is not replicated]
        assert on_replicated and elsewhere
        lease = _granted(store.acquire(on_replicated[0], AcquireRequest("alice", 60)))
        _complete(store, lease)
        with pytest.raises(StoreUnavailable, match=r"only 0 of the 1 replica\(s\).*the lease was released"):
            store.acquire(elsewhere[0], AcquireRequest("alice", 60))
        state = store.read(elsewhere[0])
        assert state.lease is None and state.fence == 1  # released; its token is never used


# -- Redis Sentinel ---------------------------------------------------------------------------------


def test_a_sentinel_url_follows_a_failover(tmp_path: Path, prefix: str, stores: Any) -> None:
    """Regression: there was no Sentinel URL; a URL at the master answered ``READONLY`` after a
    failover until it was changed. Reads, acquires and heartbeats after the failover go to the new
    master without an error: the demoted master's ``READONLY`` says nothing ran, so they are sent
    again on a new connection, which asks the Sentinels."""
    with SentinelSet.start(tmp_path) as group:
        store = stores(group.url(prefix))
        held = _granted(store.acquire(Key("topology.failover", "held"), AcquireRequest("alice", 600)))
        done = Key("topology.failover", "done")
        _complete(store, _granted(store.acquire(done, AcquireRequest("alice", 600))))
        old = group.master
        group.failover()
        assert store.heartbeat(held.key, held.token, 600).token == held.token
        assert isinstance(store.acquire(done, AcquireRequest("bob", 600)), Present)
        assert isinstance(store.acquire(held.key, AcquireRequest("bob", 600)), Held)
        _complete(store, held)
        assert store.read(held.key).status == "done"
        # A plain URL at the demoted master: a passing failure that says what happened and what to use.
        plain = stores(f"redis://127.0.0.1:{old.port}/0?prefix={prefix}")
        with pytest.raises(StoreUnavailable, match=r"read-only replica.*'redis\+sentinel://"):
            plain.acquire(Key("topology.failover", "new"), AcquireRequest("alice", 600))
        assert plain.read(done).status == "done"  # reads still work on a replica


def test_sentinel_misconfigurations_are_configuration_errors(
    sentinels: SentinelSet, prefix: str, stores: Any
) -> None:
    key = Key("topology.sentinel", "k")
    nodes = ",".join(f"127.0.0.1:{s.port}" for s in sentinels.sentinels)
    unknown = stores(f"redis+sentinel://{nodes}/0?service_name=no-such-service&prefix={prefix}")
    with pytest.raises(ConfigurationError, match="no Sentinel monitors a service named 'no-such-service'"):
        unknown.read(key)
    data_node = stores(f"redis+sentinel://127.0.0.1:{sentinels.master.port}/0?service_name=x&prefix={prefix}")
    with pytest.raises(ConfigurationError, match="not Redis Sentinels"):
        data_node.read(key)
    at_a_sentinel = stores(f"redis://127.0.0.1:{sentinels.sentinels[0].port}/0?prefix={prefix}")
    with pytest.raises(ConfigurationError, match=r"it is a Redis Sentinel.*'redis\+sentinel://"):
        at_a_sentinel.read(key)
    good = stores(sentinels.url(prefix))
    assert good.read(key).status == "free"


def test_a_sentinel_url_survives_a_sentinel_that_is_down(
    sentinels: SentinelSet, prefix: str, stores: Any
) -> None:
    # The first Sentinel named does not answer: the next ones are asked.
    store = stores(sentinels.url(prefix, also=[_closed_port()]))
    _complete(store, _granted(store.acquire(Key("topology.sentinel", "k"), AcquireRequest("alice", 60))))


def _closed_port() -> int:
    from tests.components import free_port

    return free_port()


def test_min_replicas_refuses_what_a_failover_would_lose(tmp_path: Path, prefix: str, stores: Any) -> None:
    """Regression: a grant confirmed by the master alone was lost when its replica took over, and the
    same token was granted again (the loser told it was taken over "with token 1", its own). Without
    ``min_replicas`` that is what happens (shown first, so this test can fail); with it, a grant the
    replicas do not confirm is released and refused, so its token is never handed out."""
    with SentinelSet.start(tmp_path, replicas=1, sentinels=0) as pair:
        master, replica = pair.master, pair.replicas[0]
        plain = stores(f"redis://127.0.0.1:{master.port}/0?prefix={prefix}")
        waits = stores(
            f"redis://127.0.0.1:{master.port}/0?prefix={prefix}&min_replicas=1&replica_timeout=0.2"
        )
        safe, lost = Key("topology.split", "safe"), Key("topology.split", "lost")
        confirmed = _granted(waits.acquire(safe, AcquireRequest("alice", 600)))  # on the replica too
        # The replica is promoted (a failover), while the old master still takes writes (a split brain).
        with contextlib.closing(replica.client()) as client:
            client.execute_command("REPLICAOF", "NO", "ONE")
        with pytest.raises(StoreUnavailable, match=r"only 0 of the 1 replica\(s\).*lease was released"):
            waits.acquire(Key("topology.split", "refused"), AcquireRequest("alice", 600))
        unconfirmed = _granted(plain.acquire(lost, AcquireRequest("alice", 600)))
        # The old master rejoins as a replica of the new one and drops what it alone had.
        with contextlib.closing(master.client()) as client:
            client.execute_command("REPLICAOF", "127.0.0.1", replica.port)
        pair.master, pair.replicas = replica, [master]
        pair.wait_until(pair._replicas_linked, "the old master to replicate the new one")
        promoted = stores(f"redis://127.0.0.1:{replica.port}/0?prefix={prefix}")
        assert promoted.heartbeat(safe, confirmed.token, 600).token == confirmed.token
        again = _granted(promoted.acquire(lost, AcquireRequest("bob", 600)))
        assert again.token.fence == unconfirmed.token.fence  # the hazard: one token, two holders
        with pytest.raises(LeaseLost, match="lost writes made since this token was granted") as caught:
            promoted.heartbeat(lost, unconfirmed.token, 600)
        assert caught.value.fields["reason"] == "rolled_back"


# -- ACL --------------------------------------------------------------------------------------------


def _documented_acl(prefix: str, user: str, password: str) -> list[str]:
    """The ``ACL SETUSER`` rule docs/deploy-redis.md gives, for ``prefix`` and this user: the test
    runs what the page says, so the two cannot drift."""
    text = DOCS.read_text(encoding="utf-8")
    found = re.search(r"^ACL SETUSER dibs on >PASSWORD (.+)$", text, re.MULTILINE)
    assert found is not None, "docs/deploy-redis.md gives no 'ACL SETUSER dibs on >PASSWORD ...' line"
    rules = found.group(1).replace("dibs:", prefix).split()
    return [user, "on", f">{password}", *rules]


@pytest.fixture
def acl_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = _data_node("acl", tmp_path).start()
    _wait(server.answers)
    yield server
    server.stop()


def _user(server: RedisServer, *rules: str) -> tuple[str, str]:
    user, password = f"u{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    with contextlib.closing(server.client()) as admin:
        admin.execute_command("ACL", "SETUSER", user, "on", f">{password}", *rules)
    return user, password


def test_the_documented_acl_runs_every_operation_and_the_feed(
    acl_server: RedisServer, prefix: str, stores: Any
) -> None:
    """Regression: a user scoped to the prefix (``~prefix* &prefix*``) was refused the feed's
    ``PSUBSCRIBE prefix:chan:*`` (Redis 7 compares patterns literally), so waiters polled."""
    user, password = f"u{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    with contextlib.closing(acl_server.client()) as admin:
        admin.execute_command("ACL", "SETUSER", *_documented_acl(prefix, user, password))
    url = f"redis://{user}:{password}@127.0.0.1:{acl_server.port}/0?prefix={prefix}"
    store = stores(url)
    _every_operation(store)
    assert store.value_limit() > 0
    feed = store.change_feed()
    feed.open()
    try:
        key = Key("topology.acl", "woken")
        _complete(store, _granted(store.acquire(key, AcquireRequest("alice", 60))))
        assert key.digest in feed.changes({key.digest: key}, GENEROUS)
    finally:
        feed.close()
    with pytest.raises(ConfigurationError, match="refused to read"):  # and nothing outside the prefix
        stores(f"redis://{user}:{password}@127.0.0.1:{acl_server.port}/0?prefix=other:").read(key)


def test_a_user_without_the_index_commands_is_refused_before_anything_is_written(
    acl_server: RedisServer, prefix: str, stores: Any
) -> None:
    """Upgrading with the ACL documented before the indexes (no ZADD, ZREM, SADD): Redis refuses a
    script's command only when the script reaches it, keeping what it wrote before, so the record got
    its lease and the caller an error: a key held that nobody holds, until its ttl. The scripts ask
    first: the call is a ConfigurationError naming the commands, and the record is untouched."""
    user, password = f"u{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    rules = _documented_acl(prefix, user, password)[3:]
    old_rules = [rule for rule in rules if rule.lower() not in ("+zadd", "+zrem", "+sadd")]
    assert len(old_rules) == len(rules) - 3, rules
    with contextlib.closing(acl_server.client()) as admin:
        admin.execute_command("ACL", "SETUSER", user, "on", f">{password}", *old_rules)
    store = stores(f"redis://{user}:{password}@127.0.0.1:{acl_server.port}/0?prefix={prefix}")
    key = Key("topology.acl", "upgraded")
    with pytest.raises(ConfigurationError, match=r"(?i)zadd.*\+zadd \+zrem \+sadd"):
        store.acquire(key, AcquireRequest("alice", 60))
    with contextlib.closing(acl_server.client()) as admin:
        assert admin.exists(store.record_key(key)) == 0  # no lease was written
    full = stores(f"redis://127.0.0.1:{acl_server.port}/0?prefix={prefix}")
    assert isinstance(full.acquire(key, AcquireRequest("bob", 60)), Granted)  # nobody holds it


def _every_operation(store: RedisStore) -> None:
    key, other = Key("topology.acl", "k"), Key("topology.acl", "other")
    lease = _granted(store.acquire(key, AcquireRequest("alice", 60)))
    store.heartbeat(key, lease.token, 60)
    _complete(store, lease)
    assert store.read(key).status == "done"
    failing = _granted(store.acquire(other, AcquireRequest("alice", 0)))
    store.release(other, failing.token, "boom")
    assert [state.key for state in store.read_many([key, other])] == [key, other]
    assert sorted(state.key for state in store.list()) == [key, other]
    # The admin reads, through the indexes (built once here: the marker is absent on a new prefix).
    assert [s.key for s in store.list_page(None, state="done").states] == [key]
    assert store.count_states(key.namespace) == {"held": 0, "expired": 0, "done": 1, "failed": 1}
    assert [s.key for s in store.latest(None, "failure", limit=5)] == [other]
    assert store.leases(None, expired=True, limit=5) == store.leases(None, expired=False, limit=5) == []
    assert store.forget(key) and store.prune(None, 0) >= 1 and store.reap() >= 0
    _granted(store.acquire(key, AcquireRequest("bob", 60)))
    assert store.force_release(key)


def test_a_user_granted_only_the_channel_pattern_is_followed_too(
    acl_server: RedisServer, prefix: str, stores: Any
) -> None:
    user, password = _user(acl_server, f"~{prefix}*", "resetchannels", f"&{prefix}chan:*", "+@all")
    store = stores(f"redis://{user}:{password}@127.0.0.1:{acl_server.port}/0?prefix={prefix}")
    feed = store.change_feed()
    feed.open()  # {prefix}* is refused; {prefix}chan:* is the one granted
    try:
        key = Key("topology.acl", "k")
        _complete(store, _granted(store.acquire(key, AcquireRequest("alice", 60))))
        assert key.digest in feed.changes({key.digest: key}, GENEROUS)
    finally:
        feed.close()


def test_a_user_without_the_channels_is_told_what_to_grant(
    acl_server: RedisServer, prefix: str, stores: Any, caplog: pytest.LogCaptureFixture
) -> None:
    user, password = _user(acl_server, f"~{prefix}*", "resetchannels", "+@all")
    url = f"redis://{user}:{password}@127.0.0.1:{acl_server.port}/0?prefix={prefix}"
    store = stores(url)
    feed = store.change_feed()
    with pytest.raises(ConfigurationError, match=re.escape(f"ACL SETUSER <user> '&{prefix}*'")):
        feed.open()
    # Through a waiting client: the process's watch hub logs one WARNING saying what to grant, and the
    # wait still ends (its waiter polls).
    client = dibs.Reservations(url, namespace="topology.acl", ttl=60)
    try:
        got = client.get_or_reserve("k", owner="alice")
        assert isinstance(got, dibs.Acquired)
        with caplog.at_level(logging.WARNING, logger="dibs"), ThreadPoolExecutor(1) as pool:
            waited = pool.submit(client.wait, "k", timeout=GENEROUS)

            def warned() -> list[str]:
                return [r.getMessage() for r in caplog.records if "cannot follow" in r.getMessage()]

            warnings = _wait(warned, "the hub's warning")
            got.lease.complete("value")
            assert waited.result(GENEROUS).value == "value"
    finally:
        client.close()
    assert len(warnings) == 1 and f"&{prefix}*" in warnings[0] and "s3cret" not in warnings[0]


def test_a_complete_in_a_split_brain_is_reported_only_once_the_replicas_have_it(
    tmp_path: Path, prefix: str
) -> None:
    """With ``min_replicas``, a holder whose complete lands on a master that is being demoted (the
    Sentinels promoted its replica, it still takes writes) is not told the artifact is stored: the
    master's replica is gone, so ``WAIT`` is not met; the holder settles it by reading the key, and
    the read confirms the artifact with the replicas before trusting it. When the old master is made a
    replica (its writes dropped), the holder's next read finds the new master, where its lease still
    is (the grant was confirmed), and stores the artifact there: stored once, where it is kept."""
    with SentinelSet.start(tmp_path) as group:
        url = group.url(prefix, min_replicas=1, replica_timeout=0.2)
        holder = dibs.Reservations(url, namespace="topology.split", ttl=60)
        try:
            got = holder.get_or_reserve("k", owner="alice")
            assert isinstance(got, dibs.Acquired)
            store = holder.store.record_store
            refused: list[StoreUnavailable] = []
            confirm = store._confirm

            def counted(*args: Any) -> None:
                try:
                    confirm(*args)
                except StoreUnavailable as exc:
                    refused.append(exc)
                    raise

            store._confirm = counted
            group.failover(convert=False)  # the split brain: two masters
            with ThreadPoolExecutor(1) as pool:
                completing = pool.submit(got.lease.complete, "value")
                # The holder reads its artifact back from the old master, and is not told it is stored.
                _wait(lambda: len(refused) >= 2 or completing.done(), "the holder's reads to be refused")
                assert not completing.done(), "a complete on the old master was reported stored"
                assert "only 0 of the 1 replica(s)" in str(refused[0])
                group.convert()  # the old master drops its writes and its clients
                record = completing.result(GENEROUS)
            assert record.fence == got.lease.token
            with contextlib.closing(group.master.client()) as client:
                assert (
                    client.hget(store.record_key(Key("topology.split", "k")), "artifact_fence")
                    == str(record.fence).encode()
                )
            reader = dibs.Reservations(url, namespace="topology.split", ttl=60)
            try:
                assert reader.wait("k", timeout=GENEROUS).value == "value"
            finally:
                reader.close()
        finally:
            holder.close()


def test_a_key_in_a_slot_being_moved_follows_the_ask(cluster: Cluster, prefix: str, stores: Any) -> None:
    # A slot half-moved: its old node still has the keys it had, and answers ASK for one it does not
    # (a new key), which redis-py follows to the new node; after the move every key is found there.
    store = stores(cluster.url(prefix))
    old = Key("topology.ask", "old")
    _complete(store, _granted(store.acquire(old, AcquireRequest("alice", 60))))
    admin = cluster.servers[0].client()
    slot = int(admin.execute_command("CLUSTER KEYSLOT", store.record_key(old)))
    new = next(
        key
        for key in (Key("topology.ask", f"new-{n}") for n in range(200_000))
        if int(admin.execute_command("CLUSTER KEYSLOT", store.record_key(key))) == slot
    )
    admin.close()
    target = next(s for s in cluster.servers if s is not cluster.master_of(store.record_key(old)))
    with cluster.migrating(slot, target):
        assert isinstance(store.acquire(old, AcquireRequest("bob", 60)), Present)  # still on the old node
        lease = _granted(store.acquire(new, AcquireRequest("alice", 60)))  # ASK: on the new node
        with contextlib.closing(target.client()) as client:  # the new node has it (not the old one)
            assert store.record_key(new).encode() in client.execute_command(
                "CLUSTER", "GETKEYSINSLOT", slot, 10
            )
        _complete(store, lease)
    assert sorted(state.key for state in store.list()) == sorted([old, new])
    assert isinstance(store.acquire(new, AcquireRequest("bob", 60)), Present)


def test_clusterdown_is_a_passing_failure_and_the_store_recovers(
    tmp_path: Path, prefix: str, stores: Any
) -> None:
    """A master down (no replica to promote) takes the whole cluster down (``cluster-require-full-
    coverage``): every operation is ``StoreUnavailable`` (``CLUSTERDOWN``: the outage policy rides it
    out), never a configuration error; when the node is back, the same store works again."""
    with Cluster.start(tmp_path) as cluster:
        store = stores(cluster.url(prefix, nodes=3))
        key = Key("topology.down", "k")
        lease = _granted(store.acquire(key, AcquireRequest("alice", 600)))
        dead = next(s for s in cluster.servers if s is not cluster.master_of(store.record_key(key)))
        dead.stop(signal.SIGKILL)
        survivor = cluster.master_of(store.record_key(key))
        with contextlib.closing(survivor.client()) as client:
            cluster.wait_until(
                lambda: client.execute_command("CLUSTER INFO").get("cluster_state") == "fail",
                "the cluster to see the node fail",
            )
        with pytest.raises(StoreUnavailable, match=r"ClusterDownError"):
            store.heartbeat(key, lease.token, 600)
        dead.restart()
        cluster.wait_until(cluster.converged, "the node to rejoin")
        assert store.heartbeat(key, lease.token, 600).token == lease.token
        _complete(store, lease)
        assert store.read(key).status == "done"


def test_a_subscription_renewed_under_the_feed_reports_every_watched_key(
    cluster: Cluster, prefix: str, stores: Any
) -> None:
    """A cluster client that reads its slot map again (after a node failed a command) marks for
    reconnection every connection of each node it asks, the feed's too: redis-py then reconnects it
    and subscribes again, and what was published meanwhile is lost. The feed says so: every watched
    key may have changed, and the hub reads them all (found when a key's change was never heard)."""
    store = stores(cluster.url(prefix))
    key = Key("topology.renewed", "k")
    feed = store.change_feed()
    feed.open()
    try:
        cluster_client = store._reach.client()
        node = cluster_client.get_node(host="127.0.0.1", port=feed._pubsub.connection.port)  # type: ignore[attr-defined]
        # What the client's slot-map refresh does to each node it asks (NodesManager.initialize).
        cluster_client.get_redis_connection(node).connection_pool.update_active_connections_for_reconnect()
        with contextlib.closing(cluster.master_of(store.record_key(key)).client()) as client:
            client.publish(store.channel(key), b"complete")  # arrives on the marked connection
        got: set[str] = set()
        deadline = time.monotonic() + GENEROUS
        while key.digest not in got:
            assert time.monotonic() < deadline, "the change was lost, and the feed never said so"
            got = set(feed.changes({key.digest: key}, GENEROUS))
    finally:
        feed.close()


class _LoseOneReply(FaultProxy):
    """A faithful TCP proxy that, once armed, lets the next script run and cuts the connection before
    its reply comes back: the server ran it, and the client cannot know (a lost reply)."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        super().__init__(upstream_host, upstream_port)
        self._armed = False
        self._doomed: Any = None

    def arm(self) -> None:
        self._armed = True

    async def _pump(self, pipe: Any, source: Any, target: Any, way: str) -> None:
        while not pipe.closed:
            data = await source.read(65536)
            if not data:
                with contextlib.suppress(OSError, RuntimeError):
                    target.write_eof()
                return
            if way == "up" and self._armed and b"EVALSHA" in data:
                self._armed, self._doomed = False, pipe
            elif way == "down" and pipe is self._doomed:
                self._doomed = None
                pipe.abort()
                return
            target.write(data)
            await target.drain()


def test_after_a_lost_reply_only_what_is_safe_to_repeat_is_sent_again(
    acl_server: RedisServer, prefix: str, stores: Any
) -> None:
    """A script ran but its reply was lost (the connection cut on the way back). A read, a heartbeat
    and an acquire are sent again on a new connection, and their second run changes nothing the first
    did not: the owner re-enters the lease its lost reply granted (the same token, not the next). A
    complete is not sent again: it ran, and a second run would report the lease lost; it is
    ``StoreUnavailable``, which the holder settles by reading the key (its artifact is there)."""
    with _LoseOneReply("127.0.0.1", acl_server.port) as proxy:
        store = stores(f"redis://127.0.0.1:{proxy.port}/0?prefix={prefix}")
        warm = Key("topology.lost-reply", "warm")  # every script loaded: no NOSCRIPT reply to cut
        warm_lease = _granted(store.acquire(warm, AcquireRequest("alice", 600)))
        store.heartbeat(warm, warm_lease.token, 600)
        _complete(store, warm_lease)
        key = Key("topology.lost-reply", "k")
        proxy.arm()
        lease = _granted(store.acquire(key, AcquireRequest("alice", 600)))  # granted, then re-entered
        assert lease.token.fence == 1 and store.read(key).lease == lease
        proxy.arm()
        assert store.read(key).status == "held"
        proxy.arm()
        assert store.heartbeat(key, lease.token, 600).token == lease.token
        proxy.arm()
        with pytest.raises(StoreUnavailable, match="did not answer"):
            _complete(store, lease)
        state = store.read(key)
        assert state.status == "done" and state.artifact is not None and state.artifact.fence == 1


def test_sentinels_that_ask_for_a_password_get_sentinel_password(
    tmp_path: Path, prefix: str, stores: Any
) -> None:
    with SentinelSet.start(tmp_path, sentinels=1, sentinel_password="s3nt1nel-pw") as group:
        store = stores(group.url(prefix, sentinel_password="s3nt1nel-pw"))
        _complete(store, _granted(store.acquire(Key("topology.auth", "k"), AcquireRequest("alice", 60))))
        for url in (group.url(prefix), group.url(prefix, sentinel_password="wrong-pw")):
            with pytest.raises(ConfigurationError, match=r"Sentinel at 127\.0\.0\.1:\d+ refused") as caught:
                stores(url).read(Key("topology.auth", "k"))
            assert "wrong-pw" not in str(caught.value) and "s3nt1nel" not in str(caught.value)

"""What is specific to the Redis store; the shared behaviour is in ``tests/contract``.

Covered here: the Lua scripts are atomic when real OS processes race on one key, they follow the
pure state machine of :mod:`dibs.stores.transitions` step for step, pub/sub wakes waiters, an
unreachable server or a bad URL gives a clear error without secrets, and a foreign value at a dibs
key is reported and left byte for byte as it was. Needs ``DIBS_TEST_REDIS_URL`` (skips otherwise).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import queue
import random
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dibs.errors import ConfigurationError, CorruptRecord, LeaseLost, StoreUnavailable
from dibs.keys import Key
from dibs.records import (
    ArtifactRecord,
    FailureRecord,
    Granted,
    Held,
    KeyState,
    LeaseRecord,
    LeaseToken,
    Present,
    checksum,
)
from dibs.runtime import runtime
from dibs.stores import AcquireRequest, NewArtifact, open_store
from dibs.stores.base import Store
from dibs.stores.memory import MemoryStore
from dibs.testing.contract import opened_stores
from tests.backends.redis import isolated_url
from tests.cli_harness import eventually
from tests.components import free_port
from tests.redis_topologies import RedisServer, missing
from tests.scale import wait_until
from tests.services import unavailable

redis = pytest.importorskip("redis")
from dibs.stores.redis import RedisStore  # noqa: E402 -- only once redis-py is known to be there

SPAWN = multiprocessing.get_context("spawn")
KEY = Key("redis.tests", "the key")
GENEROUS = 60.0  # seconds; a healthy run never comes near it


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    with isolated_url(tmp_path) as url:
        yield url


@pytest.fixture
def open_redis(redis_url: str) -> Iterator[Callable[[], RedisStore]]:
    with opened_stores(lambda: RedisStore.from_url(redis_url)) as opener:
        yield opener


@pytest.fixture
def store(open_redis: Callable[[], RedisStore]) -> RedisStore:
    return open_redis()


@pytest.fixture
def raw(redis_url: str) -> Iterator[Any]:
    """A plain redis-py client on the test's server, to look under the store."""
    client = redis.Redis.from_url(redis_url.split("?", 1)[0])
    yield client
    client.close()


def _granted(outcome: object) -> LeaseRecord:
    assert isinstance(outcome, Granted), outcome
    return outcome.lease


def _complete(store: Store, lease: LeaseRecord, payload: bytes = b"value") -> ArtifactRecord:
    return store.complete(lease.key, lease.token, NewArtifact("bytes", payload, checksum(payload)))


# -- real processes racing --------------------------------------------------------------------------


def _race_worker(
    url: str, names: list[str], owner: str, *, ttl: float, rounds: int, start: Any, out: Any
) -> None:
    """Runs in a spawned child: acquire every name ``rounds`` times as soon as all children are ready."""
    store = open_store(url)
    try:
        start.wait(GENEROUS)
        seen = []
        for round_ in range(rounds):
            for name in names:
                outcome = store.acquire(Key("redis.race", name), AcquireRequest(f"{owner}-{round_}", ttl))
                kind = type(outcome).__name__
                lease = outcome.lease if isinstance(outcome, Granted | Held) else None
                seen.append((name, kind, None if lease is None else lease.token.fence, lease and lease.owner))
        out.put((owner, seen))
    except BaseException as exc:  # report instead of dying silently
        out.put((owner, repr(exc)))
    finally:
        store.close()


def _race(
    url: str, workers: int, names: list[str], ttl: float, rounds: int
) -> list[tuple[str, str, int, str]]:
    start, out = SPAWN.Barrier(workers), SPAWN.Queue()
    children = [
        SPAWN.Process(
            target=_race_worker,
            # each child walks the keys in its own order so that they collide all along the way
            args=(url, names[w:] + names[:w], f"worker{w}"),
            kwargs={"ttl": ttl, "rounds": rounds, "start": start, "out": out},
        )
        for w in range(workers)
    ]
    for child in children:
        child.start()
    try:
        reports = [out.get(timeout=GENEROUS * 2) for _ in children]
    finally:
        for child in children:
            child.join(GENEROUS)
    failed = [report for report in reports if isinstance(report[1], str)]
    assert not failed, failed
    return [entry for _, seen in reports for entry in seen]


def test_racing_processes_get_exactly_one_grant_per_key(redis_url: str) -> None:
    names = [f"k{i:02d}" for i in range(40)]
    seen = _race(redis_url, workers=8, names=names, ttl=GENEROUS * 10, rounds=1)
    grants = Counter(name for name, kind, _, _ in seen if kind == "Granted")
    assert grants == Counter(names), "some key was granted more than once, or never"
    winners = {name: owner for name, kind, _, owner in seen if kind == "Granted"}
    for name, kind, fence, owner in seen:
        assert fence == 1
        if kind == "Held":
            assert owner == winners[name]  # everybody else was told who holds it


def test_racing_takeovers_hand_out_every_fence_exactly_once(redis_url: str) -> None:
    # ttl=0: each lease is expired at once, so every acquire takes the key over and must get the next
    # fence. A read-then-write race would hand one fence out twice or skip one.
    workers, rounds = 6, 25
    seen = _race(redis_url, workers=workers, names=["hot"], ttl=0, rounds=rounds)
    assert {kind for _, kind, _, _ in seen} == {"Granted"}
    assert sorted(fence for _, _, fence, _ in seen) == list(range(1, workers * rounds + 1))


# -- the scripts follow transitions.py step for step ---------------------------------------------


def _lease(lease: LeaseRecord | None) -> object:
    if lease is None:
        return None
    return (lease.owner, lease.token.fence, lease.attempt, lease.ttl, lease.max_expires_at is not None)


def _failure(failure: FailureRecord | None) -> object:
    return None if failure is None else (failure.count, failure.error, failure.owner)


def _artifact(artifact: ArtifactRecord | None) -> object:
    if artifact is None:
        return None
    return (artifact.serializer, artifact.size, artifact.checksum, artifact.producer, artifact.fence)


def _state(state: KeyState) -> object:
    return (
        state.status,
        state.fence,
        state.attempts,
        _lease(state.lease),
        _artifact(state.artifact),
        _failure(state.failure),
    )


def _step(store: Store, tokens: list[LeaseToken], action: str, pick: random.Random) -> object:
    """Do one random operation; return what it did in a form two stores can be compared by."""
    owner = pick.choice(["alice", "bob", "carol"])
    # ttl 0 (expired at once) or long (live for the whole test): outcomes never depend on timing.
    ttl = pick.choice([0, GENEROUS * 10])
    # Mostly the newest token (writes that succeed), sometimes an older one (writes that are fenced).
    if not tokens:
        token = LeaseToken(1, "never-granted")
    else:
        token = tokens[-1] if pick.random() < 0.6 else pick.choice(tokens)
    try:
        if action == "acquire":
            outcome = store.acquire(KEY, AcquireRequest(owner, ttl, pick.choice([None, 0, GENEROUS * 10])))
            if isinstance(outcome, Granted):
                tokens.append(outcome.lease.token)
                return ("granted", _lease(outcome.lease), _failure(outcome.failure), outcome.took_over_from)
            if isinstance(outcome, Held):
                return ("held", _lease(outcome.lease), _failure(outcome.failure))
            assert isinstance(outcome, Present)
            return ("present", _artifact(outcome.artifact), outcome.artifact.payload)
        if action == "heartbeat":
            return ("renewed", _lease(store.heartbeat(KEY, token, ttl)))
        if action == "complete":
            payload = pick.choice([b"", b"v", bytes(range(256))])
            return (
                "completed",
                _artifact(store.complete(KEY, token, NewArtifact("bytes", payload, checksum(payload)))),
            )
        if action == "release":
            store.release(KEY, token, pick.choice([None, "boom", "x" * 5000]))
            return ("released",)
        if action == "force_release":
            return ("forced", store.force_release(KEY))
        if action == "forget":
            return ("forgot", store.forget(KEY))
        assert action == "reap"
        return ("reaped", store.reap(KEY.namespace))
    except LeaseLost as exc:
        return ("lost", str(exc), exc.fields)


@pytest.mark.parametrize("seed", range(6))
def test_scripts_match_the_reference_state_machine(store: RedisStore, seed: int) -> None:
    reference = MemoryStore()  # transitions.py applied by the reference store
    pick_redis, pick_reference = random.Random(seed), random.Random(seed)
    tokens_redis: list[LeaseToken] = []
    tokens_reference: list[LeaseToken] = []
    actions = ["acquire"] * 4 + ["heartbeat", "complete", "release", "force_release", "forget", "reap"]
    for number in range(120):
        action = pick_redis.choice(actions)
        assert pick_reference.choice(actions) == action
        got = _step(store, tokens_redis, action, pick_redis)
        expected = _step(reference, tokens_reference, action, pick_reference)
        assert got == expected, f"step {number} ({action}) of seed {seed}"
        assert _state(store.read(KEY)) == _state(reference.read(KEY)), f"after step {number} ({action})"


def test_store_time_is_the_redis_servers_clock(store: RedisStore, raw: Any) -> None:
    def server_now() -> float:
        seconds, micros = raw.time()
        return float(seconds) + float(micros) / 1_000_000

    before = server_now()
    lease = _granted(store.acquire(KEY, AcquireRequest("alice", 30)))
    after = server_now()
    assert before <= lease.acquired_at <= after
    assert lease.expires_at == lease.acquired_at + 30


def test_scripts_survive_a_flushed_script_cache(store: RedisStore, raw: Any) -> None:
    # A restart or failover forgets loaded scripts: each script is loaded again at its next run
    # (NOSCRIPT: it did not run), and run once. The cache is flushed before every script.
    other = Key("redis.tests", "other")
    raw.script_flush()
    lease = _granted(store.acquire(KEY, AcquireRequest("alice", 30)))
    raw.script_flush()
    assert store.heartbeat(KEY, lease.token, 30).token == lease.token
    raw.script_flush()
    _complete(store, lease)
    raw.script_flush()
    assert store.read(KEY).status == "done"
    raw.script_flush()
    assert [state.status for state in store.read_many([KEY])] == ["done"]
    raw.script_flush()
    assert store.forget(KEY)
    other_lease = _granted(store.acquire(other, AcquireRequest("bob", 30)))
    raw.script_flush()
    store.release(other, other_lease.token)
    raw.script_flush()  # the pipelines: redis-py loads the scripts before the pipeline runs
    assert sorted(state.key.name for state in store.list()) == ["other", "the key"]
    raw.script_flush()
    assert len(store.read_many([KEY, other])) == 2
    assert _granted(store.acquire(other, AcquireRequest("bob", 30))).token.fence == 2  # ran once


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A ``redis-server`` of the test's own: SCRIPT FLUSH empties a whole server's script cache,
    and on the shared one a neighbouring worker would load the scripts back between the flush and
    the call under test."""
    why = missing()
    if why is not None:
        unavailable(f"this test flushes a server's scripts, on a server of its own: {why}")
    port = free_port()
    config = ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path / "own"), "--save", ""]
    server = RedisServer("redis-own", tmp_path / "own", port, config).start()
    try:
        wait_until(server.answers, "the test's own Redis to answer")
        yield server
    finally:
        server.stop()


def test_a_script_the_server_will_not_keep_is_an_error_not_a_loop(
    own_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A load that does not reach the server the script runs on (a proxy spreading commands over
    # servers): the script is loaded once and run again once, then NOSCRIPT is StoreUnavailable.
    store = RedisStore.from_url(f"redis://127.0.0.1:{own_server.port}/0")
    raw = own_server.client()
    loads: list[object] = []
    monkeypatch.setattr(store._reach.client(), "script_load", loads.append)
    raw.script_flush()
    with pytest.raises(StoreUnavailable, match="NoScriptError"):
        store.acquire(KEY, AcquireRequest("alice", 30))
    assert len(loads) == 1
    monkeypatch.undo()
    try:
        assert _granted(store.acquire(KEY, AcquireRequest("alice", 30))).token.fence == 1
    finally:
        raw.close()
        store.close()


# -- pub/sub ----------------------------------------------------------------------------------------


def _end_the_lease(store: RedisStore, lease: LeaseRecord, how: str) -> None:
    if how == "complete":
        _complete(store, lease)
    elif how == "release":
        store.release(KEY, lease.token)
    elif how == "release with failure":
        store.release(KEY, lease.token, "boom")
    elif how == "force_release":
        assert store.force_release(KEY)
    else:
        assert how == "complete, then forget"
        _complete(store, lease)
        assert store.forget(KEY)


ENDINGS = ["complete", "release", "release with failure", "force_release", "complete, then forget"]


@pytest.mark.parametrize("how", ENDINGS)
def test_a_change_between_the_read_and_the_wait_is_not_lost(
    open_redis: Callable[[], RedisStore], how: str
) -> None:
    holder, waiter = open_redis(), open_redis()
    lease = _granted(holder.acquire(KEY, AcquireRequest("alice", 60)))
    feed = waiter.change_feed()
    feed.open()  # confirmed by the server before it returns
    try:
        assert isinstance(waiter.acquire(KEY, AcquireRequest("bob", 60)), Held)
        _end_the_lease(holder, lease, how)  # before the waiter gets to wait
        assert KEY.digest in feed.changes({KEY.digest: KEY}, GENEROUS)
    finally:
        feed.close()
    assert not isinstance(waiter.acquire(KEY, AcquireRequest("bob", 60)), Held)


@pytest.mark.parametrize("how", ["complete", "release"])
def test_a_blocked_waiter_is_woken(open_redis: Callable[[], RedisStore], how: str) -> None:
    holder, waiter = open_redis(), open_redis()
    lease = _granted(holder.acquire(KEY, AcquireRequest("alice", 60)))
    result: queue.Queue[KeyState | None] = queue.Queue()
    with runtime().subscribe(waiter, KEY) as subscription:

        def wait_for_the_end() -> None:
            state = subscription.wait(GENEROUS)
            while state is not None and state.lease is not None:  # the hub's first read: still held
                state = subscription.wait(GENEROUS)
            result.put(state)

        thread = threading.Thread(target=wait_for_the_end)
        thread.start()
        _end_the_lease(holder, lease, how)
        state = result.get(timeout=GENEROUS * 2)
        thread.join(GENEROUS)
    assert state is not None and state.lease is None


def test_each_key_has_its_own_channel_and_only_waitable_changes_publish(store: RedisStore, raw: Any) -> None:
    a, b = Key("redis.tests", "a"), Key("redis.tests", "b")
    listener = raw.pubsub()
    listener.psubscribe(f"{store.prefix}chan:*")
    assert _next_message(listener)["type"] == "psubscribe"

    done = _granted(store.acquire(a, AcquireRequest("alice", 60)))
    store.heartbeat(a, done.token, 60)
    _complete(store, done)
    failing = _granted(store.acquire(b, AcquireRequest("alice", 60)))
    store.release(b, failing.token, "boom")
    assert store.forget(a)
    _granted(store.acquire(b, AcquireRequest("bob", 60)))
    assert store.force_release(b)
    short = _granted(store.acquire(a, AcquireRequest("alice", 0)))
    assert store.reap(a.namespace) == 1 and short.expires_at == short.acquired_at
    # One connection delivers in publish order: a stray publish (say, by acquire) would show up here.
    seen = [_next_message(listener) for _ in range(5)]
    assert [(m["channel"].decode(), m["data"]) for m in seen] == [
        (store.channel(a), b"complete"),
        (store.channel(b), b"release"),
        (store.channel(a), b"result"),
        (store.channel(b), b"lease"),
        (store.channel(a), b"expired"),
    ]
    listener.close()


def _next_message(listener: Any) -> dict[str, Any]:
    message = listener.get_message(timeout=GENEROUS)
    assert message is not None, "nothing was published"
    return dict(message)


def test_the_feed_holds_one_pattern_subscription_until_closed(store: RedisStore, raw: Any) -> None:
    # Counted by PUBLISH, which answers how many subscriptions a message reached, on this test's own
    # prefix: PUBSUB NUMPAT counts every client of the server, other tests' feeds included.
    channels = [f"{store.prefix}chan:{KEY.digest}", f"{store.prefix}chan:{Key('redis.tests', 'b').digest}"]
    assert [raw.publish(channel, b"complete") for channel in channels] == [0, 0]
    feed = store.change_feed()
    feed.open()
    # One subscription reaches every key of the process: one pattern, not one channel per key.
    assert [raw.publish(channel, b"complete") for channel in channels] == [1, 1]
    feed.close()
    feed.close()  # twice is fine
    deadline = time.monotonic() + GENEROUS  # the server notices the closed connection on its own
    while raw.publish(channels[0], b"complete") != 0:
        assert time.monotonic() < deadline, "the feed's subscription outlived close()"
        time.sleep(0.01)


def test_the_feed_reports_only_this_prefix(open_redis: Callable[[], RedisStore], raw: Any) -> None:
    store = open_redis()
    feed = store.change_feed()
    feed.open()
    try:
        raw.publish(f"another-{store.prefix}chan:{KEY.digest}", b"complete")  # a foreign prefix
        raw.publish(f"{store.prefix}chan:{KEY.digest}", b"complete")
        assert feed.changes({KEY.digest: KEY}, GENEROUS) == {KEY.digest}
    finally:
        feed.close()


# -- errors -----------------------------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_unreachable_server_is_store_unavailable_without_the_password() -> None:
    store = RedisStore.from_url(f"redis://dibs:s3cret-pw@127.0.0.1:{_closed_port()}/0?prefix=t:")
    token = LeaseToken(1, "x")
    calls: list[Callable[[], object]] = [
        lambda: store.read(KEY),
        lambda: store.acquire(KEY, AcquireRequest("alice", 30)),
        lambda: store.heartbeat(KEY, token, 30),
        lambda: store.complete(KEY, token, NewArtifact("bytes", b"", checksum(b""))),
        lambda: store.release(KEY, token, "boom"),
        lambda: store.force_release(KEY),
        lambda: store.forget(KEY),
        lambda: list(store.list()),
        store.reap,
        lambda: store.change_feed().open(),
    ]
    for call in calls:
        with pytest.raises(StoreUnavailable) as caught:
            call()
        message = str(caught.value)
        assert "s3cret" not in message and "s3cret" not in repr(caught.value.fields)
        assert "redis://dibs:***@127.0.0.1" in message
    store.close()


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("redis://localhost:port/0", "Port could not be cast"),
        ("redis://localhost/zero", "'zero' is not a number"),
        ("redis://localhost/0?prefix=a*", "prefix 'a*'"),
        ("redis://localhost/0?prefix=", "prefix ''"),
        ("redis://localhost/0?prefix=a:&prefix=b:", "'prefix' is given 2 times"),
        ("redis://localhost/0?no_such_option=1", "no_such_option"),
        ("redis://localhost/0?socket_timeout=soon", "socket_timeout"),
        ("redis://localhost/0?decode_responses=true", "decode_responses='true': dibs reads replies as bytes"),
        ("memcached://localhost/0", "'memcached'"),
    ],
)
def test_bad_urls_name_what_is_wrong(url: str, named: str) -> None:
    with pytest.raises(ConfigurationError, match="expected 'redis://") as caught:
        RedisStore.from_url(url)
    assert named in str(caught.value)


@pytest.mark.parametrize(
    "url",
    [
        "redis://dibs:s3cret@localhost:6379/0?prefix=p:",
        "redis://:s3cret@localhost:6379/0",
        "rediss://dibs:s3cret@localhost:6380/0",
        "redis://dibs:s3c@ret@localhost:6379/0",  # an unescaped '@' inside the password
        "redis://localhost:6379/0?password=s3cret",
        "redis://dibs:s3cret@localhost:6379/0?no_such_option=1",  # the error's message, too
    ],
)
def test_urls_and_errors_never_show_the_password(url: str) -> None:
    try:
        store = open_store(url)
    except ConfigurationError as exc:
        shown = str(exc)
    else:
        assert isinstance(store, RedisStore)
        shown = f"{store.url} {store!r}"
        store.close()
    assert "s3c" not in shown and "ret@" not in shown
    assert "***" in shown


def test_invalid_ttls_are_configuration_errors(store: RedisStore) -> None:
    for ttl in (float("nan"), float("inf"), "30"):
        with pytest.raises(ConfigurationError, match="ttl"):
            store.acquire(KEY, AcquireRequest("alice", ttl))  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="max_lease_age"):
        store.acquire(KEY, AcquireRequest("alice", 30, float("inf")))
    assert store.read(KEY).status == "free"


# -- corrupted and foreign data ---------------------------------------------------------------------


def _plant(raw: Any, redis_key: str, kind: str) -> None:
    """Write something that is not a dibs record of KEY at its Redis key."""
    good = {
        "format": "dibs.redis/1",
        "namespace": KEY.namespace,
        "name": KEY.name,
        "fence": "3",
        "attempts": "3",
    }
    if kind == "a string":
        raw.set(redis_key, b"\x00\xffnot a record")
    elif kind == "a list":
        raw.rpush(redis_key, "a", "b")
    elif kind == "a foreign hash":
        raw.hset(redis_key, mapping={"user": "someone else's", "visits": "12"})
    elif kind == "a newer format":
        raw.hset(redis_key, mapping={**good, "format": "dibs.redis/99"})
    elif kind == "a damaged number":
        raw.hset(redis_key, mapping={**good, "fence": "three"})
    elif kind == "a number dibs never writes":
        raw.hset(redis_key, mapping={**good, "fence": "0x10"})  # Lua would read it, Python would not
    elif kind == "another key's record":
        raw.hset(redis_key, mapping={**good, "name": "some other key"})
    elif kind == "half a lease":
        raw.hset(redis_key, mapping={**good, "lease_owner": "alice", "lease_fence": "3"})
    else:
        assert kind == "an artifact without payload"
        artifact = {
            "artifact_serializer": "bytes",
            "artifact_size": "1",
            "artifact_checksum": checksum(b"x"),
            "artifact_producer": "alice",
            "artifact_fence": "3",
            "artifact_created_at": "1700000000",
        }
        raw.hset(redis_key, mapping={**good, **artifact})


def _snapshot(raw: Any, redis_key: str) -> object:
    # Not DUMP: a hash's serialized field order changes when Redis rehashes it, content does not.
    kind = raw.type(redis_key)
    content = {b"string": raw.get, b"list": lambda k: raw.lrange(k, 0, -1), b"hash": raw.hgetall}[kind]
    return kind, content(redis_key), raw.pttl(redis_key)


@pytest.mark.parametrize(
    "kind",
    [
        "a string",
        "a list",
        "a foreign hash",
        "a newer format",
        "a damaged number",
        "a number dibs never writes",
        "another key's record",
        "half a lease",
        "an artifact without payload",
    ],
)
def test_foreign_or_damaged_records_are_reported_and_left_untouched(
    store: RedisStore, raw: Any, kind: str
) -> None:
    redis_key = store.record_key(KEY)
    _plant(raw, redis_key, kind)
    before = _snapshot(raw, redis_key)
    token = LeaseToken(3, "x")
    calls: list[Callable[[], object]] = [
        lambda: store.read(KEY),
        lambda: store.acquire(KEY, AcquireRequest("alice", 30)),
        lambda: store.heartbeat(KEY, token, 30),
        lambda: store.complete(KEY, token, NewArtifact("bytes", b"x", checksum(b"x"))),
        lambda: store.release(KEY, token, "boom"),
        lambda: store.force_release(KEY),
        lambda: store.forget(KEY),
    ]
    for call in calls:
        with pytest.raises(CorruptRecord, match="left untouched") as caught:
            call()
        assert redis_key in str(caught.value)
    # Listing and reaping skip it (and count it), as every store does with an unreadable record.
    listing = store.list()
    assert list(listing) == [] and len(listing.skipped) == 1
    assert redis_key in listing.skipped[0].where
    assert store.reap() == 0
    assert _snapshot(raw, redis_key) == before
    # Other keys are not affected by one bad record.
    _complete(store, _granted(store.acquire(Key("redis.tests", "fine"), AcquireRequest("alice", 30))))


@pytest.mark.parametrize("suffix", [b"not-a-digest", b"\xff\xfe", b"0" * 64])
def test_listing_reports_what_is_not_a_record_under_the_prefix(
    store: RedisStore, raw: Any, suffix: bytes
) -> None:
    _complete(store, _granted(store.acquire(KEY, AcquireRequest("alice", 30))))
    foreign = store.prefix.encode() + b"rec:" + suffix
    # A true record of KEY, copied to a Redis key that is not KEY's: its digest gives it away.
    raw.hset(foreign, mapping=raw.hgetall(store.record_key(KEY)))
    before = raw.hgetall(foreign)
    listing = store.list()
    assert [state.key for state in listing] == [KEY]  # the true record is still listed
    assert len(listing.skipped) == 1 and "digest differs" in listing.skipped[0].why
    assert raw.hgetall(foreign) == before
    raw.delete(foreign)
    assert [state.key for state in store.list()] == [KEY]


def test_the_hubs_read_of_one_key_skips_a_key_the_server_refuses_as_its_read_of_several_does(
    store: RedisStore, raw: Any, redis_url: str
) -> None:
    """``read_many`` leaves out a key whose read the server answers with an error, so that its waiters
    ask for themselves: the pipelined read of several keys did, the direct read of one key raised.

    A value of the wrong type at a record key is not such an error (the read script reports it as a
    damaged record, skipped by both reads); an ACL that refuses one key's record is: the server
    answers NOPERM, a ``ResponseError``, for that key alone.
    """
    readable, refused, damaged = Key("redis.tests", "readable"), Key("redis.tests", "refused"), KEY
    for key in (readable, refused):
        _granted(store.acquire(key, AcquireRequest("alice", 30)))
    _plant(raw, store.record_key(damaged), "a list")
    assert store.read_many([damaged]) == []
    assert [state.key for state in store.read_many([damaged, readable])] == [readable]
    user, password = f"dibs-test-{uuid.uuid4().hex}", uuid.uuid4().hex
    try:
        raw.acl_setuser(
            user,
            enabled=True,
            passwords=[f"+{password}"],
            keys=[store.record_key(readable)],  # and no other key: reading ``refused`` is NOPERM
            channels=["*"],
            commands=["+@all"],
        )
    except redis.exceptions.ResponseError as exc:
        pytest.skip(f"this Redis server refuses ACL SETUSER ({exc}), needed for a per-key refusal")
    try:
        limited_url = redis_url.replace("redis://", f"redis://{user}:{password}@", 1)
        with opened_stores(lambda: RedisStore.from_url(limited_url)) as opener:
            limited = opener()
            with pytest.raises(ConfigurationError, match="no permissions"):
                limited.read(refused)  # the error is real: a waiter asking for itself gets it
            assert [state.key for state in limited.read_many([readable, refused])] == [readable]
            assert limited.read_many([refused]) == []
            assert [state.key for state in limited.read_many([readable])] == [readable]
    finally:
        raw.acl_deluser(user)


@contextlib.contextmanager
def _server_to_make_busy(redis_url: str) -> Iterator[str]:
    """The URL (with ``redis_url``'s prefix) of a Redis server this test may make BUSY: a private
    ``redis-server`` when there is one on PATH (a long script stalls every client of its server, and
    the shared one serves other tests), else the shared one for the short while the script runs."""
    binary = shutil.which("redis-server")
    if binary is None:
        yield redis_url
        return
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        client = redis.Redis(port=port, socket_connect_timeout=1)
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.exceptions.ConnectionError:
                time.sleep(0.05)
        client.close()
        yield f"redis://127.0.0.1:{port}/0?{redis_url.split('?', 1)[1]}"
    finally:
        server.terminate()
        server.wait(GENEROUS)


def test_the_hubs_reads_raise_while_the_server_is_busy_so_the_hub_reads_again(redis_url: str) -> None:
    """A server BUSY running a long script answers every read with an error reply that is not about
    the key, and passes: ``read_many`` (one key, or several in a pipeline) raises StoreUnavailable, so
    the hub reads them again later, instead of leaving them out as it does a key the server refuses
    this user (NOPERM) for good."""
    with _server_to_make_busy(redis_url) as url, opened_stores(lambda: RedisStore.from_url(url)) as opener:
        store = opener()
        keys = [Key("redis.tests", "one"), Key("redis.tests", "two")]
        for key in keys:
            _granted(store.acquire(key, AcquireRequest("alice", 30)))
        raw = redis.Redis.from_url(url.split("?", 1)[0])
        threshold = raw.config_get("busy-reply-threshold")["busy-reply-threshold"]
        raw.config_set("busy-reply-threshold", 10)  # milliseconds before other clients hear BUSY
        spinner = redis.Redis.from_url(url.split("?", 1)[0])
        spin = (  # runs ARGV[1] microseconds by the server's clock
            "local t = redis.call('TIME') local s = t[1] * 1000000 + t[2] "
            "repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] - s > tonumber(ARGV[1])"
        )
        spinning = threading.Thread(target=spinner.eval, args=(spin, 0, 1_500_000))
        try:
            spinning.start()
            for _ in range(200):
                try:
                    raw.ping()
                except redis.exceptions.ResponseError as exc:
                    assert "BUSY" in str(exc)
                    break
                time.sleep(0.005)
            else:
                raise AssertionError("the server never answered BUSY")
            with pytest.raises(StoreUnavailable, match="BUSY"):
                store.read_many(keys[:1])
            with pytest.raises(StoreUnavailable, match="BUSY"):
                store.read_many(keys)
        finally:
            spinning.join(GENEROUS)
            raw.config_set("busy-reply-threshold", threshold)
            spinner.close()
            raw.close()
        assert [state.key for state in store.read_many(keys)] == keys  # the script over: read again


@pytest.mark.parametrize(
    "error",
    [
        redis.exceptions.OutOfMemoryError("OOM command not allowed when used memory > 'maxmemory'"),
        redis.exceptions.ReadOnlyError("READONLY You can't write against a read only replica."),
        redis.exceptions.TryAgainError("TRYAGAIN Multiple keys request during rehashing of slot"),
        redis.exceptions.ClusterDownError("CLUSTERDOWN The cluster is down"),
        redis.exceptions.MasterDownError("MASTERDOWN Link with MASTER is down"),
    ],
    ids=lambda error: str(error).split()[0],
)
def test_the_hubs_reads_raise_on_a_passing_error_reply(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    """Error replies about the server, not the key (which no test can make a real server give on
    demand, nor for one key of a pipeline), raise StoreUnavailable from the hub's read of one key and
    of several; NOPERM alone skips the key."""
    other = Key("redis.tests", "other")
    for key in (KEY, other):
        _granted(store.acquire(key, AcquireRequest("alice", 30)))
    raised: Exception = error

    def failing(*_: Any) -> Any:  # the read script, called with its key and arguments
        raise raised

    client = store._reach.client()
    pipeline = client.pipeline

    def failing_last(*args: Any, **kwargs: Any) -> Any:  # the last key's reply is the error
        pipe = pipeline(*args, **kwargs)
        execute = pipe.execute

        def executed(raise_on_error: bool = True) -> list[Any]:
            replies = execute(raise_on_error=raise_on_error)
            replies[-1] = raised
            return replies

        pipe.execute = executed
        return pipe

    monkeypatch.setattr(client, "pipeline", failing_last)
    with pytest.raises(StoreUnavailable, match=str(error).split()[0]):
        store.read_many([KEY, other])
    monkeypatch.setattr(store, "_read", failing)
    with pytest.raises(StoreUnavailable, match=str(error).split()[0]):
        store.read_many([KEY])
    raised = redis.exceptions.NoPermissionError("NOPERM this user has no permissions to access the key")
    assert store.read_many([KEY]) == []
    monkeypatch.undo()
    monkeypatch.setattr(client, "pipeline", failing_last)
    assert [state.key for state in store.read_many([KEY, other])] == [KEY]


# -- short replies ----------------------------------------------------------------------------------


def _granted_as_read(store: RedisStore, outcome: object) -> LeaseRecord:
    """The grant's lease and failure, as filled in from a short reply, are the ones a read gives."""
    assert isinstance(outcome, Granted), outcome
    state = store.read(outcome.lease.key)
    assert outcome.lease == state.lease
    assert outcome.failure == state.failure
    return outcome.lease


def test_short_replies_fill_in_what_a_read_returns(store: RedisStore) -> None:
    # A grant and a complete return only the fields the caller did not send; the rest is filled in
    # from what it sent. The whole record must still be the stored one.
    fresh = _granted_as_read(store, store.acquire(Key("short.r", "fresh"), AcquireRequest("a", 600)))
    assert fresh.max_expires_at is None
    capped = Key("short.r", "capped")
    lease = _granted_as_read(store, store.acquire(capped, AcquireRequest("a", 600, max_lease_age=30)))
    assert lease.max_expires_at is not None
    reentered = store.acquire(capped, AcquireRequest("a", 300, max_lease_age=30))
    assert isinstance(reentered, Granted) and reentered.reentered
    _granted_as_read(store, reentered)
    assert store.heartbeat(capped, lease.token, 120) == store.read(capped).lease

    failed = Key("short.r", "failed")
    lease = _granted_as_read(store, store.acquire(failed, AcquireRequest("a", 600)))
    store.release(failed, lease.token, "boom")
    after_failure = store.acquire(failed, AcquireRequest("b", 600))
    assert isinstance(after_failure, Granted) and after_failure.failure is not None
    _granted_as_read(store, after_failure)

    expired = Key("short.r", "expired")
    store.acquire(expired, AcquireRequest("a", 0.05))
    eventually(lambda: store.read(expired).live_lease is None, "the lease to expire (Redis's clock)")
    takeover = store.acquire(expired, AcquireRequest("b", 600))
    assert isinstance(takeover, Granted) and takeover.took_over_from == "a"
    _granted_as_read(store, takeover)

    for name, seconds in (("sum", 0.1 + 0.2), ("huge", 1e300), ("none", None)):
        key = Key("short.r", name)
        lease = _granted_as_read(store, store.acquire(key, AcquireRequest("a", 600)))
        payload = b"v" * 10
        artifact = store.complete(key, lease.token, NewArtifact("bytes", payload, checksum(payload), seconds))
        assert artifact == store.read(key).artifact
    assert store.read(Key("short.r", "sum")).artifact.compute_seconds == 0.1 + 0.2  # type: ignore[union-attr]
    for name in ("sum", "none"):  # a hit's short reply: the stored artifact, payload included
        hit = store.acquire(Key("short.r", name), AcquireRequest("c", 600))
        assert isinstance(hit, Present) and hit.artifact == store.read(Key("short.r", name)).artifact

    stale = Key("short.r", "sum")  # an artifact older than max_age stays beside the new lease
    eventually(lambda: _artifact_age(store, stale) > 0.01, "the artifact to be older than max_age")
    _granted_as_read(store, store.acquire(stale, AcquireRequest("b", 600, max_age=0.01)))
    assert store.read(stale).artifact is not None


def _artifact_age(store: RedisStore, key: Key) -> float:
    """How old ``key``'s artifact is, by Redis's clock."""
    state = store.read(key)
    assert state.artifact is not None
    return state.now - state.artifact.created_at

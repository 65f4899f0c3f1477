"""The process-wide runtime, the watch hub and the hold loop, on the memory store and SQLite.

Nothing here needs a server; what needs one (connections counted by PostgreSQL and Redis, forked
children on every store) is in ``tests/test_runtime_processes.py`` and the scale tests.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
from collections.abc import Collection, Hashable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import dibs
from dibs.hub import Subscription, WatchHub
from dibs.keys import Key
from dibs.records import KeyState
from dibs.runtime import Runtime, runtime
from dibs.stores.feeds import PollingFeed, fingerprint
from dibs.stores.memory import MemoryStore
from dibs.stores.sql import SQLStore
from dibs.stores.sql import schema as sql_schema


class CountingMemoryStore(MemoryStore):
    """A memory store that records every read and what it found."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[KeyState] = []

    def read(self, key: Key) -> KeyState:
        state = super().read(key)
        self.found.append(state)
        return state


def _next_state(subscription: Subscription, until: Any, timeout: float = 30.0) -> KeyState:
    """The first state the hub offers that satisfies ``until`` (a generous bound, never a sleep)."""
    deadline = threading.Event()
    timer = threading.Timer(timeout, deadline.set)
    timer.start()
    try:
        while not deadline.is_set():
            state = subscription.wait(0.5)
            if state is not None and until(state):
                return state
        raise AssertionError("the hub never offered the expected state")
    finally:
        timer.cancel()


# -- one store per URL and process ------------------------------------------------------------------


def test_clients_of_one_url_share_one_store_and_keep_it_for_the_next(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    first, second = dibs.Reservations(url), dibs.Reservations(url, namespace="other", ttl=5)
    assert first.store is second.store
    first.close()
    second.close()
    again = dibs.Reservations(url)
    assert again.store is first.store  # kept open for the next client, not reopened
    again.close()


def test_idle_stores_beyond_the_limit_are_closed_oldest_first() -> None:
    urls = [f"memory://idle-{i}" for i in range(Runtime.MAX_IDLE + 2)]
    opened = []
    for url in urls:
        client = dibs.Reservations(url)
        opened.append(client.store)
        client.close()
    reopened = [dibs.Reservations(url) for url in urls]
    assert reopened[0].store is not opened[0] and reopened[1].store is not opened[1]  # evicted
    assert all(client.store is store for client, store in zip(reopened[2:], opened[2:], strict=True))
    for client in reopened:
        client.close()


def test_a_store_given_as_an_object_is_used_as_it_is_and_left_open() -> None:
    store = MemoryStore()
    with dibs.Reservations(store) as client:
        assert client.store is store
        client.run("k", lambda: 1)
    assert dibs.Reservations(store).status("k").status == "done"  # closing the client did not close it


def test_the_schema_is_checked_once_per_process_and_never_recreated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'once.db'}"
    dibs.Reservations(SQLStore(url)).run("k", lambda: "v")  # an earlier process created the tables
    monkeypatch.setattr(sql_schema, "_VERIFIED_SCHEMAS", {})  # this one has checked nothing yet
    schema_statements: list[str] = []

    def count(*args: Any) -> None:
        statement = str(args[2])
        if "_meta" in statement or "CREATE" in statement or "PRAGMA table" in statement:
            schema_statements.append(statement)

    store = SQLStore(url)
    sa.event.listen(store.engine, "before_cursor_execute", count)
    assert schema_statements == []  # opening sends nothing
    for _ in range(5):
        with dibs.Reservations(store) as client:
            assert client.run("k", lambda: "other") == "v"
    assert len(schema_statements) == 1 and schema_statements[0].startswith("SELECT")  # one read, no DDL
    another = SQLStore(url)  # a second object for the same URL (say, after the first was evicted)
    sa.event.listen(another.engine, "before_cursor_execute", count)
    assert dibs.Reservations(another).run("k", lambda: "other") == "v"
    assert len(schema_statements) == 1  # not checked again in this process


def test_an_async_client_opens_the_store_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[str] = []
    original = SQLStore._ensure_schema

    def recording(self: SQLStore) -> tuple[str, ...]:
        threads.append(threading.current_thread().name)
        return original(self)

    monkeypatch.setattr(SQLStore, "_ensure_schema", recording)

    async def scenario() -> object:
        loop_thread = threading.current_thread().name
        aio = dibs.Reservations(f"sqlite:///{tmp_path / 'async.db'}").aio()
        outcome = await aio.get_or_reserve("k", owner="me")
        assert threads and all(name != loop_thread for name in threads)
        return outcome

    assert isinstance(asyncio.run(scenario()), dibs.Acquired)
    assert all(name.startswith("dibs-io") for name in threads)


# -- the watch hub ----------------------------------------------------------------------------------


def test_the_hub_reads_a_changed_key_once_for_all_its_waiters() -> None:
    store = CountingMemoryStore()
    client = dibs.Reservations(store, ttl=60)
    got = client.get_or_reserve("popular", owner="holder")
    assert isinstance(got, dibs.Acquired)
    hub = runtime().hub(store)
    assert hub is not None
    key = client.key("popular")
    subscriptions = [hub.subscribe(key) for _ in range(50)]
    deadline = threading.Event()
    while not store.found and not deadline.wait(0.01):  # the hub's first read of the key
        pass
    got.lease.complete("the value")
    for subscription in subscriptions:
        state = _next_state(subscription, lambda s: s.artifact is not None)
        assert client.decode(key, state.artifact) == "the value"  # type: ignore[arg-type]
    # The completed state was read once, and that one read was handed to all fifty waiters. A second
    # read is allowed: when the completion lands between the feed's look at the key's version and the
    # hub's read of it, the feed rightly reports the newer version again (CI saw it once under load).
    assert 1 <= sum(1 for state in store.found if state.artifact is not None) <= 2
    for subscription in subscriptions:
        subscription.close()
    assert hub.waiters == 0


class _SlowLookingFeed(PollingFeed):
    """A polling feed that would look only every half minute, and records the keys of every look."""

    min_interval = max_interval = 30.0

    def __init__(self) -> None:
        super().__init__()
        self.looked: list[set[str]] = []

    def tokens(self, keys: Iterable[Key]) -> Mapping[str, Hashable]:
        keys = list(keys)
        self.looked.append({key.name for key in keys})
        return {key.digest: 0 for key in keys}


def test_a_polling_feed_hands_back_to_the_hub_when_a_key_is_added_and_looks_at_it_at_once() -> None:
    feed = _SlowLookingFeed()
    one, two = Key("default", "one"), Key("default", "two")
    assert feed.changes({one.digest: one}, 0.0) == {one.digest}  # new: reported at the first look
    returned: list[Collection[str]] = []
    looking = threading.Thread(target=lambda: returned.append(feed.changes({one.digest: one}, 600)))
    looking.start()
    feed.wake()  # as the hub does when a waiter subscribes to a key nobody watched
    looking.join(timeout=60)
    assert not looking.is_alive() and returned == [()]  # back to the hub, long before its 600 s
    assert feed.changes({one.digest: one, two.digest: two}, 600) == {two.digest}
    assert feed.looked[-1] == {"one", "two"}


def test_the_hub_wakes_its_feed_for_a_new_key_only() -> None:
    class Feed(_SlowLookingFeed):
        wakes = 0

        def wake(self) -> None:
            type(self).wakes += 1
            super().wake()

    hub = WatchHub(MemoryStore(), Feed())
    try:
        first = hub.subscribe(Key("default", "one"))
        again = hub.subscribe(Key("default", "one"))
        other = hub.subscribe(Key("default", "two"))
        assert Feed.wakes == 2
    finally:
        for subscription in (first, again, other):
            subscription.close()
        hub.close()


def test_heartbeats_and_re_entries_do_not_wake_waiters() -> None:
    client = dibs.Reservations(MemoryStore(), ttl=60)
    got = client.get_or_reserve("k", owner="holder")
    assert isinstance(got, dibs.Acquired)
    before = fingerprint(client.status("k"))
    got.lease.heartbeat()
    client.get_or_reserve("k", owner="holder")  # the holder re-enters: only its expiry moves
    assert fingerprint(client.status("k")) == before
    got.lease.complete(1)
    assert fingerprint(client.status("k")) != before


def test_closing_a_store_tells_its_waiters_to_ask_for_themselves() -> None:
    store = MemoryStore()
    subscription = runtime().subscribe(store, Key("default", "k"))
    answers: list[object] = []

    def wait_for_the_poke() -> None:
        answers.append(subscription.wait(600))  # the hub's first read may come first
        while answers[-1] is not None:
            answers.append(subscription.wait(600))

    waiter = threading.Thread(target=wait_for_the_poke)
    waiter.start()
    store.close()
    waiter.join(timeout=30)
    assert not waiter.is_alive() and answers[-1] is None


def test_a_waiter_is_woken_through_the_hub_and_gets_the_artifact() -> None:
    store = MemoryStore()
    client = dibs.Reservations(store, ttl=60)
    got = client.get_or_reserve("k", owner="holder")
    assert isinstance(got, dibs.Acquired)
    hub = runtime().hub(store)
    assert hub is not None
    result: list[object] = []
    waiter = threading.Thread(target=lambda: result.append(client.acquire("k", owner="waiter", timeout=600)))
    waiter.start()
    deadline = threading.Event()
    while hub.waiters == 0 and not deadline.wait(0.01):
        pass
    got.lease.complete({"rows": 3})
    waiter.join(timeout=30)
    assert len(result) == 1 and isinstance(result[0], dibs.Hit) and result[0].value == {"rows": 3}


# -- per-call lease terms --------------------------------------------------------------------------


def test_acquire_takes_a_per_call_ttl_and_can_return_busy_instead_of_raising() -> None:
    client = dibs.Reservations(MemoryStore(), ttl=60)
    got = client.get_or_reserve("k", owner="alice", ttl=5, max_lease_age=20)
    assert isinstance(got, dibs.Acquired)
    record = got.lease.record
    assert (record.ttl, record.expires_at - record.acquired_at, record.max_expires_at) == (
        5,
        pytest.approx(5, abs=0.5),
        pytest.approx(record.acquired_at + 20),
    )
    got.lease.heartbeat()
    assert got.lease.record.ttl == 5  # heartbeats keep the lease's own ttl
    busy = client.acquire("k", owner="bob", timeout=0, raise_on_timeout=False)
    assert isinstance(busy, dibs.Busy) and busy.holder == "alice"
    with pytest.raises(dibs.ConfigurationError, match="must be at least the ttl"):
        client.get_or_reserve("other", ttl=30, max_lease_age=10)


# -- the hold loop ------------------------------------------------------------------------------------


def test_asking_for_a_key_inside_its_own_work_is_refused() -> None:
    client = dibs.Reservations(MemoryStore(), ttl=60)
    with pytest.raises(dibs.ConfigurationError, match="inside its own work"):
        client.run("k", lambda: client.run("k", lambda: 1))
    state = client.status("k")
    assert state.lease is None and state.failure is not None  # released with the error recorded
    assert client.run("k", lambda: client.run("inner", lambda: 2)) == 2  # another key is fine


def test_a_stopped_work_releases_its_lease_recorded_as_stopped() -> None:
    client = dibs.Reservations(MemoryStore(), ttl=60)

    def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        client.run("k", interrupted)
    state = client.status("k")
    assert state.lease is None and state.failure is not None
    assert state.failure.error == "stopped: KeyboardInterrupt"


@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit, asyncio.CancelledError])
def test_a_stop_never_counts_towards_max_failures(stop: type[BaseException]) -> None:
    # With max_failures=1 the call after a Ctrl-C got TooManyFailures, though nothing had failed.
    client = dibs.Reservations(MemoryStore(), ttl=60, max_failures=1)

    def stopped() -> None:
        raise stop

    with pytest.raises(stop):
        client.run("k", stopped)
    failure = client.status("k").failure
    assert failure is not None and failure.count == 0 and failure.error.startswith("stopped: ")
    with pytest.raises(dibs.WaitTimeout, match=r"was stopped: "):
        client.wait("k", timeout=0, for_artifact=True)
    with pytest.raises(ValueError):  # a real failure still counts
        client.run("k", lambda: int("x"))
    with pytest.raises(dibs.TooManyFailures, match="failed 1 times"):
        client.run("k", lambda: 1)


class TaskTimeout(BaseException):
    """Like Airflow's AirflowTaskTimeout: a BaseException, so that user code does not catch it."""


def test_a_base_exception_that_is_no_stop_counts_as_a_failure() -> None:
    # Only the stops are exempt (Ctrl-C, SystemExit, cancellation): work ended by a task timeout
    # took too long, and must count towards max_failures, or it would be retried for ever.
    client = dibs.Reservations(MemoryStore(), ttl=60, max_failures=1)

    def too_slow() -> None:
        raise TaskTimeout("took more than 60s")

    with pytest.raises(TaskTimeout):
        client.run("k", too_slow)
    failure = client.status("k").failure
    assert failure is not None and failure.count == 1
    assert failure.error == "TaskTimeout: took more than 60s"
    with pytest.raises(dibs.TooManyFailures, match="failed 1 times"):
        client.run("k", lambda: 1)


def test_a_cancelled_async_work_releases_its_lease_recorded_but_not_counted() -> None:
    # Released at once (waiters take over), recorded as a stop, and not a failure for max_failures.
    client = dibs.Reservations(MemoryStore(), ttl=60, max_failures=1)
    started = asyncio.Event()

    async def forever() -> None:
        started.set()
        await asyncio.Event().wait()

    async def scenario() -> None:
        work = asyncio.ensure_future(client.aio().run("k", forever))
        await started.wait()
        work.cancel()
        with pytest.raises(asyncio.CancelledError):
            await work
        state = client.status("k")
        assert state.lease is None and state.failure is not None
        assert state.failure.error == "stopped: CancelledError"
        assert await client.aio().run("k", _one) == 1

    asyncio.run(scenario())


async def _one() -> int:
    return 1


def test_the_async_hold_stores_the_value_like_the_sync_one() -> None:
    client = dibs.Reservations(MemoryStore(), ttl=60)

    async def work() -> dict[str, int]:
        await asyncio.sleep(0)
        return {"rows": 7}

    async def scenario() -> dibs.RunReport:
        return await client.aio().compute("k", work)

    report = asyncio.run(scenario())
    assert (report.role, report.value, report.stored) == ("computed", {"rows": 7}, True)
    assert client.run("k", lambda: {"rows": 0}) == {"rows": 7}


@pytest.mark.parametrize("policy", ["fail", "run"])
def test_a_store_failing_at_complete_follows_the_policy(policy: str) -> None:
    class FailsAtComplete(MemoryStore):
        def complete(self, *args: Any, **kwargs: Any) -> Any:
            raise dibs.StoreUnavailable("the store went away")

    client = dibs.Reservations(FailsAtComplete(), ttl=1, on_store_unavailable=policy)  # type: ignore[arg-type]
    if policy == "fail":
        with pytest.raises(dibs.StoreUnavailable, match="went away"):
            client.compute("k", lambda: 3)
    else:
        report = client.compute("k", lambda: 3)
        assert (report.value, report.stored) == (3, False)


def test_a_followed_waiter_asks_for_itself_only_as_a_backstop() -> None:
    """Polling starts fast (20 ms) and settles at about a second; while the hub follows the store, a
    waiter's own first question waits about a second, and later ones up to about ten."""
    backoff = dibs.Backoff()
    rng = random.Random(7)
    polling = [backoff.delay(attempt, rng=rng) for attempt in range(12)]
    followed = [backoff.delay(attempt, notifies=True, rng=rng) for attempt in range(12)]
    assert polling[0] <= backoff.initial * (1 + backoff.jitter) and max(polling) <= backoff.maximum * 1.25
    assert followed[0] >= backoff.maximum * (1 - backoff.jitter)
    assert max(followed) <= backoff.notify_maximum * (1 + backoff.jitter)
    assert sum(1 for d in itertools.accumulate(followed) if d <= 20) <= 5  # questions in 20 s of waiting


def test_a_new_waiter_on_a_watched_key_brings_a_polling_feeds_next_look_back_to_its_shortest() -> None:
    """A polling feed looks ever less often while nothing changes; a waiter that joins has waited for
    nothing yet, so the interval starts again at its minimum (issue 20: a thousand waiters that took
    a second to subscribe found MariaDB's feed looking once a second)."""

    class Quiet(PollingFeed):
        def tokens(self, keys: Iterable[Key]) -> Mapping[str, Hashable]:
            return {}

    feed = Quiet()
    hub = WatchHub(MemoryStore(), feed)
    key = Key("unit", "polled")
    first = hub.subscribe(key)
    try:
        feed._interval = feed.max_interval  # as after a long quiet spell
        second = hub.subscribe(key)
        assert feed._interval == feed.min_interval
        second.close()
    finally:
        first.close()
        hub.close()


class _FailingView(MemoryStore):
    """A store wrapped around another's records (as a payload store's is) whose view of them fails."""

    def __init__(self, records: MemoryStore) -> None:
        super().__init__()
        self.records = records
        self.failed = threading.Semaphore(0)

    @property
    def record_store(self) -> MemoryStore:
        return self.records

    def view_many(self, states: Any) -> list[KeyState]:
        self.failed.release()
        raise OSError("the payload store is unreachable")


def test_one_hub_serves_the_views_of_a_record_store_and_a_failing_view_only_fails_its_own() -> None:
    records = MemoryStore()
    view = _FailingView(records)
    assert runtime().hub(view) is runtime().hub(records)  # one hub, one feed for both
    client = dibs.Reservations(records, ttl=60)
    got = client.get_or_reserve("k", owner="holder")
    assert isinstance(got, dibs.Acquired)
    direct = runtime().subscribe(records, got.key)
    through = runtime().subscribe(view, got.key)
    try:
        got.lease.complete(1)
        assert _next_state(direct, lambda s: s.artifact is not None).artifact is not None
        assert view.failed.acquire(timeout=30)  # the hub read the key through the view, which failed
        # ... so its waiter is offered "ask for yourself" (None), never handed the record unviewed:
        # an offer did arrive (wait alone returns None for no offer too).
        deadline = time.monotonic() + 30
        while not through._has and time.monotonic() < deadline:
            time.sleep(0.01)
        assert through._has, "the hub never offered the failing view's waiter anything"
        assert through._offered is None and through.wait(0) is None
    finally:
        direct.close()
        through.close()
        records.close()


def _in_a_forked_child(check: Any) -> int:
    """Run ``check`` in a forked child (exit code 0 when it returns true); the child's exit code, or -1
    if it had not ended after 20 s (then it is killed: a hang must fail the test, not the suite)."""
    import os
    import signal

    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            code = 0 if check() else 1
        finally:
            os._exit(code)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return -1


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="fork is POSIX")
def test_a_forked_childs_subscriptions_do_not_inherit_a_lock_held_in_the_parent() -> None:
    from dibs import hub as hub_module

    # The hub's thread holding a subscription's lock as the process forks: held by the main thread here.
    held = hub_module._LOCKS[0]

    def child() -> bool:
        made = [Subscription(None, Key("dibs-fork", "k"))]  # all kept: each at an address of its own
        while made[-1]._lock is not hub_module._LOCKS[0]:  # one mapped to the lock held in the parent
            made.append(Subscription(None, Key("dibs-fork", "k")))
        subscription = made[-1]
        if not subscription._lock.acquire(timeout=5):
            return False
        subscription._lock.release()
        subscription._offer(None)
        return subscription.wait(5) is None and asyncio.run(subscription.wait_async(0.01)) is None

    with held:
        code = _in_a_forked_child(child)
    assert code == 0


def test_a_subscription_keeps_no_instance_dict() -> None:
    """A triggerer holds a thousand: each keeps its slots only (issue 20), no dict for the collector."""
    subscription = Subscription(None, Key("default", "slots"))
    assert not hasattr(subscription, "__dict__")
    with pytest.raises(AttributeError):
        subscription.anything = 1  # type: ignore[attr-defined]
    store = MemoryStore()  # subclasses without __slots__ keep their dict, and weak references to them
    import weakref

    assert weakref.ref(store)() is store and hasattr(store, "__dict__")
    store.close()

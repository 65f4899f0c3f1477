"""DibsLockManager against the behaviours Prefect's own lock-manager tests check
(``tests/locking`` and prefect-redis's ``test_locking.py``), plus what Prefect's managers lack:
expiry and takeover of a holder that stopped heartbeating, and holding a lock past its ttl.

The manager is parametrized over an in-process store and a SQLite file; expiry is awaited by polling
(the store decides it), never by sleeping a fixed time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pickle
import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from uuid import uuid4

import pytest

pytest.importorskip("prefect")

from prefect.results import ResultStore

import dibs
import dibs.events
from dibs.errors import ConfigurationError
from prefect_dibs import DibsLockManager, DibsStore
from tests.prefect.support import wait_until


@pytest.fixture(params=["memory", "sqlite"])
def lock_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return (
        f"memory://locks-{uuid4().hex}" if request.param == "memory" else f"sqlite:///{tmp_path / 'locks.db'}"
    )


@pytest.fixture
def manager(lock_url: str) -> Iterator[DibsLockManager]:
    lock_manager = DibsLockManager(lock_url, ttl=2, heartbeat_interval=0.5)
    yield lock_manager
    lock_manager.release_all()


@pytest.fixture
def key() -> str:
    return str(uuid4())


# -- Prefect's behaviours ------------------------------------------------------------------------------


def test_acquire_and_release(manager: DibsLockManager, key: str) -> None:
    assert manager.acquire_lock(key, holder="holder1")
    assert manager.is_locked(key)
    manager.release_lock(key, holder="holder1")
    assert not manager.is_locked(key)


@pytest.mark.anyio
async def test_acquire_async(manager: DibsLockManager, key: str) -> None:
    assert await manager.aacquire_lock(key, holder="holder1")
    assert manager.is_locked(key)
    manager.release_lock(key, holder="holder1")
    assert not manager.is_locked(key)


def test_acquire_is_idempotent_for_the_same_holder(manager: DibsLockManager, key: str) -> None:
    assert manager.acquire_lock(key, holder="holder1")
    assert manager.acquire_lock(key, holder="holder1")
    assert manager.is_locked(key)
    manager.release_lock(key, holder="holder1")
    assert not manager.is_locked(key)


def test_hold_timeout_expires_the_lock(manager: DibsLockManager, key: str) -> None:
    assert manager.acquire_lock(key, holder="holder1", hold_timeout=0.1)
    wait_until(lambda: not manager.is_locked(key), what="the hold timeout to expire the lock")


def test_hold_timeout_longer_than_the_ttl_is_honoured(lock_url: str, key: str) -> None:
    """Heartbeats carry the lock past its ttl, and stop at hold_timeout."""
    manager = DibsLockManager(lock_url, ttl=1, heartbeat_interval=0.25)
    assert manager.acquire_lock(key, holder="holder1", hold_timeout=2.0)
    lease = manager.client.status(manager._key(key)).lease
    assert lease is not None and lease.max_expires_at == pytest.approx(lease.acquired_at + 2.0)
    # still held once the store's clock is past acquisition + ttl: the heartbeats renewed it
    wait_until(lambda: manager.client.status(manager._key(key)).now > lease.acquired_at + 1.2, what="a ttl")
    assert manager.is_lock_holder(key, "holder1")
    wait_until(lambda: not manager.is_locked(key), what="the hold timeout")


def test_acquire_timeout_gives_up(manager: DibsLockManager, key: str) -> None:
    assert manager.acquire_lock(key=key, holder="holder1")
    assert not manager.acquire_lock(key=key, holder="holder2", acquire_timeout=0.1)
    assert not manager.acquire_lock(key=key, holder="holder2", acquire_timeout=0)
    manager.release_lock(key=key, holder="holder1")
    assert not manager.is_locked(key=key)


def test_waiter_takes_the_lock_when_the_previous_hold_timed_out(manager: DibsLockManager, key: str) -> None:
    assert manager.acquire_lock(key=key, holder="holder1", hold_timeout=0.1)
    assert manager.acquire_lock(key=key, holder="holder2")  # blocks, then acquires
    assert manager.is_lock_holder(key, "holder2")
    manager.release_lock(key=key, holder="holder2")
    assert not manager.is_locked(key=key)


def test_releasing_with_the_wrong_holder_raises(manager: DibsLockManager, key: str) -> None:
    assert manager.acquire_lock(key=key, holder="holder1")
    with pytest.raises(ValueError, match=f"No lock held by holder2 for transaction with key {key}"):
        manager.release_lock(key=key, holder="holder2")
    assert manager.is_lock_holder(key, "holder1")


def test_releasing_a_lock_nobody_holds_is_a_no_op(manager: DibsLockManager, key: str) -> None:
    # prefect#17676: a transaction may release again after a rollback released it
    manager.release_lock(key=key, holder="holder1")
    assert manager.acquire_lock(key=key, holder="holder1")
    manager.release_lock(key=key, holder="holder1")
    manager.release_lock(key=key, holder="holder1")
    assert manager.acquire_lock(key=key, holder="holder2")
    with pytest.raises(ValueError):
        manager.release_lock(key=key, holder="holder1")
    manager.release_lock(key=key, holder="holder2")


def test_is_lock_holder(manager: DibsLockManager, key: str) -> None:
    assert not manager.is_lock_holder(key, holder="holder1")
    assert manager.acquire_lock(key, holder="holder1")
    assert manager.is_lock_holder(key, holder="holder1")
    assert not manager.is_lock_holder(key, holder="holder2")


def test_wait_for_lock(manager: DibsLockManager, key: str) -> None:
    assert manager.acquire_lock(key, holder="holder1", hold_timeout=0.1)
    assert manager.wait_for_lock(key)
    assert not manager.is_locked(key)


def test_wait_for_lock_with_timeout(manager: DibsLockManager, key: str) -> None:
    assert manager.acquire_lock(key, holder="holder1")
    assert not manager.wait_for_lock(key, timeout=0.1)
    assert manager.is_locked(key)
    manager.release_lock(key, holder="holder1")
    assert manager.wait_for_lock(key, timeout=0.1)


def test_wait_for_a_lock_never_taken(manager: DibsLockManager, key: str) -> None:
    assert not manager.is_locked(key)
    assert manager.wait_for_lock(key)


@pytest.mark.anyio
async def test_await_for_lock(manager: DibsLockManager, key: str) -> None:
    assert await manager.aacquire_lock(key, holder="holder1")
    assert not await manager.await_for_lock(key, timeout=0.1)
    assert await manager.await_for_lock(str(uuid4()))
    release = asyncio.get_running_loop().call_later(0.05, manager.release_lock, key, "holder1")
    assert await manager.await_for_lock(key, timeout=60)
    release.cancel()


@pytest.mark.anyio
async def test_async_waiter_leaves_the_event_loop_free(manager: DibsLockManager, key: str) -> None:
    assert manager.acquire_lock(key, holder="holder1")
    waiter = asyncio.create_task(manager.aacquire_lock(key, holder="holder2", acquire_timeout=60))
    for _ in range(5):  # the loop keeps running other work while holder2 waits
        await asyncio.sleep(0)
    assert not waiter.done()
    manager.release_lock(key, holder="holder1")
    assert await asyncio.wait_for(waiter, timeout=60)
    assert manager.is_lock_holder(key, "holder2")


def test_locking_works_across_threads(manager: DibsLockManager, key: str) -> None:
    """The second holder really waits (it found the lock busy before the release) and takes it once
    the first one releases it."""
    assert manager.acquire_lock(key, holder="holder1")
    got: queue.Queue[bool] = queue.Queue()
    waiting = threading.Event()

    def heard(event: dibs.Event) -> None:
        if isinstance(event, dibs.KeyBusy) and event.holder.endswith("holder1"):
            waiting.set()

    with dibs.observe(heard):
        thread = threading.Thread(target=lambda: got.put(manager.acquire_lock(key, holder="holder2")))
        thread.start()
        assert waiting.wait(30), "the second holder never found the lock busy"
        manager.release_lock(key, holder="holder1")
        thread.join(30)
    assert got.get_nowait() is True
    assert manager.is_lock_holder(key, "holder2")


def test_result_store_read_blocks_until_the_writer_releases(manager: DibsLockManager, key: str) -> None:
    store = ResultStore(lock_manager=manager)
    read: queue.Queue[object] = queue.Queue()
    assert store.acquire_lock(key, holder="holder1")
    thread = threading.Thread(target=lambda: read.put(store.read(key).result))
    thread.start()
    store.write(key=key, obj={"test": "value"}, holder="holder1")
    store.release_lock(key, holder="holder1")
    thread.join(timeout=60)
    assert read.get_nowait() == {"test": "value"}


def test_result_store_write_checks_the_holder(manager: DibsLockManager, key: str) -> None:
    store = ResultStore(lock_manager=manager)
    assert store.acquire_lock(key)  # Prefect's default holder: host, process, thread
    store.write(key=key, obj={"test": "value"})
    other = str(uuid4())
    assert store.acquire_lock(other, holder="holder1")
    with pytest.raises(
        RuntimeError, match=f"Cannot write to result record with key {other} because it is locked"
    ):
        store.write(key=other, obj={"test": "value"}, holder="holder2")


# -- what Prefect's managers do not do -----------------------------------------------------------------


def test_a_holder_that_stops_heartbeating_is_taken_over(
    lock_url: str, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A holder that dies stops heartbeating: its lock expires after the ttl and a waiter takes it."""
    crashed = DibsLockManager(lock_url, ttl=1, heartbeat_interval=0.25)
    assert crashed.acquire_lock(key, holder="crashed")
    # As if the process froze: no more heartbeats, no release.
    crashed._held[crashed._key(key)].keeper.stop()  # type: ignore[union-attr]
    waiter = DibsLockManager(lock_url, ttl=1, heartbeat_interval=0.25)
    with caplog.at_level(logging.WARNING, logger="prefect_dibs"):
        assert waiter.acquire_lock(key, holder="waiter", acquire_timeout=60)
    (took_over,) = [r.getMessage() for r in caplog.records if "took over" in r.getMessage()]
    assert "from 'crashed': its holder stopped heartbeating, so its lease expired" in took_over
    state = waiter.client.status(waiter._key(key))
    assert state.lease is not None and state.lease.owner == "waiter" and state.lease.token.fence == 2
    assert not crashed.is_lock_holder(key, "crashed")
    # Had the "crashed" holder only paused, its late release must not fail its finished run, nor
    # free the new holder's lock (Prefect already refuses its late result write: it is not the holder).
    crashed.release_lock(key, holder="crashed")
    assert waiter.is_lock_holder(key, "waiter")
    with pytest.raises(ValueError, match="No lock held by stranger"):
        crashed.release_lock(key, holder="stranger")
    waiter.release_all()


def test_a_takeover_after_a_hold_timeout_says_so(
    lock_url: str, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A lock that reached its hold_timeout expired whatever its holder did: the takeover says that,
    not that the holder stopped heartbeating (it did not: the heartbeats carried it past its ttl)."""
    holder = DibsLockManager(lock_url, ttl=1, heartbeat_interval=0.25)
    assert holder.acquire_lock(key, holder="holder1", hold_timeout=3)
    waiter = DibsLockManager(lock_url, ttl=1, heartbeat_interval=0.25)
    with caplog.at_level(logging.WARNING, logger="prefect_dibs"):
        assert waiter.acquire_lock(key, holder="holder2", acquire_timeout=60)
    (took_over,) = [r.getMessage() for r in caplog.records if "took over" in r.getMessage()]
    assert took_over.endswith("from 'holder1': its hold_timeout (3s) ran out")
    assert "stopped heartbeating" not in took_over
    holder.release_all()
    waiter.release_all()


def test_a_live_holder_keeps_its_lock_past_the_ttl(lock_url: str, key: str) -> None:
    manager = DibsLockManager(lock_url, ttl=1, heartbeat_interval=0.25)
    assert manager.acquire_lock(key, holder="holder1")
    lease = manager.client.status(manager._key(key)).lease
    assert lease is not None
    wait_until(lambda: manager.client.status(manager._key(key)).now > lease.expires_at + 0.5, what="a ttl")
    assert manager.is_lock_holder(key, "holder1")
    assert not manager.acquire_lock(key, holder="holder2", acquire_timeout=0)
    manager.release_all()


def test_a_held_lock_tells_the_observers_of_its_heartbeats(lock_url: str, key: str) -> None:
    """A lock's heartbeats reach the process's observers (metrics of heartbeat lateness, Prefect
    events), as a reserved task's do."""
    heard: queue.Queue[dibs.Event] = queue.Queue()
    manager = DibsLockManager(lock_url, ttl=1, heartbeat_interval=0.25)
    with contextlib.closing(dibs.observe(heard.put)):
        assert manager.acquire_lock(key, holder="holder1")
        beat = heard.get(timeout=30)
        while not isinstance(beat, dibs.events.HeartbeatSent):
            beat = heard.get(timeout=30)
        manager.release_all()
    assert beat.frontend == "prefect" and beat.lateness >= 0.0
    assert beat.key == manager._key(key)


def test_a_lock_s_store_operations_name_prefect_even_its_release(manager: DibsLockManager, key: str) -> None:
    """Prefect releases a lock in a call of its own, after the one that took it: the lease remembers
    whose it is, so its release (like its acquisition and heartbeats) names the front end in the
    metrics (``dibs.frontend``)."""
    operations: list[tuple[str, str]] = []

    class Operations:
        kinds = dibs.events.EVERY_KIND

        def __call__(self, event: dibs.Event) -> None:
            if isinstance(event, dibs.StoreOperation):
                operations.append((event.operation, event.frontend))

    with contextlib.closing(dibs.observe(Operations())):
        assert manager.acquire_lock(key, holder="holder1")
        manager.release_lock(key, holder="holder1")
    assert ("acquire", "prefect") in operations and ("release", "prefect") in operations
    assert {frontend for operation, frontend in operations if operation in ("acquire", "release")} == {
        "prefect"
    }


def test_release_from_another_copy_of_the_manager(manager: DibsLockManager, lock_url: str, key: str) -> None:
    """The store decides who holds a lock: a copy (another worker) may release the holder's lock."""
    if lock_url.startswith("memory://"):
        pytest.skip("an unpickled copy of a memory store is another store")
    assert manager.acquire_lock(key, holder="holder1")
    copy = pickle.loads(pickle.dumps(manager))
    assert copy.is_lock_holder(key, "holder1")
    with pytest.raises(ValueError):
        copy.release_lock(key, holder="holder2")
    copy.release_lock(key, holder="holder1")
    assert not manager.is_locked(key)


def test_pickles_as_configuration_only(manager: DibsLockManager, key: str) -> None:
    assert manager.acquire_lock(key, holder="holder1")
    state = manager.__getstate__()
    assert set(state) == {"store", "namespace", "ttl", "heartbeat_interval", "backoff"}
    copy = pickle.loads(pickle.dumps(manager))
    assert copy == manager and hash(copy) == hash(manager)
    assert copy._client is None and copy._held == {}
    other = str(uuid4())
    assert copy.acquire_lock(other, holder="holder9", hold_timeout=5)
    assert copy.is_lock_holder(other, "holder9")
    copy.release_all()


def test_pickling_a_manager_built_on_a_live_client_fails_clearly(lock_url: str) -> None:
    import dibs

    with dibs.Reservations(lock_url) as client:
        manager = DibsLockManager(client, ttl=5)
        assert manager.acquire_lock("k", holder="h")
        manager.release_lock("k", holder="h")
        with pytest.raises(TypeError, match="cannot be pickled"):
            pickle.dumps(manager)


def test_long_and_binary_keys_are_hashed(manager: DibsLockManager) -> None:
    for key in ("x" * 5000, "line\nbreak"):
        assert manager.acquire_lock(key, holder="holder1")
        assert manager.is_lock_holder(key, "holder1")
        manager.release_lock(key, holder="holder1")


def test_configuration_is_validated(lock_url: str) -> None:
    with pytest.raises(ConfigurationError, match="heartbeat_interval"):
        DibsLockManager(lock_url, ttl=1, heartbeat_interval=2)
    with pytest.raises(ConfigurationError, match="namespace"):
        DibsLockManager(lock_url, namespace="../etc")
    with pytest.raises(ConfigurationError, match="hold_timeout"):
        DibsLockManager(lock_url).acquire_lock("k", holder="h", hold_timeout=-1)


def test_equal_managers_combine_in_cache_policies(lock_url: str) -> None:
    from prefect.cache_policies import INPUTS, TASK_SOURCE

    one = INPUTS.configure(isolation_level="SERIALIZABLE", lock_manager=DibsLockManager(lock_url, ttl=5))
    two = TASK_SOURCE.configure(isolation_level="SERIALIZABLE", lock_manager=DibsLockManager(lock_url, ttl=5))
    combined = one + two
    assert combined.lock_manager == DibsLockManager(lock_url, ttl=5)


def test_from_a_block(tmp_path: Path) -> None:
    block = DibsStore(url=f"sqlite:///{tmp_path / 'b.db'}", ttl=7, namespace="team.x")
    manager = block.lock_manager()
    assert manager.client.ttl == 7 and manager.client.namespace == "prefect.locks"
    assert manager.acquire_lock("k", holder="h")
    manager.release_lock("k", holder="h")
    assert pickle.loads(pickle.dumps(manager)) == manager

"""Fan-in on an event loop (dibs._batches): waking and reading in bounded batches, behaviour not speed."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from typing import Any

import pytest

from dibs._batches import WAKE_BATCH, ReadBatcher, resolve_in_batches, take_turn
from dibs.errors import InvalidKey
from dibs.keys import Key
from dibs.records import KeyState
from dibs.runtime import runtime
from dibs.stores import AcquireRequest
from dibs.stores.memory import MemoryStore


class CountingStore(MemoryStore):
    """Counts reads; ``read_many`` reads each key once, as a real store's one query would."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []
        self.batches: list[list[str]] = []
        self.broken: set[str] = set()

    def read(self, key: Key) -> KeyState:
        self.reads.append(key.name)
        if key.name in self.broken:
            raise InvalidKey(f"{key} is broken", key=str(key))
        return super().read(key)

    def read_many(self, keys: Sequence[Key]) -> list[KeyState]:
        self.batches.append([key.name for key in keys])
        return [MemoryStore.read(self, key) for key in keys if key.name not in self.broken]


def test_resolving_many_futures_gives_the_loop_back_between_batches() -> None:
    async def scenario() -> list[int]:
        loop = asyncio.get_running_loop()
        count = WAKE_BATCH * 3 + 5
        futures = [loop.create_future() for _ in range(count)]
        resolve_in_batches(loop, [(future, index, None) for index, future in enumerate(futures)])
        done_per_iteration = [sum(future.done() for future in futures)]
        while done_per_iteration[-1] < count:
            await asyncio.sleep(0)  # one iteration of the loop
            done_per_iteration.append(sum(future.done() for future in futures))
        assert [future.result() for future in futures] == list(range(count))
        return done_per_iteration

    done = asyncio.run(scenario())
    assert done[0] == WAKE_BATCH  # the first batch at once, the rest one batch per iteration
    assert all(later - earlier <= WAKE_BATCH for earlier, later in itertools.pairwise(done))
    assert len(done) >= 4


def test_a_cancelled_waiter_is_skipped_and_errors_are_delivered() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        cancelled, failed, fine = loop.create_future(), loop.create_future(), loop.create_future()
        cancelled.cancel()
        resolve_in_batches(loop, [(cancelled, 1, None), (failed, None, ValueError("no")), (fine, 3, None)])
        with pytest.raises(ValueError, match="no"):
            await failed
        assert await fine == 3

    asyncio.run(scenario())


def test_turns_let_every_coroutine_through_a_batch_per_iteration() -> None:
    async def scenario() -> list[int]:
        passed: list[int] = []

        async def starter(index: int) -> None:
            await take_turn()
            passed.append(index)

        count = WAKE_BATCH * 2 + 1
        tasks = [asyncio.get_running_loop().create_task(starter(i)) for i in range(count)]
        seen = []
        while len(passed) < count:
            await asyncio.sleep(0)
            seen.append(len(passed))
        await asyncio.gather(*tasks)
        assert sorted(passed) == list(range(count))
        return seen

    seen = asyncio.run(scenario())
    assert all(later - earlier <= WAKE_BATCH for earlier, later in itertools.pairwise([0, *seen]))


class HeldJobs:
    """An executor that holds the batcher's jobs until :meth:`run`, so reads queue up meanwhile."""

    def __init__(self) -> None:
        self.jobs: list[Any] = []

    def submit(self, job: Any) -> None:
        self.jobs.append(job)

    async def run(self, readers: list[Any]) -> list[Any]:
        tasks = [asyncio.ensure_future(reader) for reader in readers]
        await asyncio.sleep(0)  # every reader queued its read
        jobs, self.jobs = self.jobs, []
        for job in jobs:
            await asyncio.to_thread(job)  # a thread, as the I/O executor's
        return await asyncio.gather(*tasks, return_exceptions=True)


def test_reads_waiting_together_are_one_batch_and_each_key_is_read_once() -> None:
    store = CountingStore()
    keys = [Key("unit", "a"), Key("unit", "b")]
    store.acquire(keys[0], AcquireRequest("holder", 30))
    jobs = HeldJobs()
    batcher = ReadBatcher(store, jobs.submit)
    states = asyncio.run(jobs.run([batcher.read(keys[i % 2]) for i in range(100)]))
    assert len(store.batches) == 1
    assert [state.key for state in states] == [keys[i % 2] for i in range(100)]
    assert states[0].lease is not None and states[0].lease.owner == "holder"
    assert states[1].lease is None  # never written: the empty state a read gives
    assert sorted(store.batches[0]) == ["a", "b"]  # each key once, for 100 readers
    assert store.reads == []


def test_a_key_the_batch_cannot_read_gives_its_readers_the_error_of_their_own_read() -> None:
    store = CountingStore()
    good, bad = Key("unit", "good"), Key("unit", "bad")
    store.acquire(good, AcquireRequest("holder", 30))
    store.broken.add("bad")
    jobs = HeldJobs()
    batcher = ReadBatcher(store, jobs.submit)
    state, error = asyncio.run(jobs.run([batcher.read(good), batcher.read(bad)]))
    assert isinstance(state, KeyState) and state.key == good
    assert isinstance(error, InvalidKey) and "broken" in str(error)


def test_async_waiters_of_the_runtime_read_through_the_batcher() -> None:
    store = CountingStore()
    key = Key("unit", "shared")
    store.acquire(key, AcquireRequest("holder", 30))

    async def scenario() -> list[KeyState]:
        return await asyncio.gather(*(runtime().read(store, key) for _ in range(50)))

    states = asyncio.run(scenario())
    assert all(state.lease is not None for state in states)
    assert len(store.reads) + sum(len(batch) for batch in store.batches) < 50


def test_the_wake_budget_is_the_loops_for_every_caller_together() -> None:
    """Triggers starting together are woken by several sources at once (their turns, a shared lookup,
    their first reads): each resolving its own batch per iteration made iterations of several batches.
    The loop's budget is shared: however many callers, at most one batch per iteration after the first."""

    async def scenario() -> list[int]:
        loop = asyncio.get_running_loop()
        sources = [[loop.create_future() for _ in range(WAKE_BATCH * 2)] for _ in range(4)]
        everything = [future for futures in sources for future in futures]
        for futures in sources:  # four callers in one iteration
            resolve_in_batches(loop, [(future, None, None) for future in futures])
        done = [sum(future.done() for future in everything)]
        while done[-1] < len(everything):
            await asyncio.sleep(0)
            done.append(sum(future.done() for future in everything))
        return done

    done = asyncio.run(scenario())
    assert done[0] == WAKE_BATCH  # the first caller's first batch at once; the others queue behind it
    assert all(later - earlier <= WAKE_BATCH for earlier, later in itertools.pairwise(done))

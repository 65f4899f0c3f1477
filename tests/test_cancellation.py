"""A cancelled async acquire leaves nothing held, on every store (issue 16, item 4).

The store call of an async ``acquire`` runs in the runtime's I/O executor; cancelling the awaiting
coroutine cannot stop it, so the store may grant a lease that no caller receives. These tests cancel
at the two moments that matter, deterministically (while the store call is still running after the
grant, and after it returned but before the caller resumed), then at random small delays in a loop.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable
from typing import Any

import pytest

import dibs
from dibs.records import StoreOutcome
from dibs.runtime import runtime
from dibs.stores import Store

#: Bounds every wait on another thread, so that a bug fails the test instead of hanging it.
SAFETY = 60.0


def _drain_io_executor() -> None:
    """Return once every task submitted to the I/O executor before this call has finished.

    The executor runs its queue in order; a barrier that all its threads must reach is only reached
    once each thread has finished what it took before (including the done-callbacks that release a
    grant nobody received).
    """
    rt = runtime()
    barrier = threading.Barrier(rt.IO_THREADS + 1)
    for _ in range(rt.IO_THREADS):
        rt.executor().submit(barrier.wait, SAFETY)
    barrier.wait(SAFETY)


def _blocking_acquire(store: Store, granted: threading.Event, proceed: threading.Event) -> Callable[..., Any]:
    real = store.acquire

    def acquire(*args: Any, **kwargs: Any) -> StoreOutcome:
        outcome = real(*args, **kwargs)
        granted.set()
        assert proceed.wait(SAFETY)
        return outcome

    return acquire


def _cancel_once_granted(ask: Callable[[], Any], granted: threading.Event, proceed: threading.Event) -> None:
    """Start ``ask()`` on an event loop, cancel it once the (blocked) store call has granted, then let
    that store call return: the moment where the store holds a lease that no caller will receive."""

    async def scenario() -> None:
        task = asyncio.ensure_future(ask())
        await asyncio.to_thread(granted.wait, SAFETY)  # the store has granted; its call has not returned
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        proceed.set()

    asyncio.run(scenario())
    _drain_io_executor()


@pytest.mark.parametrize("call", ["acquire", "compute"])
def test_an_acquire_cancelled_while_the_granting_store_call_runs_leaves_nothing_held(
    store: Store, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    """``compute`` asks through the compute-once flow's async steps (:mod:`dibs.flow`), which must
    keep this guarantee too; its work never runs."""
    granted, proceed = threading.Event(), threading.Event()
    monkeypatch.setattr(store, "acquire", _blocking_acquire(store, granted, proceed))
    client = dibs.Reservations(store, ttl=60)
    ran: list[str] = []

    async def work() -> str:
        ran.append("work")
        return "value"

    def asking() -> Any:
        if call == "acquire":
            return client.aio().acquire("k", "alice")
        return client.aio().compute("k", work, owner="alice")

    _cancel_once_granted(asking, granted, proceed)
    state = client.status("k")
    assert state.lease is None, f"a lease nobody received is still held: {state.lease}"
    assert state.failure is None  # not a failure: the caller was stopped before it began
    assert ran == []


@pytest.mark.parametrize("capped", [False, True], ids=["later", "at-once-under-a-lease-age-cap"])
def test_a_cancelled_re_entry_leaves_its_owners_lease_held(
    store: Store, monkeypatch: pytest.MonkeyPatch, capped: bool
) -> None:
    # Asking again as the same owner re-enters the lease that owner already holds (Prefect's lock
    # manager does it from another run context): cancelling that ask must not free the first one's key.
    # Prefect's lock manager also asks with max_lease_age equal to the ttl: asked at once, a re-entry
    # then has the very times of a new lease, so only the store can tell them apart.
    client = dibs.Reservations(store, ttl=60, max_lease_age=60 if capped else None)
    first = client.get_or_reserve("k", "alice")
    assert isinstance(first, dibs.Acquired)
    if not capped:  # the store's clock moves on before the re-entry
        started = first.lease.record.acquired_at
        while client.status("k").now < started + 0.01:
            pass
    granted, proceed = threading.Event(), threading.Event()
    monkeypatch.setattr(store, "acquire", _blocking_acquire(store, granted, proceed))

    _cancel_once_granted(lambda: client.aio().acquire("k", "alice"), granted, proceed)
    state = client.status("k")
    assert state.lease is not None and state.lease.token == first.lease.record.token


def test_an_acquire_cancelled_after_the_store_answered_leaves_nothing_held(store: Store) -> None:
    client = dibs.Reservations(store, ttl=60)

    async def scenario() -> None:
        task = asyncio.ensure_future(client.aio().acquire("k", "alice"))
        await asyncio.sleep(0)  # the task submits its store call
        # Block the loop until the store call has finished: its answer is on its way to the loop, but
        # the task has not resumed with it, and is cancelled first.
        _drain_io_executor()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    _drain_io_executor()
    state = client.status("k")
    assert state.lease is None, f"a lease nobody received is still held: {state.lease}"


def test_acquires_cancelled_at_random_small_delays_leave_no_key_held(store: Store) -> None:
    client = dibs.Reservations(store, ttl=60)
    rng = random.Random(16)
    names = [f"k{i}" for i in range(40)]

    async def scenario() -> None:
        for name in names:
            task = asyncio.ensure_future(client.aio().acquire(name, "alice"))
            await asyncio.sleep(rng.uniform(0, 0.002))
            task.cancel()
            try:
                got = await task
            except asyncio.CancelledError:
                continue
            assert isinstance(got, dibs.Acquired)
            got.lease.release()  # received before the cancel: ours to release

    asyncio.run(scenario())
    _drain_io_executor()
    held = [name for name in names if client.status(name).lease is not None]
    assert held == []

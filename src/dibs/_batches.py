"""Fan-in for event loops: many coroutines woken, or reading, without stalling their loop.

A triggerer may start a thousand deferred waits at once and hand one key's artifact to all of them.
Two things would stall its loop if done per waiter in one go:

* **waking**: resolving a thousand futures in one callback makes the loop run a thousand coroutine
  steps in its next iteration, before any timer or socket of anybody else. :func:`resolve_in_batches`
  resolves at most :data:`WAKE_BATCH` per iteration, so the loop serves everything else in between.
  The budget is the loop's, not the caller's: the triggers that start together are woken by several
  sources at once (their turns, their shared connection lookup, their first reads, the hub), and
  each waking its own batch per iteration made iterations of 200 to 300 steps (20-30 ms) again;
* **reading**: a thousand reads of one key, each a job in the I/O executor and a wake-up of its own.
  :class:`ReadBatcher` gathers the reads that are waiting for a thread and makes them one
  ``read_many`` (one query where the store can), each key read once; a read joins a batch only
  before that batch is sent, so it never gets a state older than its own request.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from dibs.keys import Key
from dibs.records import KeyState

if TYPE_CHECKING:
    from dibs.stores.base import Store

__all__ = ["WAKE_BATCH", "ReadBatcher", "resolve_in_batches", "take_turn", "wake_soon"]

#: The most futures resolved in one iteration of an event loop: the loop then runs at most this many
#: woken coroutine steps before it looks at its timers and sockets again (~60 µs each: a few ms).
WAKE_BATCH = 64


def _settle(future: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if future.done():  # cancelled meanwhile: nobody waits for it
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


def resolve_in_batches(
    loop: asyncio.AbstractEventLoop,
    settled: Sequence[tuple[asyncio.Future[Any], Any, BaseException | None]],
    size: int = WAKE_BATCH,
) -> None:
    """On ``loop``'s thread: settle ``(future, result, exception)`` triples, ``size`` per iteration of
    ``loop`` for all its callers together. The first batch is settled at once when the loop has none
    queued; the rest, or all of it behind what other callers queued first, in the next iterations."""
    queue = _queued.get(loop)
    if queue is None:
        for future, value, error in settled[:size]:
            _settle(future, value, error)
        if len(settled) <= size:
            return
        queue = _queued[loop] = collections.deque(settled[size:])
        loop.call_soon(_settle_queued, loop, size)
    else:
        queue.extend(settled)


#: Each loop's triples waiting for a later iteration (see :func:`resolve_in_batches`).
_queued: dict[
    asyncio.AbstractEventLoop, collections.deque[tuple[asyncio.Future[Any], Any, BaseException | None]]
] = {}


def _settle_queued(loop: asyncio.AbstractEventLoop, size: int) -> None:
    queue = _queued[loop]
    for _ in range(min(size, len(queue))):
        _settle(*queue.popleft())
    if queue:
        # After the wake-ups just scheduled: the next batch waits for the loop's next iteration.
        loop.call_soon(_settle_queued, loop, size)
    else:
        del _queued[loop]


def wake_soon(
    loop: asyncio.AbstractEventLoop, settled: Sequence[tuple[asyncio.Future[Any], Any, BaseException | None]]
) -> None:
    """From any thread: :func:`resolve_in_batches` on ``loop`` (nothing if the loop is closed)."""
    if settled:
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody awaits these any more
            loop.call_soon_threadsafe(resolve_in_batches, loop, list(settled))


_turns: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any, BaseException | None]]] = {}


async def take_turn() -> None:
    """Wait for this coroutine's turn to start its work: at most :data:`WAKE_BATCH` coroutines of one
    loop go on per iteration. A triggerer starts every new trigger's coroutine in one iteration; those
    that take a turn first each cost it a future, and their first steps are spread over iterations."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[None] = loop.create_future()
    queue = _turns.get(loop)
    if queue is None:
        queue = _turns[loop] = []
        loop.call_soon(_give_turns, loop)
    queue.append((future, None, None))
    await future


def _give_turns(loop: asyncio.AbstractEventLoop) -> None:
    resolve_in_batches(loop, _turns.pop(loop, []))


class ReadBatcher:
    """The async callers' reads of one store, gathered into ``read_many`` batches in the I/O executor.

    :meth:`read` queues the key and, unless a batch job is already queued, submits one; that job takes
    everything queued when it starts, reads each distinct key once and wakes the callers of each loop
    in bounded batches. A key ``read_many`` leaves out (no record, or unreadable) is read alone, so
    each caller gets exactly what ``store.read`` would give it, errors included.
    """

    def __init__(self, store: Store, submit: Callable[[Callable[[], None]], object]) -> None:
        self._store = store
        self._submit = submit
        self._lock = threading.Lock()
        self._queued: list[tuple[Key, asyncio.AbstractEventLoop, asyncio.Future[KeyState]]] = []
        self._scheduled = False

    async def read(self, key: Key) -> KeyState:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[KeyState] = loop.create_future()
        with self._lock:
            self._queued.append((key, loop, future))
            submit, self._scheduled = not self._scheduled, True
        if submit:
            try:
                self._submit(self._run)
            except BaseException:
                with self._lock:
                    self._scheduled = False
                raise
        return await future

    def _run(self) -> None:
        with self._lock:
            batch, self._queued, self._scheduled = self._queued, [], False
        if not batch:
            return
        keys = {key.digest: key for key, _, _ in batch}
        answers: dict[str, tuple[KeyState | None, BaseException | None]] = {}
        if len(keys) > 1 or len(batch) > 1:
            try:
                for state in self._store.read_many(list(keys.values())):
                    answers[state.key.digest] = (state, None)
            except Exception:  # each key is then read alone below, and its caller gets the error
                answers.clear()
        for digest, key in keys.items():
            if digest not in answers:
                try:
                    answers[digest] = (self._store.read(key), None)
                except BaseException as exc:
                    answers[digest] = (None, exc)
        by_loop: dict[
            asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any, BaseException | None]]
        ] = {}
        for key, loop, future in batch:
            found, error = answers[key.digest]
            by_loop.setdefault(loop, []).append((future, found, error))
        for loop, settled in by_loop.items():
            wake_soon(loop, settled)

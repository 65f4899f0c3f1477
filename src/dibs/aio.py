"""The async face of a client: :class:`AsyncReservations`, for event loops.

It makes the same decisions as :class:`dibs.Reservations` (:mod:`dibs.calls`, :mod:`dibs.holding`,
the waiting loops of :mod:`dibs._waiting`), and differs only in its I/O: waiting awaits the watch hub,
and every store call runs in the runtime's I/O executor (:class:`AsyncStoreIO`). It reads the sync
client it belongs to only through :class:`SyncClient` (described here rather than imported, so that
this module stays below the client that builds it: ``Reservations.aio()``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar, Unpack, overload

from dibs import calls, events, flow, holding
from dibs._waiting import AskAcquire, acquire_until, adrive
from dibs.artifacts import DECODE_ON_LOOP_BYTES
from dibs.backoff import Deadline
from dibs.calls import AcquireOptions, AcquireOrBusy, AcquireRaising, AskOptions, CallOptions, WaitOptions
from dibs.events import Emitter
from dibs.keys import Key
from dibs.lease import Lease
from dibs.outcomes import Acquired, Busy, Hit, Outcome, RunReport
from dibs.payloads import PayloadUnavailable
from dibs.records import Granted, Held, KeyState, Present, StoreOutcome
from dibs.runtime import runtime
from dibs.stores import Store

if TYPE_CHECKING:
    from concurrent.futures import Future

__all__ = ["AsyncReservations", "AsyncStoreIO", "SyncClient"]

log = logging.getLogger("dibs")

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


class SyncClient(calls.Source, Protocol):
    """What :class:`AsyncReservations` uses of the :class:`dibs.Reservations` it is the face of."""

    def key(self, key: str | Key) -> Key: ...

    def status(self, key: str | Key) -> KeyState: ...

    def call(self, key: str | Key, **options: Unpack[CallOptions]) -> flow.Call: ...

    def close(self) -> None: ...


class AsyncReservations:
    """The same calls for event loops (Airflow's triggerer, async Prefect tasks, services).

    Waiting awaits the watch hub (a future on the caller's loop, no thread per waiter), and every store
    operation runs in the runtime's small I/O executor (:mod:`dibs.runtime`), never on the loop and
    never in the loop's default executor. The decisions are the sync client's: the same waiting loops
    and the same hold decisions, only awaited.
    """

    def __init__(self, client: SyncClient) -> None:
        self.client = client
        self._io = AsyncStoreIO(client)  # one per client, not one per wait
        self._unread_io: AsyncStoreIO | None = None  # the same for record-only waits (see _io_for)

    def _io_for(self, store: Store) -> AsyncStoreIO:
        """The I/O helper of a wait through ``store``: the client's store, or the unread twin that
        record-only waits read (one per process, so one helper serves every trigger of a client)."""
        if store is self.client.store:
            return self._io
        found = self._unread_io
        if found is None or found._store is not store:
            found = self._unread_io = AsyncStoreIO(self.client, store)
        return found

    @property
    def store(self) -> Store:
        """The sync client's store (what :mod:`dibs.flow` checks a key is not held in)."""
        return self.client.store

    async def _outcome(self, key: Key, outcome: StoreOutcome) -> Outcome:
        """The store's answer as the caller's outcome, built off the loop when that costs I/O (a
        refused lease is released) or a large decode."""
        c = self.client
        large = isinstance(outcome, Present) and outcome.artifact.size > DECODE_ON_LOOP_BYTES
        if large or calls.refused(c.settings, outcome) is not None:
            return await runtime().io(calls.to_outcome, c, key, outcome)
        return calls.to_outcome(c, key, outcome)

    async def get_or_reserve(
        self, key: str | Key, owner: str | None = None, **options: Unpack[AskOptions]
    ) -> Outcome:
        """:meth:`Reservations.get_or_reserve`, awaited."""
        calls.checked("get_or_reserve", options, AskOptions)
        ask = calls.ask_of(self.client.settings, self.client.key(key), owner, options)
        return await self._outcome(ask.key, await self._ask_store(ask))

    @overload
    async def acquire(
        self, key: str | Key, owner: str | None = None, **options: Unpack[AcquireRaising]
    ) -> Hit | Acquired: ...

    @overload
    async def acquire(
        self, key: str | Key, owner: str | None = None, **options: Unpack[AcquireOrBusy]
    ) -> Hit | Acquired | Busy: ...

    async def acquire(
        self, key: str | Key, owner: str | None = None, **options: Unpack[AcquireOptions]
    ) -> Hit | Acquired | Busy:
        """:meth:`Reservations.acquire`, awaited."""
        calls.checked("acquire", options, AcquireOptions)
        settings = self.client.settings
        ask = calls.ask_of(settings, self.client.key(key), owner, options)
        holding.not_held_here(self.store, ask.key)
        deadline = Deadline(options.get("timeout"))
        outcome = await self._ask_store(ask)
        if isinstance(outcome, Held) and not deadline.expired:
            again = calls.ask_again(settings, ask, outcome, options.get("max_age"))
            outcome = await self._wait_store(again, deadline)
        return calls.acquired(await self._outcome(ask.key, outcome), deadline, options)

    async def _ask_store(self, ask: AskAcquire) -> StoreOutcome:
        """One ask in the I/O executor; a cancelled caller leaves nothing held (:class:`AsyncStoreIO`)."""
        return await self._io.acquire(ask)

    async def _wait_store(
        self, ask: AskAcquire, deadline: Deadline, held: Callable[[Held], None] | None = None
    ) -> StoreOutcome:
        """Ask until the key is not busy or ``deadline`` passes, awaited on the watch hub (no thread
        per waiter); ``held`` hears who holds it meanwhile."""
        c = self.client
        with runtime().subscribe(c.store, ask.key) as subscription:
            loop = acquire_until(ask, deadline, c.settings.backoff, subscription.is_following, held)
            return await adrive(loop, self._io, subscription)

    async def wait(
        self,
        key: str | Key,
        *,
        seen: Callable[[KeyState], None] | None = None,
        **options: Unpack[WaitOptions],
    ) -> Hit | None:
        """:meth:`Reservations.wait`, awaited.

        ``seen`` is shown every state of the key this wait reads or is notified of, the first one
        included, so a watcher can say who holds the key and when that changes without reading it
        again (Airflow's trigger logs it); it must not raise. ``decode=False`` waits for the record
        only, as there: a payload is never loaded into this process (Airflow's trigger waits so).
        """
        calls.checked("wait", options, WaitOptions)
        c = self.client
        waiting = calls.WaitFor.of(c.settings, c.key(key), options)
        while True:
            try:
                return await self._wait_once(waiting, seen)
            except PayloadUnavailable:
                continue  # it went bad as it was decoded: a miss (logged); wait on for another

    async def _wait_once(self, waiting: calls.WaitFor, seen: Callable[[KeyState], None] | None) -> Hit | None:
        c = self.client
        store = waiting.through(c.store)
        holding.not_held_here(store, waiting.key)
        io = self._io_for(store)
        state = await io.read(waiting.key)
        if seen is not None:
            seen(state)
        if not waiting.settles(state) and not waiting.deadline.expired:
            # try/finally rather than ``with``: a thousand waiting coroutines would each keep the
            # bound ``__exit__`` alive (issue 20: every object a waiter keeps is the GC's to traverse).
            subscription = runtime().subscribe(store, waiting.key)
            try:
                state = await adrive(waiting.loop(c.settings, subscription), io, subscription, seen)
            finally:
                subscription.close()
        large = state.artifact is not None and state.artifact.size > DECODE_ON_LOOP_BYTES
        if large and waiting.decode:
            return await runtime().io(waiting.ended, c.artifacts, state)
        return waiting.ended(c.artifacts, state)

    async def status(self, key: str | Key) -> KeyState:
        return await runtime().io(self.client.status, key)

    async def hold(
        self,
        got: Acquired | Lease | holding.HeldLease,
        work: Callable[[], Awaitable[T]],
        *,
        failure_of: holding.FailureOf | None = None,
        logger: holding.Logger | None = None,
        emit: Emitter | None = None,
    ) -> RunReport:
        """:meth:`Reservations.hold` for a coroutine: the same decisions, with the store's part in the
        I/O executor. Heartbeats run in their own thread, so they go on even while the work hogs the loop.
        A cancelled work releases its lease (recorded as stopped) even if it is cancelled again meanwhile.
        """
        rt = runtime()
        held = calls.held_for(got, failure_of, logger, emit)
        started = time.monotonic()
        with holding.holding(self.client.store, held.lease.key):
            try:
                value = await work()
            except BaseException as exc:
                # Shielded: a second cancellation must not stop the release that frees the key.
                await asyncio.shield(rt.io(held.fail, exc))
                raise
        policy = self.client.settings.on_store_unavailable
        seconds = time.monotonic() - started
        return await rt.io(functools.partial(held.store, value, policy=policy, compute_seconds=seconds))

    async def compute(
        self,
        key: str | Key,
        fn: Callable[..., Awaitable[Any]],
        *,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        **options: Unpack[CallOptions],
    ) -> RunReport:
        """:meth:`Reservations.compute` for a coroutine function."""
        calls.checked("compute", options, CallOptions)
        call = self.client.call(key, **options)
        steps = flow.AsyncSteps(self, lambda: fn(*args, **(kwargs or {})), emit=call.emitter)
        return await call.adrive(steps)

    async def run(
        self, key: str | Key, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs
    ) -> R:
        """``await fn(*args, **kwargs)``, computed once across every process racing on ``key``."""
        value: R = (await self.compute(key, fn, args=args, kwargs=kwargs)).value
        return value


class AsyncStoreIO:
    """A client's store reads and asks for :func:`dibs._waiting.adrive`, each run in the runtime's I/O
    executor; reads go through ``store`` when given (a view of the client's records, such as the
    unread twin a record-only wait reads: see :meth:`dibs.calls.WaitFor.through`)."""

    def __init__(self, client: calls.Source, store: Store | None = None) -> None:
        self._client = client
        self._store = store

    async def acquire(self, ask: AskAcquire) -> StoreOutcome:
        """One ask in the I/O executor. A cancelled caller leaves nothing held.

        Cancelling the await does not stop a store call already running in the executor thread: the
        store may still grant the lease after the caller has gone, and then nobody would hold it but
        the store, for a whole ttl (issue 16, item 4). So the call is a ``concurrent.futures`` future
        of our own: when the awaiting coroutine is cancelled, a callback on that future releases any
        lease it grants. The callback runs when the store call ends, in the executor, whatever the
        event loop does meanwhile (a second cancel, the loop closing): the release is shielded.
        """
        store = self._store or self._client.store
        ask_store = events.for_this_call(functools.partial(calls.ask_store, store, ask))  # its front end
        future = runtime().executor().submit(ask_store)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.add_done_callback(functools.partial(_release_unreceived, store, ask))
            raise

    async def read(self, key: Key) -> KeyState:
        return await runtime().read(self._store or self._client.store, key)


def _release_unreceived(store: Store, ask: AskAcquire, future: Future[StoreOutcome]) -> None:
    """``future`` (a store ask whose caller was cancelled) ended: release the lease it granted, if any.

    Not a failure (the caller was stopped before it could start), so nothing is recorded. Never raises:
    this runs in an executor's callback, where an exception would only be logged by the executor.
    """
    if future.cancelled() or future.exception() is not None:
        return  # never ran, or the store refused: nothing was granted
    outcome = future.result()
    if not isinstance(outcome, Granted) or not _granted_by_this_ask(outcome):
        return
    if not threading.current_thread().name.startswith(runtime().IO_THREAD_PREFIX):
        # The store answered before the cancellation landed, so this runs where the callback was
        # added (an event loop's thread): do the store call in the executor instead of blocking it.
        try:
            runtime().executor().submit(_release_quietly, store, ask.key, outcome)
            return
        except RuntimeError:  # the executor is shut down (interpreter exit): release here
            pass
    _release_quietly(store, ask.key, outcome)


def _granted_by_this_ask(outcome: Granted) -> bool:
    """Whether the ask made this lease (new, or taken over) rather than re-entering one its owner
    already held: that one belongs to whoever took it first, and a cancelled re-entry must not free it.
    The store says which (:attr:`~dibs.records.Granted.reentered`)."""
    return not outcome.reentered


def _release_quietly(store: Store, key: Key, outcome: Granted) -> None:
    try:
        store.release(key, outcome.lease.token, None)
    except Exception as exc:  # lost meanwhile, or the store is unreachable: the lease expires after its ttl
        log.warning(
            "%s: the lease granted to a cancelled acquire could not be released (%s); "
            "it expires after its ttl",
            key,
            exc,
        )
    else:
        log.info("%s: released the lease granted to a cancelled acquire (token %s)", key, outcome.lease.token)

"""The one I/O seam: the flow's steps (:mod:`dibs.steps`) carried out, in a thread or on an event loop.

:mod:`dibs.flow` decides and never does I/O; :class:`StoreIO` and :class:`AsyncStoreIO` do each step
it yields and send the answer back (or throw the step's error back in): the store's one-attempt
operations, the process's watch hub, decoding an artifact, running the work under the lease. They are
the only sync/async pair of dibs that carries logic, and what they carry is I/O only: each ``drive``
is the same short loop, one calling the step handlers, the other awaiting them.

A front end does a step its own way by overriding its handler in a subclass: Airflow's operator
defers at :meth:`~StoreIO.wait` and hands a payload's hit on unread (:meth:`~StoreIO.found`), ``dibs
run`` streams hits and forwards stops to its command for the whole hold (:meth:`~StoreIO.hold_scope`),
``DibsLockManager`` keeps a lock's lease past the call (:meth:`~StoreIO.keep`). What the front end
says to its users comes from the flow's events, never from here.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from dibs import events, holding, steps
from dibs.artifacts import DECODE_ON_LOOP_BYTES, ArtifactReader
from dibs.events import Event
from dibs.keys import Key
from dibs.lease import Lease, LeaseSource
from dibs.outcomes import Acquired, Hit, RunReport
from dibs.payloads import PayloadUnavailable
from dibs.records import Granted, Held, KeyState, Present, StoreOutcome
from dibs.runtime import runtime

if TYPE_CHECKING:
    from collections.abc import Generator

    from dibs.hub import Subscription
    from dibs.stores.base import Store

__all__ = ["AsyncStoreIO", "Source", "StoreIO", "holding_what"]

log = logging.getLogger("dibs")

T = TypeVar("T")

#: Which handler carries out each kind of step (a subclass overrides the handler, never this table).
_HANDLERS: dict[type, str] = {
    steps.Ask: "ask",
    steps.Read: "read",
    steps.Watch: "watch",
    steps.Unwatch: "unwatch",
    steps.Pause: "pause",
    steps.Found: "found",
    steps.Wait: "wait",
    steps.Release: "release",
    steps.Hold: "hold",
    steps.Work: "work",
    steps.Fail: "fail",
    steps.Complete: "complete",
    steps.Keep: "keep",
    steps.RunUnreserved: "run_unreserved",
}


#: Where a flow's events go (``None``: nobody hears them).
Teller = events.Emitter | events.LazyEmitter | None


#: What :meth:`_Driving.next` gives once the flow has returned.
_DONE = object()


class _Driving:
    """One flow being carried out: what both drivers share. :meth:`next` sends the last answer (or
    throws the last error) in, hands the events the flow yields to the observers, and gives the next
    step for a handler, until the flow returns (:attr:`result`). A handler's exception is thrown back
    in (the flow decides), but :class:`~dibs.steps.Suspend`, which closes the flow without deciding
    anything and goes up to the caller. Leaving the ``with`` block ends what the steps began (``end``)."""

    __slots__ = ("_acting", "_answer", "_emitter", "_end", "_error", "_flow", "result")

    def __init__(self, flow: Generator[Any, Any, Any], emitter: Teller, end: Callable[[], None]) -> None:
        self._flow, self._emitter, self._end = flow, emitter, end
        self._answer: Any = None
        self._error: BaseException | None = None
        self._acting: contextvars.Token[str] | None = None
        self.result: Any = None

    def __enter__(self) -> _Driving:
        if isinstance(self._emitter, events.Emitter):  # the store operations name the call's front end
            self._acting = events.FRONTEND.set(self._emitter.frontend)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._end()
        if self._acting is not None:
            # A coroutine abandoned by its task is closed later, maybe in another context (the garbage
            # collector at the loop's teardown), where the token cannot be reset: it never had it.
            with contextlib.suppress(ValueError):
                events.FRONTEND.reset(self._acting)

    def next(self) -> Any:
        """The flow's next step for a handler (its events delivered on the way), or :data:`_DONE`."""
        flow, emitter = self._flow, self._emitter
        try:
            step = flow.send(self._answer) if self._error is None else flow.throw(self._error)
            while isinstance(step, Event):
                if emitter is not None:
                    emitter.send(step)
                step = flow.send(None)
        except StopIteration as stop:
            self.result = stop.value
            return _DONE
        return step

    def call(self, handler: Callable[[Any], Any], step: Any) -> None:
        try:
            self._answer, self._error = handler(step), None
        except BaseException as exc:  # the flow decides: a policy, or it lets it through
            self._threw(exc)

    async def acall(self, handler: Callable[[Any], Awaitable[Any]], step: Any) -> None:
        try:
            self._answer, self._error = await handler(step), None
        except BaseException as exc:
            self._threw(exc)

    def _threw(self, error: BaseException) -> None:
        if isinstance(error, steps.Suspend):
            self._flow.close()
            _deferred(self._emitter, error.waiting)
            raise error
        self._answer, self._error = None, error


class Source(LeaseSource, Protocol):
    """What the seam uses of a client: its store, serializer and settings (what its leases need) and
    the reader of its artifacts."""

    @property
    def artifacts(self) -> ArtifactReader: ...


class _Seam:
    """What both drivers keep: the client, the store they go through, the work, how a hold reports."""

    #: The work of a call that has none (a ``get_or_reserve``, a ``wait``): never run.
    @staticmethod
    def _no_work() -> Any:
        raise RuntimeError("this call runs no work")

    def __init__(
        self,
        client: Source,
        work: Callable[[], Any] | None = None,
        *,
        emit: events.Emitter | None = None,
        failure_of: holding.FailureOf | None = None,
        logger: holding.Logger | None = None,
        store: Store | None = None,
        seen: Callable[[KeyState], None] | None = None,
        keeping: holding.HeldLease | None = None,
    ) -> None:
        self.client = client
        #: The lease a hold keeps when it is already held (``Reservations.hold`` given a HeldLease).
        self.keeping = keeping
        self.work_fn = work if work is not None else self._no_work
        self.emit, self.failure_of, self.logger = emit, failure_of, logger
        #: The store this seam goes through: the client's, or a view of its records (the unread twin
        #: a record-only wait reads).
        self.store: Store = store if store is not None else client.store
        #: Shown every state of the key a wait reads or is notified of (a trigger's log of holders).
        self.seen = seen
        self._subscription: Subscription | None = None
        self._scope: contextlib.AbstractContextManager[object] | None = None

    # -- what does not depend on the thread ------------------------------------------------------
    def taken(self, granted: Granted) -> Acquired:
        """A granted lease as the caller's handle on it."""
        return Acquired(Lease(self.client, granted.lease), granted.took_over_from, granted.failure)

    def held(self, acquired: Acquired) -> holding.HeldLease:
        """The lease of a :class:`~dibs.steps.Hold` step, heartbeating from now on (a front end that must
        reach it from elsewhere, Airflow's ``on_kill``, keeps it in :meth:`hold_scope`)."""
        if self.keeping is not None:
            return self.keeping
        return holding.HeldLease(
            acquired.lease,
            took_over_from=acquired.took_over_from,
            failure_of=self.failure_of,
            logger=self.logger or log,
            emit=self.emit,
        )

    def hold_scope(self, held: holding.HeldLease) -> contextlib.AbstractContextManager[object]:
        """What lasts from the hold's start until its ending is decided (its release or its complete):
        the key marked as computed by this call stack, so the work cannot wait for itself. A front end
        adds its own (``dibs run`` forwards stops to its command meanwhile)."""
        return holding.holding(self.store, held.lease.key)

    def _enter_scope(self, held: holding.HeldLease) -> None:
        scope = self.hold_scope(held)
        scope.__enter__()
        self._scope = scope

    def _leave_scope(self) -> None:
        scope, self._scope = self._scope, None
        if scope is not None:
            scope.__exit__(None, None, None)

    def _watching(self, key: Key) -> Callable[[], bool]:
        # A wait begins: refused for a key whose work runs in this very call stack (it would wait for
        # itself forever). An ask alone never waits, so only here.
        holding.not_held_here(self.store, key)
        self._unwatching()
        subscription = self._subscription = runtime().subscribe(self.store, key)
        return subscription.is_following

    def _unwatching(self) -> None:
        subscription, self._subscription = self._subscription, None
        if subscription is not None:
            subscription.close()

    def _see(self, answer: Any) -> Any:
        if self.seen is not None and isinstance(answer, KeyState):
            self.seen(answer)
        return answer

    def _end(self) -> None:
        """The flow is over (or left): nothing it began may outlive it."""
        if self._subscription is not None:
            self._unwatching()
        if self._scope is not None:
            self._leave_scope()


class StoreIO(_Seam):
    """Carries a flow's steps out in the caller's thread (see the module docstring).

    :param client: the client whose store, serializer and settings the steps use.
    :param work: what runs under the lease (or unreserved).
    :param emit: the call's events, for what the hold reports from its heartbeat thread.
    :param failure_of: how a failure of ``work`` is recorded (``None``: as ``Type: message``).
    :param logger: where the hold's decisions are logged.
    :param store: the store to go through, if not the client's (a view of its records).
    :param seen: shown every state of the key a wait reads or is notified of.
    """

    def drive(self, flow: Generator[Any, Any, T], emitter: Teller = None) -> T:
        """Carry ``flow`` out in this thread: its events to the observers, every other step to its
        handler. The store operations made meanwhile name the call's front end
        (:data:`dibs.events.FRONTEND`)."""
        with _Driving(flow, emitter, self._end) as driving:
            while (step := driving.next()) is not _DONE:
                driving.call(getattr(self, _HANDLERS[type(step)]), step)
        result: T = driving.result
        return result

    # -- the steps ------------------------------------------------------------------------------------
    def ask(self, step: steps.Ask) -> Hit | Acquired | Held:
        return self.outcome(step.key, self.store.acquire(step.key, step.request))

    def outcome(self, key: Key, found: StoreOutcome) -> Hit | Acquired | Held:
        """The store's answer as the flow takes it: a hit decoded, a grant as the lease's handle."""
        if isinstance(found, Present):
            return self.found(steps.Found(key, found.artifact))
        if isinstance(found, Granted):
            return self.taken(found)
        return found

    def found(self, step: steps.Found) -> Hit:
        """An artifact as a hit, its value decoded (``dibs run`` hands a payload on unread instead)."""
        return _decoded(self.client.artifacts, step)

    def read(self, step: steps.Read) -> KeyState:
        # As the watch hub reads for waiters (and the async seam, batched): a key's payload is loaded
        # and checked once, and a bad one is a miss (a payload-referencing store's read_many).
        found = self.store.read_many([step.key])
        return self._see(found[0] if found else self.store.read(step.key))  # type: ignore[no-any-return]

    def watch(self, step: steps.Watch) -> Callable[[], bool]:
        return self._watching(step.key)

    def unwatch(self, step: steps.Unwatch) -> None:
        self._unwatching()

    def pause(self, step: steps.Pause) -> KeyState | None:
        subscription = self._subscription
        if subscription is None:
            time.sleep(step.seconds)
            return None
        return self._see(subscription.wait(step.seconds))  # type: ignore[no-any-return]

    def wait(self, step: steps.Wait) -> None:
        """A wait begins: wait here (a front end may defer instead, raising :class:`steps.Suspend`)."""

    def release(self, step: steps.Release) -> None:
        step.lease.release(step.error)

    def hold(self, step: steps.Hold) -> holding.HeldLease:
        held = self.held(step.acquired)
        self._enter_scope(held)
        return held

    def work(self, step: steps.Work) -> Any:
        return self.work_fn()

    def fail(self, step: steps.Fail) -> None:
        try:
            step.held.fail(step.error)
        finally:
            self._leave_scope()

    def complete(self, step: steps.Complete) -> RunReport:
        try:
            return step.held.store(
                step.value,
                policy=step.policy,
                compute_seconds=step.compute_seconds,  # type: ignore[arg-type]
            )
        finally:
            self._leave_scope()

    def keep(self, step: steps.Keep) -> RunReport:
        raise NotImplementedError(f"{type(self).__name__} keeps no lease beyond its call")

    def run_unreserved(self, step: steps.RunUnreserved) -> Any:
        return self.work_fn()


class AsyncStoreIO(_Seam):
    """:class:`StoreIO` for event loops: the same steps awaited, every store call in the runtime's I/O
    executor (never on the loop, never in the loop's default executor), waits on the watch hub without a
    thread per waiter, and the work awaited (``work`` returns an awaitable)."""

    async def drive(self, flow: Generator[Any, Any, T], emitter: Teller = None) -> T:
        """:meth:`StoreIO.drive` on an event loop: each handler awaited in turn (the front end is set in
        this task's context; the store calls handed to the I/O executor run with it)."""
        with _Driving(flow, emitter, self._end) as driving:
            while (step := driving.next()) is not _DONE:
                await driving.acall(getattr(self, _HANDLERS[type(step)]), step)
        result: T = driving.result
        return result

    # -- the steps ------------------------------------------------------------------------------------
    async def ask(self, step: steps.Ask) -> Hit | Acquired | Held:
        """One ask in the I/O executor. A cancelled caller leaves nothing held.

        Cancelling the await does not stop a store call already running in the executor thread: the
        store may still grant the lease after the caller has gone, and then nobody would hold it but
        the store, for a whole ttl (issue 16, item 4). So the call is a ``concurrent.futures`` future
        of our own: when the awaiting coroutine is cancelled, a callback on that future releases any
        lease it grants. The callback runs when the store call ends, in the executor, whatever the
        event loop does meanwhile (a second cancel, the loop closing): the release is shielded.
        """
        store = self.store
        acquire = events.for_this_call(functools.partial(store.acquire, step.key, step.request))
        future = runtime().executor().submit(acquire)
        try:
            found = await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.add_done_callback(functools.partial(_release_unreceived, store, step.key))
            raise
        return await self.outcome(step.key, found)

    async def outcome(self, key: Key, found: StoreOutcome) -> Hit | Acquired | Held:
        if isinstance(found, Present):
            return await self.found(steps.Found(key, found.artifact))
        if isinstance(found, Granted):
            return self.taken(found)
        return found

    async def found(self, step: steps.Found) -> Hit:
        """A hit decoded, in the I/O executor when it is large: never a long decode on the loop."""
        if step.artifact.size > DECODE_ON_LOOP_BYTES:
            return await runtime().io(_decoded, self.client.artifacts, step)
        return _decoded(self.client.artifacts, step)

    async def read(self, step: steps.Read) -> KeyState:
        return self._see(await runtime().read(self.store, step.key))  # type: ignore[no-any-return]

    async def watch(self, step: steps.Watch) -> Callable[[], bool]:
        return self._watching(step.key)

    async def unwatch(self, step: steps.Unwatch) -> None:
        self._unwatching()

    async def pause(self, step: steps.Pause) -> KeyState | None:
        subscription = self._subscription
        if subscription is None:
            await asyncio.sleep(step.seconds)
            return None
        return self._see(await subscription.wait_async(step.seconds))  # type: ignore[no-any-return]

    async def wait(self, step: steps.Wait) -> None:
        """:meth:`StoreIO.wait`."""

    async def release(self, step: steps.Release) -> None:
        await runtime().io(step.lease.release, step.error)

    async def hold(self, step: steps.Hold) -> holding.HeldLease:
        held = self.held(step.acquired)  # its heartbeats run in their own thread, whatever the loop does
        self._enter_scope(held)
        return held

    async def work(self, step: steps.Work) -> Any:
        return await self.work_fn()

    async def fail(self, step: steps.Fail) -> None:
        """A failed (or cancelled) work releases its lease even if it is cancelled again meanwhile."""
        try:
            await asyncio.shield(runtime().io(step.held.fail, step.error))
        finally:
            self._leave_scope()

    async def complete(self, step: steps.Complete) -> RunReport:
        store = functools.partial(
            step.held.store, step.value, policy=step.policy, compute_seconds=step.compute_seconds
        )
        try:
            return await runtime().io(store)
        finally:
            self._leave_scope()

    async def keep(self, step: steps.Keep) -> RunReport:
        raise NotImplementedError(f"{type(self).__name__} keeps no lease beyond its call")

    async def run_unreserved(self, step: steps.RunUnreserved) -> Any:
        return await self.work_fn()


def _decoded(artifacts: ArtifactReader, step: steps.Found) -> Hit:
    """The hit of ``step``'s artifact, decoded; a payload that went bad since it was checked is said
    (the flow decides what that miss means)."""
    try:
        return artifacts.hit(step.key, step.artifact)
    except PayloadUnavailable as exc:
        log.warning("%s: its artifact is treated as missing, as it went bad: %s", step.key, exc)
        raise


def holding_what(got: Acquired | Lease | holding.HeldLease) -> tuple[Acquired, holding.HeldLease | None]:
    """What ``Reservations.hold`` is given, as the flow's :class:`Acquired`, and the
    :class:`~dibs.holding.HeldLease` already keeping it, if it is one (the seam's hold then keeps that)."""
    if isinstance(got, Acquired):
        return got, None
    if isinstance(got, holding.HeldLease):
        return Acquired(got.lease, got.took_over_from), got
    return Acquired(got), None


def _deferred(emitter: Teller, waiting: Any) -> None:
    if emitter is not None and emitter.wants(events.Deferred):
        emitter.send(
            emitter.make(events.Deferred, waited_seconds=waiting.seconds(time.time()), holder=waiting.holder)
        )


def _release_unreceived(store: Store, key: Key, future: Future[StoreOutcome]) -> None:
    """``future`` (a store ask whose caller was cancelled) ended: release the lease it granted, if any.

    Not a failure (the caller was stopped before it could start), so nothing is recorded. Never raises:
    this runs in an executor's callback, where an exception would only be logged by the executor.
    A lease the ask re-entered (its owner's own, already held: :attr:`~dibs.records.Granted.reentered`)
    belongs to whoever took it first, and is left alone.
    """
    if future.cancelled() or future.exception() is not None:
        return  # never ran, or the store refused: nothing was granted
    outcome = future.result()
    if not isinstance(outcome, Granted) or outcome.reentered:
        return
    if not threading.current_thread().name.startswith(runtime().IO_THREAD_PREFIX):
        # The store answered before the cancellation landed, so this runs where the callback was
        # added (an event loop's thread): do the store call in the executor instead of blocking it.
        try:
            runtime().executor().submit(_release_quietly, store, key, outcome)
            return
        except RuntimeError:  # the executor is shut down (interpreter exit): release here
            pass
    _release_quietly(store, key, outcome)


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

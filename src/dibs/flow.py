"""The compute-once flow, written once: ask → wait → hit or acquire → hold → report.

:func:`compute_once` is a generator that *decides* and yields what it needs next, as
:mod:`dibs._waiting` does one level down (and httpx's auth flow, tenacity's ``iter()``):

=====================  =====================================================================  ===============
step                   what the driver does                                                   sends back
=====================  =====================================================================  ===============
:class:`Ask`           one ``get_or_reserve``                                                 the outcome
:class:`Wait`          wait until the key is done or free, or ``timeout`` passes (or defer:   the outcome
                       raise :class:`Suspend`, and resume later with the :class:`Waiting`)
:class:`Hold`          run the work under the lease (``Reservations.hold``: heartbeats, then  a RunReport
                       complete or release, decided in :mod:`dibs.holding`)
:class:`RunUnreserved` run the work without a lease (the store is unreachable, policy "run")  its value
an :class:`~dibs.events.Event`  hand it to the observers                                      nothing
=====================  =====================================================================  ===============

An exception a step raises is thrown back into the flow, which decides (the store unreachable at
the first ask or after a wait: the ``on_store_unavailable`` policy) or lets it through. The policies
live here once: store unavailable, refresh → minimum token, the timeout and its wording, the report.
:func:`drive` and :func:`adrive` carry a flow out in a thread or on an event loop; a front end only
says how each step is done (:class:`FlowIO`) and translates the events (log lines, XComs, states).

A flow that waits can stop there and resume in another process: :class:`Waiting` is all it needs
(Airflow's operator defers at :class:`Wait` and resumes from its trigger's event).

This is what an integration builds on, besides ``dibs.__all__`` (it imports these names from
:mod:`dibs.integration`, their public home): ``Reservations.call`` makes a :class:`Call`, a subclass
of :class:`Steps` (or :class:`AsyncSteps`) says how the front end does the steps it does differently,
and an observer translates the events (see docs/architecture.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Awaitable, Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar

from dibs import events, holding
from dibs._waiting import AskAcquire
from dibs.backoff import Deadline
from dibs.errors import StoreUnavailable
from dibs.events import Emitter, Event
from dibs.outcomes import Acquired, Busy, Hit, Outcome, RunReport
from dibs.records import Held, LeaseRecord

if TYPE_CHECKING:
    from dibs.backoff import Deadline as DeadlineT
    from dibs.keys import Key
    from dibs.records import StoreOutcome
    from dibs.stores.base import Store

__all__ = [
    "Ask",
    "AsyncSteps",
    "Call",
    "Flow",
    "FlowIO",
    "Hold",
    "RunUnreserved",
    "Steps",
    "Suspend",
    "Wait",
    "Waiting",
    "adrive",
    "compute_once",
    "drive",
]

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Waiting:
    """What a call has waited so far; all a flow needs to resume at its wait step elsewhere.

    ``started`` is on the flow's clock (``time.time()`` for a flow that may resume on another host:
    clock skew then shifts only when the waiter's own timeout fires, never who holds the lease).
    """

    started: float | None = None  # when the key was first found busy; None: never waited
    deferrals: int = 0
    holder: str | None = None
    #: A refresh that found the key busy waits for what that lease stores (its token) or later.
    min_token: int | None = None

    def seconds(self, now: float) -> float:
        return 0.0 if self.started is None else max(0.0, now - self.started)


@dataclasses.dataclass(frozen=True)
class Ask:
    """Ask the store once (``get_or_reserve``); answered with a Hit, Acquired or Busy."""

    ask: AskAcquire


@dataclasses.dataclass(frozen=True)
class Wait:
    """Wait on ``busy`` until the key is done or free, at most ``timeout`` seconds (``None``: no
    limit); answered with a Hit, Acquired, or the last Busy. A driver may defer instead (raise
    :class:`Suspend`) and resume a new flow from ``waiting``, which already counts this wait."""

    ask: AskAcquire
    busy: Busy
    waiting: Waiting
    timeout: float | None


@dataclasses.dataclass(frozen=True)
class Hold:
    """Run the work under ``acquired``'s lease; answered with the hold's :class:`RunReport`."""

    acquired: Acquired


@dataclasses.dataclass(frozen=True)
class RunUnreserved:
    """Run the work without a lease; answered with its value (nothing is stored)."""

    ask: AskAcquire


Step = Ask | Wait | Hold | RunUnreserved | Event
Flow = Generator[Step, Any, RunReport]


class Suspend(Exception):
    """Raised by a :class:`Wait` handler that gives up its thread (an Airflow deferral): the drivers
    close the flow without deciding anything, and the caller resumes later from ``waiting``."""

    def __init__(self, waiting: Waiting) -> None:
        super().__init__(waiting)
        self.waiting = waiting


def compute_once(
    ask: AskAcquire,
    *,
    emitter: Emitter,
    policy: Literal["fail", "run"],
    timeout: float | None,
    max_age: float | None,
    resume: Waiting | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Flow:
    """The flow of one compute-once call (see the module docstring).

    ``ask`` is the first ask (a refresh asks with ``max_age=0``); ``max_age`` is the call's maximum
    artifact age for the asks after a refresh found the key busy. ``resume`` continues a call that
    waited elsewhere; ``clock`` measures waits (``time.time`` when a wait may resume on another host).
    """
    started = clock()
    state: dict[str, Any] = {}
    try:
        report = yield from _flow(
            ask,
            emitter,
            policy=policy,
            timeout=timeout,
            max_age=max_age,
            waiting=resume or Waiting(),
            clock=clock,
            state=state,
        )
    except BaseException as exc:
        if isinstance(exc, GeneratorExit):  # closed by a driver that suspended: decide nothing
            raise
        waiting: Waiting = state.get("waiting", Waiting())
        ending: dict[str, Any] = {
            "outcome": "failed",
            "waited_seconds": state.get("waited", waiting.seconds(clock())),
            "waited_on": waiting.holder,
            "token": state.get("token"),
            "error": str(exc) if isinstance(exc, Exception) else type(exc).__name__,
            "error_type": type(exc).__name__,
        }
        yield from _finished(emitter, ending, started, clock, waiting)
        raise
    if emitter.wants_routine(events.Finished):
        took_over = report.role == "computed" and report.took_over_from is not None
        ending = {field: getattr(report, field) for field in _REPORTED}
        ending["outcome"] = "took_over" if took_over else report.role
        yield from _finished(emitter, ending, started, clock, state["waiting"])
    return report


#: What :class:`~dibs.events.Finished` repeats of the call's :class:`RunReport`.
_REPORTED = ("waited_seconds", "token", "producer", "waited_on", "took_over_from", "stored")


def _finished(
    emitter: Emitter, ending: dict[str, Any], started: float, clock: Callable[[], float], waiting: Waiting
) -> Generator[Event, Any, None]:
    yield from _tell(
        emitter, events.Finished, seconds=clock() - started, deferrals=waiting.deferrals, **ending
    )


def _flow(
    ask: AskAcquire,
    emitter: Emitter,
    *,
    policy: Literal["fail", "run"],
    timeout: float | None,
    max_age: float | None,
    waiting: Waiting,
    clock: Callable[[], float],
    state: dict[str, Any],
) -> Flow:
    if waiting.min_token is not None:  # a refresh resumed: the busy holder's artifact is the fresh one
        ask = ask.sharing(waiting.min_token, max_age)
    state["waiting"] = waiting
    yield from _tell(emitter, events.Asked, refresh=ask.refreshing, min_token=ask.request.min_fence)
    try:
        got: Outcome = yield Ask(ask)
        while isinstance(got, Busy):
            busy = got
            if waiting.started is None:
                waiting = dataclasses.replace(waiting, started=clock())
            if ask.refreshing and busy.token is not None:
                ask = ask.sharing(busy.token, max_age)
                waiting = dataclasses.replace(waiting, min_token=busy.token)
            yield from _busy(emitter, waiting.holder, busy)
            waiting = state["waiting"] = dataclasses.replace(waiting, holder=busy.holder)
            remaining = None if timeout is None else max(0.0, timeout - waiting.seconds(clock()))
            if remaining is not None and remaining <= 0:
                yield from _waited(emitter, waiting, clock, "timeout")
                raise busy.timed_out(waiting.seconds(clock()))
            got = yield Wait(ask, busy, waiting, remaining)
            if isinstance(got, Busy):  # the wait's own deadline passed (it reported new holders)
                yield from _waited(emitter, waiting, clock, "timeout")
                raise got.timed_out(waiting.seconds(clock()))
    except StoreUnavailable as exc:
        if waiting.started is not None:
            yield from _waited(emitter, waiting, clock, "unavailable")
        if policy == "fail":
            raise
        yield from _tell(emitter, events.RanUnreserved, error=str(exc))
        value = yield RunUnreserved(ask)
        return RunReport(ask.key, value, "unreserved", None, ask.request.owner, stored=False)
    waited = state["waited"] = waiting.seconds(clock())
    if waiting.started is not None:
        yield from _waited(emitter, waiting, clock, "hit" if isinstance(got, Hit) else "acquired")
    if isinstance(got, Hit):
        yield from _tell(
            emitter,
            events.ArtifactFound,
            producer=got.producer,
            token=got.token,
            size=got.size,
            waited=waiting.started is not None,
            stored_at=got.created_at,
            compute_seconds=got.compute_seconds,
        )
        role: Literal["waited", "hit"] = "waited" if waiting.started is not None else "hit"
        return RunReport(got.key, got.value, role, got.token, got.producer, waited, waiting.holder)
    lease, failure = got.lease, got.last_failure
    state["token"] = lease.token
    yield from _tell(
        emitter,
        events.LeaseAcquired,
        got.took_over_from is None,
        token=lease.token,
        attempt=lease.attempt,
        acquired_at=lease.record.acquired_at,
        took_over_from=got.took_over_from,
        last_failure=None if failure is None else failure.error,
        last_failure_owner=None if failure is None else failure.owner,
        failures=0 if failure is None else failure.count,
    )
    report: RunReport = yield Hold(got)
    if report.waited_seconds == waited and report.waited_on == waiting.holder:
        return report  # the usual case, a call that never waited: nothing to replace
    return dataclasses.replace(report, waited_seconds=waited, waited_on=waiting.holder)


def _tell(
    emitter: Emitter, kind: type[Event], routine: bool = False, /, **fields: Any
) -> Generator[Event, Any, None]:
    """Yield an event of ``kind`` for the driver to deliver, unless nobody wants it (then it is not
    even built); a ``routine`` one only if somebody wants it even then (:meth:`Emitter.wants_routine`)."""
    if emitter.wants_routine(kind) if routine else emitter.wants(kind):
        yield emitter.make(kind, **fields)


def _busy(emitter: Emitter, previous: str | None, busy: Busy) -> Generator[Event, Any, None]:
    if previous is not None and previous != busy.holder:
        yield from _tell(
            emitter, events.HolderChanged, previous=previous, holder=busy.holder, expires_in=busy.remaining
        )
    failure = busy.last_failure
    yield from _tell(
        emitter,
        events.KeyBusy,
        holder=busy.holder,
        expires_in=busy.remaining,
        held_for=max(0.0, busy.now - busy.since),
        attempt=busy.attempt,
        token=busy.token,
        last_failure=None if failure is None else failure.error,
        last_failure_owner=None if failure is None else failure.owner,
        failures=0 if failure is None else failure.count,
    )


def _waited(
    emitter: Emitter,
    waiting: Waiting,
    clock: Callable[[], float],
    outcome: Literal["hit", "acquired", "timeout", "unavailable"],
) -> Generator[Event, Any, None]:
    yield from _tell(
        emitter,
        events.Waited,
        seconds=waiting.seconds(clock()),
        outcome=outcome,
        holder=waiting.holder,
        deferrals=waiting.deferrals,
    )


class FlowIO(Protocol):
    """How one front end does each step: the sync driver calls these, the async one awaits them."""

    def ask(self, step: Ask) -> Any: ...

    def wait(self, step: Wait) -> Any: ...

    def hold(self, step: Hold) -> Any: ...

    def run_unreserved(self, step: RunUnreserved) -> Any: ...


def _handler(io: FlowIO, step: Step) -> Callable[[Any], Any]:
    if isinstance(step, Ask):
        return io.ask
    if isinstance(step, Wait):
        return io.wait
    if isinstance(step, Hold):
        return io.hold
    return io.run_unreserved


@dataclasses.dataclass(frozen=True)
class _Done:
    report: RunReport


def _advance(flow: Flow, answer: Any, error: BaseException | None, emitter: Emitter) -> Step | _Done:
    """Send the last step's answer (or throw its error) into the flow, hand the events it yields to
    the observers, and return its next step (or :class:`_Done`)."""
    try:
        step = flow.send(answer) if error is None else flow.throw(error)
        while isinstance(step, Event):
            emitter.send(step)
            step = flow.send(None)
    except StopIteration as stop:
        return _Done(stop.value)
    return step


def _deferred(emitter: Emitter, waiting: Waiting) -> None:
    if emitter.wants(events.Deferred):
        emitter(events.Deferred, waited_seconds=waiting.seconds(time.time()), holder=waiting.holder)


def drive(flow: Flow, io: FlowIO, emitter: Emitter) -> RunReport:
    """Carry a flow out in this thread: events to the observers, every other step to ``io``. The
    store operations made meanwhile name the call's front end (:data:`dibs.events.FRONTEND`)."""
    answer: Any = None
    error: BaseException | None = None
    acting = events.FRONTEND.set(emitter.frontend)
    try:
        while not isinstance(step := _advance(flow, answer, error, emitter), _Done):
            try:
                answer, error = _handler(io, step)(step), None
            except Suspend as suspend:
                flow.close()
                _deferred(emitter, suspend.waiting)
                raise
            except BaseException as exc:  # the flow decides: a policy, or it lets it through
                answer, error = None, exc
    finally:
        events.FRONTEND.reset(acting)
    return step.report


async def adrive(flow: Flow, io: FlowIO, emitter: Emitter) -> RunReport:
    """:func:`drive` on an event loop: ``io``'s methods are coroutines, awaited in turn (the front
    end is set in this task's context; the store calls they hand to the runtime's I/O executor run in
    a copy of it)."""
    answer: Any = None
    error: BaseException | None = None
    acting = events.FRONTEND.set(emitter.frontend)
    try:
        while not isinstance(step := _advance(flow, answer, error, emitter), _Done):
            pending: Awaitable[Any] = _handler(io, step)(step)
            try:
                answer, error = await pending, None
            except Suspend as suspend:
                flow.close()
                _deferred(emitter, suspend.waiting)
                raise
            except BaseException as exc:
                answer, error = None, exc
    finally:
        # A coroutine abandoned by its task is closed later, maybe in another context (the garbage
        # collector at the loop's teardown), where the token cannot be reset: that context never had it.
        with contextlib.suppress(ValueError):
            events.FRONTEND.reset(acting)
    return step.report


@dataclasses.dataclass(frozen=True)
class Call:
    """One compute-once call, ready to drive: its flow and the emitter of its events
    (:meth:`dibs.Reservations.call` builds one)."""

    flow: Flow
    emitter: Emitter

    def drive(self, io: FlowIO) -> RunReport:
        return drive(self.flow, io, self.emitter)

    async def adrive(self, io: FlowIO) -> RunReport:
        return await adrive(self.flow, io, self.emitter)


class Client(Protocol):
    """What :class:`Steps` does each step with: a :class:`dibs.Reservations` (described here rather
    than imported, so that this module stays below the client that drives it)."""

    @property
    def store(self) -> Store: ...

    def _ask_store(self, ask: AskAcquire) -> StoreOutcome: ...

    def _wait_store(
        self, ask: AskAcquire, deadline: DeadlineT, held: Callable[[Held], None] | None = None
    ) -> StoreOutcome: ...

    def _to_outcome(self, key: Key, outcome: StoreOutcome) -> Outcome: ...

    def hold(self, got: holding.HeldLease, work: Callable[[], Any]) -> RunReport: ...


class AsyncClient(Protocol):
    """What :class:`AsyncSteps` does each step with: a :class:`dibs.AsyncReservations`."""

    @property
    def store(self) -> Store: ...

    async def _ask_store(self, ask: AskAcquire) -> StoreOutcome: ...

    async def _wait_store(
        self, ask: AskAcquire, deadline: DeadlineT, held: Callable[[Held], None] | None = None
    ) -> StoreOutcome: ...

    async def _outcome(self, key: Key, outcome: StoreOutcome) -> Outcome: ...

    async def hold(self, got: holding.HeldLease, work: Callable[[], Awaitable[Any]]) -> RunReport: ...


ClientT = TypeVar("ClientT")
WorkT = TypeVar("WorkT")


class _HowToHold(Generic[ClientT, WorkT]):
    """What both faces of the steps are given: the client, the work, and how the hold reports.

    While a wait step runs, :attr:`seen` is the last lease it found on the key (a front end explains a
    takeover with it: did the holder stop heartbeating, or reach its maximum age?), and with
    :attr:`progress_every` set, a :class:`~dibs.events.StillWaiting` event comes that often.
    """

    #: Seconds between two :class:`~dibs.events.StillWaiting` events while a wait lasts (``None``: none).
    progress_every: float | None = None

    def __init__(
        self,
        client: ClientT,
        work: Callable[[], WorkT],
        *,
        emit: Emitter | None = None,
        failure_of: holding.FailureOf | None = None,
        logger: holding.Logger | None = None,
    ) -> None:
        self.client, self.work, self.emit = client, work, emit
        self.failure_of, self.logger = failure_of, logger
        self.seen: LeaseRecord | None = None

    def held(self, acquired: Acquired) -> holding.HeldLease:
        """The lease of a :class:`Hold` step, heartbeating from now on (a front end that must reach it
        from elsewhere, Airflow's ``on_kill``, keeps it before handing it to the hold)."""
        return holding.HeldLease(
            acquired.lease,
            took_over_from=acquired.took_over_from,
            failure_of=self.failure_of,
            logger=self.logger,
            emit=self.emit,
        )

    def _watcher(self, step: Wait) -> Callable[[Held], None]:
        """What a wait does with every busy answer it gets: remember the lease, and tell the observers
        when the key changes hands (``HolderChanged``)."""
        last = [step.busy.holder]
        emit = self.emit

        def held(answer: Held) -> None:
            lease = self.seen = answer.lease
            if lease.owner != last[0]:
                if emit is not None:
                    expires_in = max(0.0, lease.expires_at - answer.now)
                    emit(events.HolderChanged, previous=last[0], holder=lease.owner, expires_in=expires_in)
                last[0] = lease.owner

        return held

    def _parts(self, step: Wait) -> Iterator[Deadline]:
        """The wait in parts of at most :attr:`progress_every` seconds; between two parts (the key
        still busy) a ``StillWaiting`` event. The caller stops at an answer that is not busy."""
        whole = Deadline(step.timeout)
        every = self.progress_every
        while True:
            remaining = whole.remaining
            if every is None or (remaining is not None and remaining <= every):
                yield whole
                return
            yield Deadline(every)
            if self.emit is not None:
                holder = step.busy.holder if self.seen is None else self.seen.owner
                self.emit(events.StillWaiting, holder=holder, seconds=whole.elapsed)


class Steps(_HowToHold[Client, Any]):
    """How a plain client does each step in a thread; a front end overrides what it does otherwise
    (Airflow defers at :meth:`wait`, ``dibs run`` shows the wait to whoever follows it).

    :param work: what runs under the lease (or unreserved); ``failure_of`` and ``logger`` are
        :meth:`dibs.Reservations.hold`'s.
    """

    client: Client

    def ask(self, step: Ask) -> Outcome:
        c = self.client
        holding.not_held_here(c.store, step.ask.key)
        return self.outcome(step.ask.key, c._ask_store(step.ask))

    def wait(self, step: Wait) -> Outcome:
        c, watcher = self.client, self._watcher(step)
        for part in self._parts(step):
            outcome = c._wait_store(step.ask, part, watcher)
            if not isinstance(outcome, Held):
                break
        return self.outcome(step.ask.key, outcome)

    def outcome(self, key: Key, outcome: StoreOutcome) -> Outcome:
        """The store's answer as the caller's outcome (a hit's value decoded); ``dibs run`` hands a
        payload on as a stream instead."""
        return self.client._to_outcome(key, outcome)

    def hold(self, step: Hold) -> RunReport:
        return self.client.hold(self.held(step.acquired), self.work)

    def run_unreserved(self, step: RunUnreserved) -> Any:
        return self.work()


class AsyncSteps(_HowToHold[AsyncClient, Awaitable[Any]]):
    """:class:`Steps` for event loops: the store's part in the runtime's I/O executor, the work awaited."""

    client: AsyncClient

    async def ask(self, step: Ask) -> Outcome:
        holding.not_held_here(self.client.store, step.ask.key)
        return await self.client._outcome(step.ask.key, await self.client._ask_store(step.ask))

    async def wait(self, step: Wait) -> Outcome:
        c, watcher = self.client, self._watcher(step)
        for part in self._parts(step):
            outcome = await c._wait_store(step.ask, part, watcher)
            if not isinstance(outcome, Held):
                break
        return await c._outcome(step.ask.key, outcome)

    async def hold(self, step: Hold) -> RunReport:
        return await self.client.hold(self.held(step.acquired), self.work)

    async def run_unreserved(self, step: RunUnreserved) -> Any:
        return await self.work()

"""The compute-once flow, written once: ask → wait → hit or acquire → hold → report. It alone decides.

Every call a client or a front end makes is one of the generators here: it *decides* and yields what
it needs next (a :mod:`dibs.steps` step, or an event for the observers), and receives the answer; it
never does I/O, and never calls a client (the shape of httpx's auth flow and tenacity's ``iter()``).
A driver carries the steps out: :class:`dibs.seam.StoreIO` in a thread, :class:`dibs.seam.AsyncStoreIO`
on an event loop; a front end subclasses one to do a step its own way (Airflow defers at
:class:`~dibs.steps.Wait`, ``dibs run`` streams a hit), and translates the events.

==========================  ====================================================================
path                        what it decides
==========================  ====================================================================
:func:`compute_once`        ``compute``/``run`` and every front end's reserved task: the first ask
                            (the store unreachable: ``on_store_unavailable``), the wait (a refresh
                            shares the busy holder's result: ``min_token``; the timeout and its one
                            wording; a store outage ridden out), ``max_failures``, the hold (the
                            call's own policy at ``complete``), the report and every event
:func:`reserve`             ``get_or_reserve`` (one ask) and ``acquire`` (ask, then wait)
:func:`wait_for`            ``wait``: until the key is done or free, reserving nothing
:func:`hold`                ``Reservations.hold``: a lease already granted, its work and its ending
:func:`release_own`         give back a lease its owner holds, from wherever (a lock released by
                            another process, a stop that landed just as the lease was granted)
:func:`kept_ended`          how a call that kept its lease (a lock) ended, once the lease is given
                            back: it computed, it was served (what it guards was there), or failed
==========================  ====================================================================

An exception a step raises is thrown back into the flow, which decides: the first ask of a call
applies ``on_store_unavailable``; every later ask or read of a waiter rides out an outage (:class:`
~dibs.backoff.Outage`: it keeps waiting, for ``outage_patience`` at most, never past its timeout);
anything else goes through, ending the call.

A flow that waits can stop there and resume in another process: :class:`~dibs.steps.Waiting` is all it
needs (Airflow's operator defers at :class:`~dibs.steps.Wait` and resumes from its trigger's event).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Generator
from typing import Any, Literal, Protocol, TypeVar

from dibs import events
from dibs.backoff import Backoff, Deadline, Outage
from dibs.errors import StoreUnavailable, TooManyFailures, WaitTimeout
from dibs.events import Emitter, Event
from dibs.keys import Key
from dibs.outcomes import Acquired, Busy, Hit, Outcome, RunReport
from dibs.payloads.base import PayloadUnavailable
from dibs.records import FailureRecord, Held, KeyState, LeaseRecord
from dibs.steps import (
    UNWATCH,
    Ask,
    Complete,
    Fail,
    Found,
    Hold,
    Keep,
    Kept,
    Pause,
    Read,
    Release,
    RunUnreserved,
    Step,
    Suspend,
    Wait,
    Waiting,
    Watch,
    Work,
)
from dibs.stops import is_stop
from dibs.stores.requests import AcquireRequest

__all__ = [
    "Call",
    "Flow",
    "Rules",
    "Suspend",
    "Waiting",
    "compute_once",
    "gave_up",
    "hold",
    "is_settled",
    "kept_ended",
    "release_own",
    "reserve",
    "wait_for",
]

T = TypeVar("T")
Flow = Generator[Step | Event, Any, T]
#: Where a flow's events go: an :class:`~dibs.events.Emitter`, or ``None`` (nobody hears them).
Teller = Emitter | events.LazyEmitter | None


@dataclasses.dataclass(frozen=True)
class Rules:
    """What a client's calls decide with, read from its settings once: how a waiter asks again, how
    long it rides out an unreachable store, and how many recorded failures refuse a lease."""

    backoff: Backoff = dataclasses.field(default_factory=Backoff)
    outage: Outage = dataclasses.field(default_factory=Outage)
    max_failures: int | None = None


# -- compute once -----------------------------------------------------------------------------------
def compute_once(
    ask: Ask,
    *,
    emitter: Emitter,
    rules: Rules,
    policy: Literal["fail", "run"],
    timeout: float | None,
    max_age: float | None,
    resume: Waiting | None = None,
    clock: Callable[[], float] = time.monotonic,
    progress_every: float | None = None,
    keep: bool = False,
    reenters: Callable[[str], bool] | None = None,
) -> Flow[RunReport]:
    """The flow of one compute-once call (see the module docstring).

    ``ask`` is the first ask (a refresh asks with ``max_age=0``); ``max_age`` is the call's maximum
    artifact age for the asks after a refresh found the key busy; ``policy`` is the call's
    ``on_store_unavailable``, at the first ask and at ``complete``. ``resume`` continues a call that
    waited elsewhere (its first ask is a waiter's); ``clock`` measures waits (``time.time`` when a wait
    may resume on another host); ``progress_every`` makes a ``StillWaiting`` event that often while it
    waits. ``keep``: the lease outlives the call (a lock), so the hold is a :class:`~dibs.steps.Keep`,
    and the call ends later, when the lease is given back (:func:`kept_ended`).
    ``reenters(owner)``: a busy key held by such an owner is this caller's own (a lock's holder asking
    from another run), re-entered as that owner.
    """
    call = _Computing(
        ask,
        emitter,
        rules,
        policy,
        timeout,
        max_age,
        resume or Waiting(),
        clock,
        progress_every,
        keep,
        reenters,
    )
    started = call.started = clock()
    try:
        report = yield from call.run()
    except GeneratorExit:  # closed by a driver that suspended: decide nothing
        raise
    except BaseException as exc:
        waiting = call.waiting
        ending: dict[str, Any] = {
            "outcome": "failed",
            "waited_seconds": call.waited if call.waited is not None else waiting.seconds(clock()),
            "waited_on": waiting.holder,
            "token": call.token,
            "error": str(exc) if isinstance(exc, Exception) else type(exc).__name__,
            "error_type": type(exc).__name__,
        }
        yield from _finished(emitter, ending, started, clock, waiting)
        raise
    if call.kept:  # its lease outlives it: it ends when that is given back (kept_ended)
        return report
    if emitter.wants_routine(events.Finished):
        took_over = report.role == "computed" and report.took_over_from is not None
        ending = {field: getattr(report, field) for field in _REPORTED}
        ending["outcome"] = "took_over" if took_over else report.role
        yield from _finished(emitter, ending, started, clock, call.waiting)
    return report


#: What :class:`~dibs.events.Finished` repeats of the call's :class:`RunReport`.
_REPORTED = ("waited_seconds", "token", "producer", "waited_on", "took_over_from", "stored")


def _finished(
    emitter: Emitter, ending: dict[str, Any], started: float, clock: Callable[[], float], waiting: Waiting
) -> Generator[Event, Any, None]:
    yield from _tell(
        emitter, events.Finished, seconds=clock() - started, deferrals=waiting.deferrals, **ending
    )


@dataclasses.dataclass
class _Computing:
    """One compute-once call while it runs (see :func:`compute_once` for its terms), and what it has
    learnt so far: how long it waited (and on whom), the token of its lease."""

    ask: Ask
    emitter: Emitter
    rules: Rules
    policy: Literal["fail", "run"]
    timeout: float | None
    max_age: float | None
    waiting: Waiting
    clock: Callable[[], float]
    progress_every: float | None
    keep: bool
    reenters: Callable[[str], bool] | None
    waited: float | None = None
    token: int | None = None
    started: float = 0.0
    #: Its lease outlives it (a lock, kept): the call ends when that is given back (:func:`kept_ended`).
    kept: bool = False

    def remaining(self) -> float | None:
        """What is left of the call's timeout (across deferrals)."""
        timeout = self.timeout
        return None if timeout is None else max(0.0, timeout - self.waiting.seconds(self.clock()))

    def run(self) -> Flow[RunReport]:
        emitter, clock, ask = self.emitter, self.clock, self.ask
        if self.waiting.min_token is not None:  # a refresh resumed: the busy holder's artifact is fresh
            ask = ask.sharing(self.waiting.min_token, self.max_age)
        yield from _tell(emitter, events.Asked, refresh=ask.refreshing, min_token=ask.request.min_fence)
        waiter: _Waiter | None = None  # made only for a call that waits: most never do
        try:
            if self.waiting.started is None:
                got = yield ask  # the first ask: a store that cannot be reached is the policy's
            else:  # a waiter resumed elsewhere: it still holds nothing, and rides an outage out
                waiter = self._waiter()
                if self.waiting.unreachable is not None:  # ...which it did already, as long as it may
                    raise StoreUnavailable(self.waiting.unreachable)
                got = yield from waiter.asking(ask, Deadline(self.remaining()))
            if self.reenters is not None:
                got = yield from _own(ask, got, self.reenters)
            if isinstance(got, Held):
                waiter = waiter or self._waiter()
                got = yield from self._wait(ask, got, waiter)
        except StoreUnavailable as exc:
            if self.waiting.started is not None:
                yield from _waited(emitter, self.waiting, clock, "unavailable")
            if self.policy == "fail":
                raise
            yield from _tell(emitter, events.RanUnreserved, error=str(exc))
            value = yield RunUnreserved(ask.key)
            return RunReport(ask.key, value, "unreserved", None, ask.request.owner, stored=False)
        self.waited = self.waiting.seconds(clock())
        if self.waiting.started is not None:
            yield from _waited(emitter, self.waiting, clock, "hit" if isinstance(got, Hit) else "acquired")
        if isinstance(got, Hit):
            return (yield from self._hit(got))
        seen = None if waiter is None else waiter.seen
        yield from self._acquired(got, seen)
        if self.keep:
            report: RunReport = yield Keep(got, self._kept(got, seen))
            self.kept = True
        else:
            report = yield from _hold(got, self.policy)
        if report.waited_seconds == self.waited and report.waited_on == self.waiting.holder:
            return report  # the usual case, a call that never waited: nothing to replace
        return dataclasses.replace(report, waited_seconds=self.waited, waited_on=self.waiting.holder)

    def _kept(self, got: Acquired, seen: LeaseRecord | None) -> Kept:
        """What the call's ending needs, once its kept lease is given back."""
        spared = None
        if seen is not None and self.waiting.started is not None and got.took_over_from is None:
            spared = max(0.0, got.lease.record.acquired_at - seen.acquired_at)  # both the store's clock
        return Kept(
            self.emitter,
            got,
            started=self.started,
            granted=self.clock(),
            clock=self.clock,
            granted_at=time.time(),
            waiting=self.waiting,
            waited=self.waited or 0.0,
            spared=spared,
        )

    def _waiter(self) -> _Waiter:
        return _Waiter(
            self.emitter, self.rules, clock=self.clock, narrate=True, progress_every=self.progress_every
        )

    def _wait(self, ask: Ask, got: Held, waiter: _Waiter) -> Flow[Hit | Acquired]:
        """The key is busy: wait (or be deferred, and resumed by a new flow) until it is done or free."""
        emitter, clock = self.emitter, self.clock
        busy = Busy.of(got.lease, got.now, got.failure)
        waiting = self.waiting
        if waiting.started is None:
            waiting = dataclasses.replace(waiting, started=clock())
        if ask.refreshing:  # the artifact the busy lease stores (or a later one) is the fresh one
            ask = ask.sharing(got.lease.token.fence, self.max_age)
            waiting = dataclasses.replace(waiting, min_token=got.lease.token.fence)
        yield from _busy(emitter, waiting.holder, busy)
        waiting = self.waiting = dataclasses.replace(waiting, holder=busy.holder)
        left = self.remaining()
        if left is not None and left <= 0:
            yield from _waited(emitter, waiting, clock, "timeout")
            raise busy.timed_out(waiting.seconds(clock()))
        yield Wait(ask, busy, waiting, left)  # a driver may suspend here (and resume elsewhere)
        answer = yield from waiter.until_free(ask, got, Deadline(left))
        if self.reenters is not None:
            answer = yield from _own(ask, answer, self.reenters)
        if isinstance(answer, Held):  # the wait's own deadline passed (it reported new holders)
            yield from _waited(emitter, waiting, clock, "timeout")
            raise Busy.of(answer.lease, answer.now, answer.failure).timed_out(waiting.seconds(clock()))
        result: Hit | Acquired = answer
        return result

    def _hit(self, got: Hit) -> Flow[RunReport]:
        waited, waiting = self.waited or 0.0, self.waiting
        yield from _tell(
            self.emitter,
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

    def _acquired(self, got: Acquired, seen: LeaseRecord | None) -> Flow[None]:
        """The lease is this call's: refused after too many failures, else reported."""
        limit = self.rules.max_failures
        if limit is not None:
            yield from _refuse_too_many(got, limit)
        lease, failure = got.lease, got.last_failure
        self.token = lease.token
        expired_by, expired_max_age = _expiry(got, seen)
        yield from _tell(
            self.emitter,
            events.LeaseAcquired,
            got.took_over_from is None,
            token=lease.token,
            attempt=lease.attempt,
            acquired_at=lease.record.acquired_at,
            took_over_from=got.took_over_from,
            last_failure=None if failure is None else failure.error,
            last_failure_owner=None if failure is None else failure.owner,
            failures=0 if failure is None else failure.count,
            expired_by=expired_by,
            expired_max_age=expired_max_age,
        )


def _own(ask: Ask, got: Any, reenters: Callable[[str], bool] | None) -> Flow[Any]:
    """A busy key held by an owner that is this caller too (``reenters``) is re-entered as that owner."""
    if reenters is not None and isinstance(got, Held) and reenters(got.lease.owner):
        got = yield ask.as_owner(got.lease.owner)
    return got


def _expiry(
    got: Acquired, seen: LeaseRecord | None
) -> tuple[Literal["heartbeating", "max_lease_age"] | None, float | None]:
    """Why the lease ``got`` took over had expired, as far as the wait saw it (its last lease)."""
    if got.took_over_from is None or seen is None or seen.owner != got.took_over_from:
        return None, None
    if seen.max_expires_at is not None and got.lease.record.acquired_at >= seen.max_expires_at:
        return "max_lease_age", seen.max_expires_at - seen.acquired_at
    return "heartbeating", None


def _refuse_too_many(got: Acquired, limit: int | None) -> Flow[None]:
    """``max_failures``: a lease granted on a key that failed that often is given back (not a failure
    of this call: it refuses to run, it did not fail) and refused."""
    failure = got.last_failure
    if limit is None or failure is None or failure.count < limit:
        return
    yield Release(got.lease)
    raise too_many(got.key, failure, limit)


def too_many(key: Key, failure: FailureRecord, limit: int) -> TooManyFailures:
    """The refusal of a key that failed ``limit`` times: whose failure it was, and how to try again."""
    forget = f"dibs forget {key.name!r} --namespace {key.namespace}"
    why = f"{key} failed {failure.count} times (max_failures={limit}); last error from {failure.owner!r}"
    return TooManyFailures(
        f"{why}: {failure.error}. Fix the cause, then run '{forget}' to try again",
        key=str(key),
        failures=failure.count,
    )


def _hold(acquired: Acquired, policy: Literal["fail", "run"]) -> Flow[RunReport]:
    """The work under the lease: heartbeats from :class:`~dibs.steps.Hold` on; a failure released with
    it recorded (:class:`~dibs.steps.Fail`), a value stored (:class:`~dibs.steps.Complete`, whose
    decisions are :mod:`dibs.holding`'s), a store down at ``complete`` decided by ``policy``."""
    held = yield Hold(acquired)
    began = time.monotonic()  # the work's own time, whatever clock the waits are measured on
    try:
        value = yield Work(held)
    except GeneratorExit:
        raise
    except BaseException as exc:
        yield Fail(held, exc)
        raise
    report: RunReport = yield Complete(held, value, policy, time.monotonic() - began)
    return report


def hold(acquired: Acquired, policy: Literal["fail", "run"]) -> Flow[RunReport]:
    """``Reservations.hold``: run the work under a lease already granted (see :func:`_hold`)."""
    return (yield from _hold(acquired, policy))


# -- get_or_reserve, acquire ------------------------------------------------------------------------
def reserve(
    ask: Ask,
    *,
    rules: Rules,
    emitter: Teller = None,
    timeout: float | None = 0.0,
    raise_on_timeout: bool = False,
    max_age: float | None = None,
) -> Flow[Outcome]:
    """``get_or_reserve`` (``timeout=0``: one ask) and ``acquire`` (ask, then wait up to ``timeout``
    seconds, ``None``: as long as it takes). A busy answer once the wait is over raises
    :class:`~dibs.errors.WaitTimeout` naming the holder with ``raise_on_timeout``, else is the answer.
    Only a store outage during the wait is reported (to ``emitter``): these calls have no other events.
    """
    deadline = None if timeout == 0 else Deadline(timeout)  # get_or_reserve: one ask, no wait
    got = yield ask  # the first ask: a store that cannot be reached is the caller's to handle
    if isinstance(got, Held):
        if deadline is not None and not deadline.expired:
            # Most calls are answered at once (a hit, or a free key), so the watch starts only now; the
            # wait asks again right after it, so no change is missed. A refresh shares the busy result.
            again = ask.sharing(got.lease.token.fence, max_age) if ask.refreshing else ask
            waiter = _Waiter(emitter, rules, narrate=False)
            got = yield from waiter.until_free(again, got, deadline)
        if isinstance(got, Held):
            busy = Busy.of(got.lease, got.now, got.failure)
            if raise_on_timeout:
                raise busy.timed_out(0.0 if deadline is None else deadline.elapsed)
            return busy
    if isinstance(got, Acquired) and rules.max_failures is not None:
        yield from _refuse_too_many(got, rules.max_failures)
    answer: Outcome = got
    return answer


# -- wait -----------------------------------------------------------------------------------------------
def wait_for(
    key: Key,
    *,
    rules: Rules,
    emitter: Teller = None,
    timeout: float | None = None,
    for_artifact: bool = False,
    max_age: float | None = None,
    min_token: int | None = None,
    decode: bool = True,
    resumed: bool = False,
) -> Flow[Hit | None]:
    """``wait``: until the key is done (a hit), or (unless ``for_artifact``) nobody holds it (``None``),
    reserving nothing; an artifact ``max_age`` old, or stored under a token below ``min_token``, does
    not count. ``decode=False``: the hit's value is the artifact record itself, unread.

    A waiter holds nothing, so it rides out an outage; but its first read is its first ask: a store
    that was never reached may be a wrong URL rather than an outage, and says so at once. ``resumed``:
    this wait continues one that reached the store before (a deferred task's trigger), so even its first
    read rides an outage out."""
    deadline = Deadline(timeout)
    waiter = _Waiter(emitter, rules, narrate=False)
    read = Read(key)
    state = (yield from waiter.asking(read, deadline)) if resumed else (yield read)
    while True:
        if not is_settled(state, for_artifact, max_age, min_token) and not deadline.expired:
            state = yield from waiter.until_settled(state, deadline, for_artifact, max_age, min_token)
        artifact = state.artifact
        if artifact is not None and artifact.is_fresh(state.now, max_age=max_age, min_fence=min_token):
            if not decode:
                return Hit.of(state.key, artifact, artifact)  # the record itself, undecoded
            try:
                hit: Hit = yield Found(state.key, artifact)
            except PayloadUnavailable:
                # It went bad since it was read: the miss a read would have found. A wait for an
                # artifact with time left waits on (its reads find the bad payload and leave it out).
                state = dataclasses.replace(state, artifact=None)
                if for_artifact and not deadline.expired:
                    state = yield from waiter.asking(read, deadline)
                    continue
            else:
                return hit
        if state.live_lease is not None or for_artifact:
            raise gave_up(state.key, deadline, state=state)
        return None


def is_settled(
    state: KeyState, for_artifact: bool, max_age: float | None = None, min_fence: int | None = None
) -> bool:
    """Whether ``state`` ends a wait: a fresh artifact, or (unless ``for_artifact``) nobody holding
    the key."""
    artifact = state.artifact
    fresh = artifact is not None and artifact.is_fresh(state.now, max_age=max_age, min_fence=min_fence)
    return fresh or (not for_artifact and state.live_lease is None)


def gave_up(key: Key, deadline: Deadline, *, state: KeyState) -> WaitTimeout:
    """The one wording of a wait that timed out without a busy answer in hand: who holds the key, or
    why nobody does."""
    if state.live_lease is not None:
        return Busy.of(state.live_lease, state.now, state.failure).timed_out(deadline.elapsed)
    if state.failure is not None:
        failure = state.failure
        why = (
            f"not computed: its last attempt failed ({failure.count} failure(s); last by {failure.owner!r}: "
            f"{failure.error})"
            if not is_stop(failure.error)
            else f"not computed: its last holder, {failure.owner!r}, was {failure.error}"
        )
    else:
        why = "not computed yet, and nobody is computing it"
    return WaitTimeout(
        f"gave up waiting for {key} after {deadline.elapsed:.1f}s: {why}", key=str(key), holder=None
    )


# -- the end of a call that kept its lease ----------------------------------------------------------
def kept_ended(
    kept: Kept, ending: Literal["held", "stored", "served", "failed"], error: str | None = None
) -> Generator[Event, Any, None]:
    """A call that kept its lease (a lock, ``keep=True``) ended when the lease was given back: how, from
    what its holder did while it held it, which only its front end can see (Prefect's task run):

    ``held``
        it held the lease and gave it back, its front end cannot tell how it used it: ``computed``
        (``took_over`` after an expired holder), as every lock before it knew more;
    ``stored``
        it ran what the lease guards and stored the result: ``computed`` (or ``took_over``) too, with
        the result stored and the hold counted as the compute time;
    ``served``
        what the lease guards was there once it held it (Prefect's cache): nothing computed, a ``hit``,
        or ``waited`` after a wait on another holder, spared that holder's hold when it saw it;
    ``failed``
        the work under it failed (``error``).

    It yields the call's last events; the lease itself is given back by whoever kept it.
    """
    emitter, waiting, lease = kept.emitter, kept.waiting, kept.acquired.lease
    report: dict[str, Any] = {
        "waited_seconds": kept.waited,
        "waited_on": waiting.holder,
        "token": lease.token,
    }
    if ending == "failed":
        failure = error or "failed"
        yield from _tell(emitter, events.WorkFailed, token=lease.token, error=failure, counted=False)
        ending_of: dict[str, Any] = {**report, "outcome": "failed", "error": failure}
        yield from _finished(emitter, ending_of, kept.started, kept.clock, waiting)
        return
    if ending == "served":
        waited = waiting.started is not None
        producer = waiting.holder if waited else None
        yield from _tell(
            emitter,
            events.ArtifactFound,
            producer=producer or "",
            token=lease.token,
            size=0,
            waited=waited,
            stored_at=lease.record.acquired_at,  # the holder's result was there when the lease was granted
            compute_seconds=kept.spared if waited else None,
            at=kept.granted_at,
        )
        outcome = "waited" if waited else "hit"
        report["producer"] = producer
    else:
        took_over = kept.acquired.took_over_from
        if ending == "stored":
            yield from _tell(
                emitter,
                events.ArtifactStored,
                token=lease.token,
                size=0,  # stored by the front end (Prefect's result), not through dibs
                compute_seconds=kept.clock() - kept.granted,
            )
        outcome = "computed" if took_over is None else "took_over"
        report.update(producer=lease.owner, took_over_from=took_over, stored=ending == "stored")
    if emitter.wants_routine(events.Finished):
        yield from _finished(emitter, {**report, "outcome": outcome}, kept.started, kept.clock, waiting)


# -- release as the owner ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Released:
    """What :func:`release_own` found: ``released`` (the owner's lease, now given back), ``free``
    (nobody held the key) or ``other`` (``holder`` holds it, not the owner)."""

    outcome: Literal["released", "free", "other"]
    holder: str | None = None


def release_own(
    key: Key, owns: Callable[[str], bool], *, ttl: float, error: str | None = None
) -> Flow[Released]:
    """Give back the live lease on ``key`` of an owner ``owns`` recognises, from a process that does
    not have its lease in hand: re-entering it as its exact owner returns the current lease (and its
    token) atomically, so the release is fenced like any other; ``error`` is recorded."""
    state: KeyState = yield Read(key)
    live = state.live_lease
    if live is None:
        return Released("free")
    if not owns(live.owner):
        return Released("other", live.owner)
    got = yield Ask(key, AcquireRequest(live.owner, ttl))
    if isinstance(got, Acquired):
        yield Release(got.lease, error)
        return Released("released", live.owner)
    if isinstance(got, Held):
        return Released("other", got.lease.owner)
    return Released("free")


# -- waiting ----------------------------------------------------------------------------------------
class _Waiter:
    """How one call waits: its backoff, how long it rides out a store outage, and what it tells.

    ``narrate``: a compute-once call's wait reports holder changes (and, with ``progress_every``, that
    it still waits); every wait reports an outage. :attr:`seen` is the last lease it found.
    """

    def __init__(
        self,
        emitter: Teller,
        rules: Rules,
        *,
        clock: Callable[[], float] = time.monotonic,
        narrate: bool,
        progress_every: float | None = None,
    ) -> None:
        self.emitter, self.rules, self.clock = emitter, rules, clock
        self.narrate, self.progress_every = narrate, progress_every
        self.seen: LeaseRecord | None = None

    def tell(self, kind: type[Event], **fields: Any) -> Generator[Event, Any, None]:
        emitter = self.emitter
        if emitter is not None and emitter.wants(kind):
            yield emitter.make(kind, **fields)

    def asking(self, step: Ask | Read, deadline: Deadline) -> Flow[Any]:
        """Yield ``step`` until the store answers it, riding out an outage (:class:`Outage`): a store
        that cannot be reached is asked again after growing pauses, for at most the outage patience
        and never past ``deadline``; then its error goes through."""
        riding = None
        while True:
            try:
                answer = yield step
            except StoreUnavailable as exc:
                if riding is None:
                    riding = self.rules.outage.riding(deadline)
                    yield from self.tell(
                        events.StoreUnreachable, error=str(exc), patience=self.rules.outage.patience
                    )
                pause = riding.pause()
                if pause is None:
                    raise
                yield Pause(pause)  # a change the hub delivers meanwhile is read again by this step
                continue
            if riding is not None:
                yield from self.tell(events.StoreReachable, seconds=riding.seconds)
            return answer

    def until_free(self, ask: Ask, busy: Held, deadline: Deadline) -> Flow[Any]:
        """Ask until the answer is not :class:`Held` or ``deadline`` passes; the last answer.

        A change the hub delivers is the key's state, read once for every waiter on it: an artifact
        ends the wait at once (the waiter does not ask), a lease still held by somebody else means
        waiting on, and only a key that turned free makes the waiter ask (one of them wins it). A
        pause that ends with nothing delivered is the backstop: the waiter asks itself, and never
        later than just after the holder's expiry, the one change no store announces.
        """
        following = yield Watch(ask.key)
        self.seen = busy.lease  # the first lease it waits on, seen even if the next answer is free (a
        # takeover of a lease that expired before the next look still says why)
        got = yield from self._until_free(ask, busy, deadline, following)
        yield UNWATCH
        return got

    def _until_free(
        self, ask: Ask, busy: Held, deadline: Deadline, following: Callable[[], bool]
    ) -> Flow[Any]:
        backoff, attempt = self.rules.backoff, 0
        holder = busy.lease.owner
        progress = _Progress(self, deadline)
        got: Any = yield from self.asking(ask, deadline)  # after the watch began: nothing is missed
        while True:
            if not isinstance(got, Held):
                return got
            self.seen = got.lease
            if got.lease.owner != holder:
                if self.narrate:
                    expires_in = max(0.0, got.lease.expires_at - got.now)
                    yield from self.tell(
                        events.HolderChanged, previous=holder, holder=got.lease.owner, expires_in=expires_in
                    )
                holder = got.lease.owner
            if deadline.expired:
                return got
            pause = _pause_for(backoff, attempt, following(), got.lease.expires_at - got.now, deadline)
            change: KeyState | None = yield Pause(progress.cap(pause))
            attempt += 1
            yield from progress.note(holder)
            if change is None:
                got = yield from self.asking(ask, deadline)  # the backstop, or the holder's expiry
                continue
            if change.artifact is not None and ask.takes(change):
                hit: Hit = yield Found(ask.key, change.artifact)  # every waiter gets the hub's one read
                return hit
            live = change.live_lease
            if live is not None and live.owner != ask.request.owner:
                got = Held(live, change.now, change.failure)  # changed hands, still busy: wait on
                continue
            got = yield from self.asking(ask, deadline)  # free (released, expired) or ours: try to take it

    def until_settled(
        self,
        state: KeyState,
        deadline: Deadline,
        for_artifact: bool,
        max_age: float | None,
        min_fence: int | None,
    ) -> Flow[KeyState]:
        """Read until the key is done (or also free, unless ``for_artifact``) or ``deadline`` passes."""
        following = yield Watch(state.key)
        backoff, attempt = self.rules.backoff, 0
        read = Read(state.key)
        while not is_settled(state, for_artifact, max_age, min_fence) and not deadline.expired:
            lease = state.live_lease
            holder_remaining = lease.expires_at - state.now if lease is not None else backoff.maximum
            if for_artifact and lease is None:
                holder_remaining = backoff.maximum  # nobody is computing: no expiry to watch for
            change = yield Pause(_pause_for(backoff, attempt, following(), holder_remaining, deadline))
            attempt += 1
            state = change if change is not None else (yield from self.asking(read, deadline))
        yield UNWATCH
        return state


class _Progress:
    """``StillWaiting`` every ``progress_every`` seconds of a wait (for a front end that asks for it)."""

    def __init__(self, waiter: _Waiter, deadline: Deadline) -> None:
        self.waiter, self.deadline = waiter, deadline
        every = waiter.progress_every if waiter.narrate else None
        self.every = every
        self.next = None if every is None else deadline.elapsed + every

    def cap(self, pause: float) -> float:
        """``pause``, ending no later than the next note is due."""
        if self.next is None:
            return pause
        return max(0.0, min(pause, self.next - self.deadline.elapsed))

    def note(self, holder: str) -> Generator[Event, Any, None]:
        if self.next is None or self.every is None:
            return
        elapsed = self.deadline.elapsed
        if elapsed >= self.next:
            self.next = elapsed + self.every
            yield from self.waiter.tell(events.StillWaiting, holder=holder, seconds=elapsed)


def _pause_for(
    backoff: Backoff, attempt: int, following: bool, holder_remaining: float, deadline: Deadline
) -> float:
    delay = backoff.delay(attempt, notifies=following)
    # Ask right after the holder's expiry: that moment changes the answer without any notification.
    delay = min(delay, max(0.0, holder_remaining) + backoff.initial)
    remaining = deadline.remaining
    return delay if remaining is None else min(delay, remaining)


# -- events -------------------------------------------------------------------------------------------
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


# -- a call, ready to drive -------------------------------------------------------------------------
class Driver(Protocol):
    """What carries a flow out (:class:`dibs.seam.StoreIO`, described here rather than imported, so
    that the flow stays below the seam that drives it)."""

    def drive(self, flow: Flow[Any], emitter: Teller = None) -> Any: ...


@dataclasses.dataclass(frozen=True)
class Call:
    """One compute-once call, ready to drive: its flow and the emitter of its events
    (:meth:`dibs.Reservations.call` builds one); a front end drives it with its own steps
    (a :class:`dibs.seam.StoreIO`, or with :meth:`adrive` an :class:`dibs.seam.AsyncStoreIO`)."""

    flow: Flow[RunReport]
    emitter: Emitter

    def drive(self, io: Driver) -> RunReport:
        report: RunReport = io.drive(self.flow, self.emitter)
        return report

    async def adrive(self, io: Driver) -> RunReport:
        report: RunReport = await io.drive(self.flow, self.emitter)
        return report

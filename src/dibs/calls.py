"""What one call of a client decides, written once for both faces of the client.

:class:`dibs.Reservations` and :class:`dibs.AsyncReservations` differ only in how they do their I/O
(in the caller's thread, or awaited with the store's part in the runtime's I/O executor). Everything
they decide lives here: the keyword options a call takes (one :class:`~typing.TypedDict` per kind of
call, so each signature is written once and type checkers still see every option), the ask a call
makes (the lease's terms, which artifact counts), the ask a waiter repeats, how the store's answer
becomes the caller's outcome (a refusal after too many failures included), when a wait is over, and
the one wording of a wait that timed out.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal, Protocol, Required, TypedDict

from dibs import events, holding
from dibs._waiting import AskAcquire, Loop, is_settled, read_until
from dibs.artifacts import ArtifactReader
from dibs.backoff import Deadline
from dibs.config import default_owner, validate_seconds
from dibs.errors import ConfigurationError, TooManyFailures, WaitTimeout
from dibs.events import Emitter, Event, Observer
from dibs.keys import Key
from dibs.lease import Lease, LeaseSource
from dibs.outcomes import Acquired, Busy, Hit, Outcome
from dibs.payloads import PayloadUnavailable, unread
from dibs.records import FailureRecord, Granted, Held, KeyState, Present, StoreOutcome
from dibs.settings import Settings, validate_timings
from dibs.stores import AcquireRequest, Store

if TYPE_CHECKING:
    from dibs.hub import Subscription

__all__ = [
    "AcquireOptions",
    "AcquireOrBusy",
    "AcquireRaising",
    "AskOptions",
    "CallOptions",
    "Source",
    "WaitFor",
    "WaitOptions",
]

log = logging.getLogger("dibs")


# -- the options of each kind of call ------------------------------------------------------------
class AskOptions(TypedDict, total=False):
    """The options of one ask (:meth:`dibs.Reservations.get_or_reserve`; ``acquire`` adds its own).

    ``ttl`` and ``max_lease_age`` override the client's for this lease; an artifact ``max_age`` old is
    a miss; ``refresh`` takes the lease even beside an artifact; ``min_token`` takes only an artifact
    stored under that token or a later one."""

    ttl: float | None
    max_lease_age: float | None
    max_age: float | None
    refresh: bool
    min_token: int | None


class AcquireOptions(AskOptions, total=False):
    """:meth:`dibs.Reservations.acquire`'s options: an ask's, how long to wait, and what a timeout does."""

    timeout: float | None
    raise_on_timeout: bool


class AcquireRaising(AskOptions, total=False):
    """:class:`AcquireOptions` that raise on a timeout (the default): the answer is never busy."""

    timeout: float | None
    raise_on_timeout: Literal[True]


class AcquireOrBusy(AskOptions, total=False):
    """:class:`AcquireOptions` with ``raise_on_timeout=False``: a timeout answers the last busy."""

    timeout: float | None
    raise_on_timeout: Required[Literal[False]]


class WaitOptions(TypedDict, total=False):
    """:meth:`dibs.Reservations.wait`'s options (see there). ``decode=False`` waits for the record
    only: the hit's ``value`` is the stored artifact itself, never decoded, and a payload in a payload
    store is only checked to be there with its recorded size, never opened (what Airflow's triggerer
    waits for: the resumed task reads the value)."""

    timeout: float | None
    for_artifact: bool
    max_age: float | None
    min_token: int | None
    decode: bool


class CallOptions(TypedDict, total=False):
    """The options of a compute-once call (:meth:`dibs.Reservations.compute`, ``call``)."""

    owner: str | None
    timeout: float | None
    max_age: float | None
    refresh: bool
    observer: Observer | None


def checked(call: str, options: Mapping[str, object], kind: type[Mapping[str, object]]) -> None:
    """Refuse an option ``call`` does not take, as Python refuses an unknown keyword argument (the
    options arrive as ``**options``, which would otherwise take any name and ignore a misspelt one)."""
    if not options:  # the usual call: nothing to check
        return
    known = _KNOWN.get(kind)
    if known is None:
        known = _KNOWN[kind] = getattr(kind, "__optional_keys__", frozenset()) | getattr(
            kind, "__required_keys__", frozenset()
        )
    for name in options:
        if name not in known:
            raise TypeError(f"{call}() got an unexpected keyword argument {name!r}")


#: The option names of each kind of call, read once (``checked`` runs twice in every ``run``).
_KNOWN: dict[type[Mapping[str, object]], frozenset[str]] = {}


# -- the ask --------------------------------------------------------------------------------------
class Source(LeaseSource, Protocol):
    """What the decisions read of a client: its store, serializer and settings (what its leases need)
    and the reader of its artifacts."""

    @property
    def artifacts(self) -> ArtifactReader: ...


def terms(settings: Settings, ttl: float | None, max_lease_age: float | None) -> tuple[float, float | None]:
    """The ttl and maximum age of one lease: the call's, else the client's; checked together."""
    if ttl is None and max_lease_age is None:  # the client's own, checked together when it was made
        return settings.ttl, settings.max_lease_age
    ttl = settings.ttl if ttl is None else ttl
    max_lease_age = settings.max_lease_age if max_lease_age is None else max_lease_age
    checked_ttl, _, checked_age = validate_timings(ttl=ttl, max_lease_age=max_lease_age)
    assert checked_ttl is not None
    return checked_ttl, checked_age


def max_age_of(settings: Settings, max_age: float | None) -> float | None:
    """The call's maximum artifact age, else the client's; checked."""
    if max_age is None:
        return settings.max_age
    return validate_seconds("max_age", max_age, allow_none=True)


def ask_of(settings: Settings, key: Key, owner: str | None, options: AskOptions) -> AskAcquire:
    """One ask: the lease's terms, and which artifact counts (a refresh takes none that exists)."""
    max_age = 0.0 if options.get("refresh", False) else max_age_of(settings, options.get("max_age"))
    min_token = options.get("min_token")
    if min_token is not None and (isinstance(min_token, bool) or not isinstance(min_token, int)):
        raise ConfigurationError(f"min_token must be a lease's token (an int), got {min_token!r}")
    ttl, max_lease_age = terms(settings, options.get("ttl"), options.get("max_lease_age"))
    return AskAcquire(key, AcquireRequest(owner or default_owner(), ttl, max_lease_age, max_age, min_token))


def ask_again(
    settings: Settings, first: AskAcquire, answer: StoreOutcome, max_age: float | None
) -> AskAcquire:
    """The ask a waiter repeats. After a refresh found the key busy, the artifact the busy lease
    stores (or a later one) is the fresh one: concurrent refreshes compute once, and share it."""
    if first.refreshing and isinstance(answer, Held):
        return first.sharing(answer.lease.token.fence, max_age_of(settings, max_age))
    return first


def ask_store(store: Store, ask: AskAcquire) -> StoreOutcome:
    """One ask of the store (both faces: the async one runs it in the I/O executor)."""
    return store.acquire(ask.key, ask.request)


# -- the answer -----------------------------------------------------------------------------------
def refused(settings: Settings, outcome: StoreOutcome) -> FailureRecord | None:
    """The failure record that makes ``max_failures`` refuse a granted lease, if it does."""
    if isinstance(outcome, Granted) and settings.max_failures is not None:
        failure = outcome.failure
        if failure is not None and failure.count >= settings.max_failures:
            return failure
    return None


def to_outcome(client: Source, key: Key, outcome: StoreOutcome) -> Outcome:
    """The store's answer as the caller's outcome: a hit's value decoded, a granted lease held (or
    released again and refused after too many failures), a busy key described."""
    if isinstance(outcome, Present):
        return client.artifacts.hit(key, outcome.artifact)
    if isinstance(outcome, Granted):
        lease = Lease(client, outcome.lease)
        failure = refused(client.settings, outcome)
        if failure is not None:
            lease.release()  # not a new failure: we refuse to run, we did not fail
            raise _too_many(lease.key, failure, client.settings.max_failures)
        return Acquired(lease, outcome.took_over_from, outcome.failure)
    return Busy.of(outcome.lease, outcome.now, outcome.failure)


def _too_many(key: Key, failure: FailureRecord, limit: int | None) -> TooManyFailures:
    """The refusal of a key that failed ``limit`` times: whose failure it was, and how to try again."""
    forget = f"dibs forget {key.name!r} --namespace {key.namespace}"
    why = f"{key} failed {failure.count} times (max_failures={limit}); last error from {failure.owner!r}"
    return TooManyFailures(
        f"{why}: {failure.error}. Fix the cause, then run '{forget}' to try again",
        key=str(key),
        failures=failure.count,
    )


def acquired(result: Outcome, deadline: Deadline, options: AcquireOptions) -> Hit | Acquired | Busy:
    """An acquire's answer: a busy key once the wait is over raises, unless told to answer it."""
    if isinstance(result, Busy) and options.get("raise_on_timeout", True):
        raise gave_up(result.key, deadline, busy=result)
    return result


@dataclasses.dataclass(frozen=True)
class WaitFor:
    """What one :meth:`dibs.Reservations.wait` waits for, read from its options once: until the key is
    done or (unless ``for_artifact``) nobody holds it, an artifact counting only if it is fresh."""

    key: Key
    deadline: Deadline
    for_artifact: bool = False
    max_age: float | None = None
    min_token: int | None = None
    #: ``False``: the artifact's record ends the wait, undecoded, its payload never opened.
    decode: bool = True

    @classmethod
    def of(cls, settings: Settings, key: Key, options: WaitOptions) -> WaitFor:
        decode = options.get("decode", True)
        if not isinstance(decode, bool):  # decode=None would otherwise quietly mean record-only
            raise ConfigurationError(f"decode must be True or False, got {decode!r}")
        return cls(
            key,
            Deadline(options.get("timeout")),
            options.get("for_artifact", False),
            max_age_of(settings, options.get("max_age")),
            options.get("min_token"),
            decode,
        )

    def through(self, store: Store) -> Store:
        """The store this wait reads through: a record-only wait reads a payload-referencing store's
        unread twin (:func:`dibs.payloads.unread`), which only asks the payload store whether the
        payload is there whole. It is one store per process, a view of the same records: it shares
        their watch hub (:mod:`dibs.hub`), so a record-only waiter costs no connection of its own."""
        return store if self.decode else unread(store, "size")

    def settles(self, state: KeyState) -> bool:
        """Whether ``state`` ends the wait."""
        return is_settled(state, self.for_artifact, self.max_age, self.min_token)

    def loop(self, settings: Settings, subscription: Subscription) -> Loop[KeyState]:
        """The waiting loop, woken by ``subscription``; each face runs it with its own I/O
        (:func:`dibs._waiting.drive` or ``adrive``)."""
        return read_until(
            self.key,
            self.deadline,
            settings.backoff,
            subscription.is_following,
            for_artifact=self.for_artifact,
            max_age=self.max_age,
            min_fence=self.min_token,
        )

    def first_read(self, store: Store) -> KeyState:
        """The wait's first read of its key, through ``store`` (:meth:`through`): as the watch hub reads
        for waiters, so a finished key's payload is read and checked once (a bad one is a miss), and
        every later decode takes those bytes."""
        found = store.read_many([self.key])
        return found[0] if found else store.read(self.key)  # an unreadable record: its error

    def ended(self, artifacts: ArtifactReader, state: KeyState) -> Hit | None:
        """The wait's answer from the last state it read: the artifact's hit (its value decoded, or
        the record itself when not ``decode``), ``None`` for a free key, or
        :class:`~dibs.errors.WaitTimeout`.

        A payload that turns out bad as it is decoded (it went bad since it was checked) is the miss a
        read would have found: a free key, or, when the wait wants an artifact and has time left,
        :class:`~dibs.payloads.PayloadUnavailable`, and its caller waits on (:meth:`first_read` finds
        it bad and leaves it out)."""
        artifact = state.artifact
        if artifact is not None and artifact.is_fresh(
            state.now, max_age=self.max_age, min_fence=self.min_token
        ):
            if not self.decode:
                return Hit.of(state.key, artifact, artifact)  # the record itself, undecoded
            try:
                return artifacts.hit(state.key, artifact)
            except PayloadUnavailable as exc:
                log.warning("%s: its artifact is treated as missing, as it went bad: %s", state.key, exc)
                if self.for_artifact and not self.deadline.expired:
                    raise
                state = dataclasses.replace(state, artifact=None)
        if state.live_lease is not None or self.for_artifact:
            raise gave_up(state.key, self.deadline, state=state)
        return None


def gave_up(
    key: Key, deadline: Deadline, *, busy: Busy | None = None, state: KeyState | None = None
) -> WaitTimeout:
    """The one wording of every wait that timed out: who holds the key, or why nobody does."""
    if busy is None and state is not None and state.live_lease is not None:
        busy = Busy.of(state.live_lease, state.now, state.failure)
    if busy is not None:
        return busy.timed_out(deadline.elapsed)
    if state is not None and state.failure is not None:
        failure = state.failure
        why = (
            f"not computed: its last attempt failed ({failure.count} failure(s); last by {failure.owner!r}: "
            f"{failure.error})"
            if not holding.is_stop(failure.error)
            else f"not computed: its last holder, {failure.owner!r}, was {failure.error}"
        )
    else:
        why = "not computed yet, and nobody is computing it"
    return WaitTimeout(
        f"gave up waiting for {key} after {deadline.elapsed:.1f}s: {why}", key=str(key), holder=None
    )


# -- the hold -------------------------------------------------------------------------------------
def held_for(
    got: Acquired | Lease | holding.HeldLease,
    failure_of: holding.FailureOf | None,
    logger: holding.Logger | None,
    emit: Emitter | None,
) -> holding.HeldLease:
    """The lease a hold keeps: the one given, or one that starts heartbeating now."""
    if isinstance(got, holding.HeldLease):
        return got
    lease = got.lease if isinstance(got, Acquired) else got
    took_over_from = got.took_over_from if isinstance(got, Acquired) else None
    return holding.HeldLease(
        lease, took_over_from=took_over_from, failure_of=failure_of, logger=logger or log, emit=emit
    )


#: The kinds the log observer wants, by which of INFO, WARNING and ERROR the ``dibs`` logger writes.
_LOGGED: dict[tuple[bool, bool, bool], frozenset[type[Event]]] = {}


class _LogEvents:
    """The Python front end's log lines: the ``dibs`` logger's words for a few of the flow's events
    (only these are built when nobody else listens)."""

    #: Only a failed call's ending and a takeover are logged: a call that succeeds, or that takes a
    #: free key, builds neither event for this observer (see :class:`~dibs.events.Emitter`).
    ignores_routine = frozenset({events.Finished, events.LeaseAcquired})

    @property
    def kinds(self) -> frozenset[type[Event]]:
        """The events whose log lines the ``dibs`` logger would write at its level now: the others
        are not even built for it (a hit's ArtifactFound is logged at INFO, which is usually off)."""
        levels = (
            log.isEnabledFor(logging.INFO),
            log.isEnabledFor(logging.WARNING),
            log.isEnabledFor(logging.ERROR),
        )
        kinds = _LOGGED.get(levels)
        if kinds is None:
            chosen = [(events.ArtifactFound, levels[0]), (events.LeaseAcquired, levels[1])]
            chosen += [(events.RanUnreserved, levels[1]), (events.Finished, levels[2])]
            kinds = _LOGGED[levels] = frozenset(kind for kind, logged in chosen if logged)
        return kinds

    def __call__(self, event: Event) -> None:
        if isinstance(event, events.ArtifactFound):
            log.info("%s: using the artifact stored by %s (token %s)", event.key, event.producer, event.token)
        elif isinstance(event, events.LeaseAcquired) and event.took_over_from:
            log.warning(
                "%s: took over the expired lease of %s (token %s)",
                event.key,
                event.took_over_from,
                event.token,
            )
        elif isinstance(event, events.RanUnreserved):
            log.warning(
                "store unavailable for %s, running unreserved (policy 'run'): %s", event.key, event.error
            )
        elif (
            isinstance(event, events.Finished)
            and event.error_type == "StoreUnavailable"
            and event.token is None
        ):
            log.error("store unavailable for %s, not running it (policy 'fail'): %s", event.key, event.error)


#: The Python front end's translation of the flow's events (both faces of the client).
log_event = _LogEvents()

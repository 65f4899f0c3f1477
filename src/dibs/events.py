"""What happened, step by step, in every compute-once call: typed events, and the observers that hear them.

Every front end (``Reservations.run``/``compute`` and their async twins, the Airflow operators,
prefect_dibs, ``dibs run``) drives the one flow of :mod:`dibs.flow`, and that flow reports each step
as an event. Log lines, XComs, Prefect states, CLI progress, and later metrics, traces and UI pages
are *observers* of these events, never code threaded through each front end.

One call's events, in order (``*``: only when it happens)::

    Asked → KeyBusy* → [HolderChanged | StillWaiting]* → Waited* → ArtifactFound → Finished(hit | waited)
    Asked → [KeyBusy … Waited]* → LeaseAcquired → HeartbeatFailed* → LostLease*
          → ArtifactStored | NotStored → Finished(computed | took_over)
          → WorkFailed → LeaseReleased* → Finished(failed)
    Asked → RanUnreserved → Finished(unreserved)            (store unreachable, policy "run")
    … → StoreUnreachable → StoreReachable → …               (a waiter rode out a store outage)
    Asked → … → Finished(failed)                            (timeout, store down with "fail", …)
    Asked → KeyBusy → Deferred                              (an Airflow deferral: resumed elsewhere)

A waiter whose store cannot be reached keeps waiting (:class:`dibs.Outage`): ``StoreUnreachable``
when an outage begins, ``StoreReachable`` when the store answers again (a wait that gives up first
ends as it does today, ``Waited(unavailable)``). ``get_or_reserve``, ``acquire`` and ``wait`` report
these two as well, and nothing else.

While the lease is held, each heartbeat reports ``HeartbeatSent`` (how late it ran). Below every
call, each store operation reports a ``StoreOperation`` (its duration, and its error's type) to the
process's observers (:func:`observe`) that ask for it in their ``kinds`` (a store does not know which
client called it, and these are not steps of any call): ``kinds = dibs.events.EVERY_KIND``. A store
operation made on behalf of a call names that call's front end, all the same: the flow's drivers
(:mod:`dibs.flow`) set :data:`FRONTEND` while they drive a call, and a lease's own operations (its
heartbeats, complete, release) name the front end of the call that made the lease.

Every event carries the key, the owner that asked, the front end, the kind of store, the number of
its call (the same for every event of one compute-once call, so a tracer can group them into one
span) and the wall clock time it happened. Durations are measured on the caller's monotonic clock.

Observers::

    def count(event: dibs.Event) -> None:
        ...

    with dibs.observe(count):           # every call of this process
        ...
    client.observe(count)               # only this client's calls

An observer runs synchronously in the thread (or on the event loop) where the step happened (heartbeat
failures come from the heartbeat thread), so it must be quick and must not block: hand the event to a
queue if it needs I/O. An observer that raises is logged once (with its traceback) and otherwise
ignored: an observer never changes a result. With nobody listening an event costs one check.
"""

from __future__ import annotations

import contextvars
import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Literal, Self, TypeVar

from dibs.keys import Key

__all__ = [
    "EVERY_KIND",
    "ArtifactFound",
    "Asked",
    "Deferred",
    "Emitter",
    "Event",
    "Finished",
    "HeartbeatFailed",
    "HeartbeatSent",
    "HolderChanged",
    "KeyBusy",
    "LazyEmitter",
    "LeaseAcquired",
    "LeaseReleased",
    "LostLease",
    "NotStored",
    "Observation",
    "Observer",
    "Observers",
    "RanUnreserved",
    "StillWaiting",
    "StoreOperation",
    "StoreReachable",
    "StoreUnreachable",
    "Waited",
    "WorkFailed",
    "observe",
    "observe_once",
]

log = logging.getLogger("dibs")

#: How a compute-once call ended, as :class:`Finished` says (and a metric would count it).
Ending = Literal["computed", "took_over", "waited", "hit", "unreserved", "failed"]

#: Which front end drove the flow.
Frontend = Literal["python", "airflow", "prefect", "cli"]

#: The front end of the compute-once call this code runs for (``""``: none), which the store
#: operations it makes report (:class:`StoreOperation`). A context variable, not a thread-local: each
#: ``asyncio`` task has its own, a hop to another thread that copies the context (``asyncio.to_thread``)
#: keeps it, and the runtime's I/O executor's jobs carry it (:func:`for_this_call`). Read only when an
#: observer asked for store operations.
FRONTEND: contextvars.ContextVar[str] = contextvars.ContextVar("dibs_frontend", default="")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Event:
    """One step of one compute-once call. Subclasses add what that step knows."""

    key: Key
    owner: str
    frontend: str
    #: The compute-once call this step belongs to: one number per call in this process.
    call: int
    #: The kind of store (its URL's scheme: ``sqlite``, ``postgresql``, ``redis``, ``azure``, ...).
    store: str = ""
    #: Wall-clock time (``time.time()``) when it happened.
    at: float = dataclasses.field(default_factory=time.time)

    @property
    def name(self) -> str:
        """``asked``, ``key_busy``, ``lease_acquired``, …: the event's type in snake case."""
        return _snake(type(self).__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Asked(Event):
    """The call asked the store for the key (``refresh``: even beside an artifact)."""

    refresh: bool = False
    min_token: int | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class _FailuresSoFar:
    #: The key's last recorded failure (``failures`` of them so far), and whose it was.
    last_failure: str | None = None
    last_failure_owner: str | None = None
    failures: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class KeyBusy(_FailuresSoFar, Event):
    """Someone else holds a live lease: the call waits (or defers) on ``holder``."""

    holder: str
    expires_in: float
    #: How long the holder has held it (store clock), and its lease attempt on this key.
    held_for: float
    attempt: int
    token: int | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class HolderChanged(Event):
    """While the call waited, the key passed from ``previous`` to ``holder``."""

    previous: str
    holder: str
    expires_in: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class StillWaiting(Event):
    """The call has waited ``seconds`` on ``holder`` so far and waits on (only for a front end that
    asks to hear it, every so often: prefect_dibs's ``progress_interval``)."""

    holder: str
    seconds: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class Waited(Event):
    """The wait ended after ``seconds`` (across deferrals): with the artifact (``hit``), the lease
    (``acquired``), a ``timeout``, or the store ``unavailable``."""

    seconds: float
    outcome: Literal["hit", "acquired", "timeout", "unavailable"]
    holder: str | None
    deferrals: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class ArtifactFound(Event):
    """The key's artifact answers the call (``waited``: it appeared while the call waited)."""

    producer: str
    token: int
    size: int
    waited: bool = False
    #: When the artifact was stored (the store's clock): a waiter's hand-off runs from there.
    stored_at: float = 0.0
    #: How long its producer computed it (``None``: not recorded): what this call was spared.
    compute_seconds: float | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class LeaseAcquired(_FailuresSoFar, Event):
    """The call holds the lease and runs the work (``took_over_from``: an expired holder's)."""

    token: int
    attempt: int
    #: When the lease was granted, on the store's clock.
    acquired_at: float
    took_over_from: str | None = None
    #: Why the lease taken over had expired, as far as this call saw it while waiting: its holder
    #: stopped ``heartbeating``, or it reached its ``max_lease_age`` (``None``: not seen, or no takeover).
    expired_by: Literal["heartbeating", "max_lease_age"] | None = None
    #: The maximum age of the lease taken over, when ``expired_by`` is ``max_lease_age`` (seconds).
    expired_max_age: float | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class HeartbeatFailed(Event):
    """A heartbeat could not reach the store; it is retried until the lease would have expired."""

    token: int
    error: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class LostLease(Event):
    """The lease is no longer this call's (taken over, or the store unreachable, or answering its
    heartbeats with an error, for a whole ttl)."""

    token: int
    error: str
    #: ``taken_over``, ``completed``, ``max_lease_age``, ``released``, ``rolled_back``,
    #: ``unreachable`` or ``heartbeat_failed``.
    reason: str = "unknown"


@dataclasses.dataclass(frozen=True, kw_only=True)
class HeartbeatSent(Event):
    """A heartbeat extended the lease, ``lateness`` seconds after it was due (its interval after
    the last one): a busy process or a slow store shows here before a lease is ever lost."""

    token: int
    lateness: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class StoreUnreachable(Event):
    """A waiter's store cannot be reached: it keeps waiting (holding nothing, it has nothing at stake),
    for at most ``patience`` seconds of this outage (``None``: as long as its own timeout allows)."""

    error: str
    patience: float | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class StoreReachable(Event):
    """The store answers the waiter again, after ``seconds`` of outage."""

    seconds: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class Deferred(Event):
    """The call gave up its thread while waiting (an Airflow deferral); it resumes as a new call."""

    waited_seconds: float
    holder: str | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class StoreOperation(Event):
    """One store operation (``acquire``, ``heartbeat``, ``complete``, ``release``, ``read``, …) took
    ``seconds``; ``error_type`` names what it raised (``StoreUnavailable``, ``LeaseLost``, …).

    ``frontend`` is the front end of the call the operation was made for (:data:`FRONTEND`; a lease's
    heartbeats, complete and release: the call that made the lease), and empty for what serves many
    calls at once (the watch hub's reads, the batched reads of async waiters) or none (an operation
    outside any compute-once call). ``owner`` and ``call`` are empty: a store serves every call of
    the process."""

    operation: str
    seconds: float
    error_type: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ArtifactStored(Event):
    """The work's value is the key's artifact now."""

    token: int
    size: int
    compute_seconds: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class NotStored(Event):
    """The work's value is returned to this call only: it could not be ``serialized``, the lease was
    ``fenced`` out, or the store was ``unavailable`` (policy ``run``; with ``fail`` the call fails)."""

    token: int
    reason: Literal["serialization", "fenced", "unavailable"]
    error: str
    compute_seconds: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkFailed(Event):
    """The work raised; ``counted`` (towards ``max_failures``) is false for a stop and for what the
    caller says is no failure (Airflow's skip)."""

    token: int
    error: str
    counted: bool = True


@dataclasses.dataclass(frozen=True, kw_only=True)
class LeaseReleased(Event):
    """The lease ended without an artifact (``error``: what was recorded), so a waiter takes over."""

    token: int
    error: str | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class RanUnreserved(Event):
    """The store could not be reached and the policy said to run the work without a lease."""

    error: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Finished(Event):
    """The call ended: how (``outcome``), after how long, and the report it returned (``None``
    when it failed: then ``error`` says why)."""

    outcome: Ending
    seconds: float
    waited_seconds: float = 0.0
    deferrals: int = 0
    token: int | None = None
    producer: str | None = None
    waited_on: str | None = None
    took_over_from: str | None = None
    stored: bool = False
    error: str | None = None
    #: The exception's type when it failed (``StoreUnavailable``, ``WaitTimeout``, ``KeyError``, …).
    error_type: str | None = None


Observer = Callable[[Event], object]

#: Every kind of event: the ``kinds`` of an observer that also wants :class:`StoreOperation`.
EVERY_KIND: frozenset[type[Event]] = frozenset(
    {
        Asked,
        KeyBusy,
        HolderChanged,
        StillWaiting,
        Waited,
        ArtifactFound,
        LeaseAcquired,
        HeartbeatFailed,
        HeartbeatSent,
        LostLease,
        ArtifactStored,
        NotStored,
        WorkFailed,
        LeaseReleased,
        RanUnreserved,
        StoreUnreachable,
        StoreReachable,
        Deferred,
        Finished,
        StoreOperation,
    }
)

_E = TypeVar("_E", bound=Event)

#: Per kind of event: its fields' defaults, its field names, and the fields it cannot do without.
_SHAPES: dict[type[Event], tuple[dict[str, Any], frozenset[str], frozenset[str]]] = {}
_new = object.__new__


def _shape(kind: type[Event]) -> tuple[dict[str, Any], frozenset[str], frozenset[str]]:
    shape = _SHAPES.get(kind)
    if shape is None:
        fields = dataclasses.fields(kind)
        missing = dataclasses.MISSING
        defaults = {f.name: f.default for f in fields if f.default is not missing}
        names = frozenset(f.name for f in fields)
        required = frozenset(f.name for f in fields if f.default is missing and f.default_factory is missing)
        shape = _SHAPES[kind] = (defaults, names, required)
    return shape


def build(kind: type[_E], fields: dict[str, Any]) -> _E:
    """``kind(**fields)``, in a fraction of its time: an event is built on the caller's path for every
    step of every observed call, and a frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__`` (about 5 µs for a ``LeaseAcquired``; a call makes about six events). The
    event is the same (its fields, equality, hash, repr, pickling); fields it does not have, or
    lacks, go to the dataclass's own ``__init__``, which says what is wrong."""
    defaults, names, required = _SHAPES.get(kind) or _shape(kind)
    given = fields.keys()
    if not (given <= names and required <= given):
        return kind(**fields)
    event: _E = _new(kind)
    values = event.__dict__
    values.update(defaults)
    values["at"] = time.time()  # its one default factory (a given ``at`` replaces it below)
    values.update(fields)
    return event


class Observation:
    """A registered observer: ``close()`` (or leaving the ``with`` block) stops it."""

    def __init__(self, observers: Observers, observer: Observer) -> None:
        self._observers, self.observer = observers, observer
        self._closed = False

    def close(self) -> None:
        # Once: closed again, it must not remove an equal observer registered since (a bound method
        # such as ``heard.append`` equals every other one of the same list). Checked and removed under
        # the observers' lock: two threads closing it at once remove it once.
        with self._observers._lock:
            if not self._closed:
                self._closed = True
                self._observers._discard(self.observer)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class Observers:
    """A set of observers that any thread may change while others emit.

    Emitting reads tuples that are replaced, never changed, so it takes no lock. ``operations`` holds
    the observers that asked for :class:`StoreOperation` (see the module docstring). An observer that
    names the kinds it wants (a ``kinds`` attribute, read when it is added) hears only those, and an
    event that none of them wants is not built: ``kinds`` is the union (``None``: some observer wants
    every kind).
    """

    def __init__(self) -> None:
        self._all: tuple[Observer, ...] = ()
        #: Each observer with the kinds it wants (``None``: every kind).
        self.wanting: tuple[tuple[Observer, frozenset[type[Event]] | None], ...] = ()
        self.kinds: frozenset[type[Event]] | None = frozenset()
        self.operations: tuple[Observer, ...] = ()
        self._lock = threading.Lock()

    def add(self, observer: Observer) -> Observation:
        if not callable(observer):
            raise TypeError(f"an observer is a callable taking one dibs.Event, got {observer!r}")
        with self._lock:
            self._all = (*self._all, observer)
            self._sort()
        return Observation(self, observer)

    def remove(self, observer: Observer) -> None:
        with self._lock:
            self._discard(observer)

    def _discard(self, observer: Observer) -> None:
        """:meth:`remove`, under the lock."""
        if observer in self._all:
            index = self._all.index(observer)
            self._all = self._all[:index] + self._all[index + 1 :]
            self._sort()

    def _sort(self) -> None:
        wanting = []
        union: set[type[Event]] | None = set()
        for observer in self._all:
            asked = getattr(observer, "kinds", None)
            wanted = None if asked is None else frozenset(asked)
            wanting.append((observer, wanted))
            if wanted is None or union is None:
                union = None
            else:
                union |= wanted
        self.wanting = tuple(wanting)
        self.kinds = None if union is None else frozenset(union)
        self.operations = tuple(
            observer for observer, wanted in wanting if wanted and StoreOperation in wanted
        )

    def __bool__(self) -> bool:
        return bool(self._all)

    def __iter__(self) -> Any:
        return iter(self._all)


#: Observers of every call in this process.
PROCESS = Observers()

_T = TypeVar("_T")


def for_this_call(job: Callable[[], _T]) -> Callable[[], _T]:
    """``job``, to run in another thread (the runtime's I/O executor) for the call this thread serves:
    its store operations name the same front end (:data:`FRONTEND`). Only that variable crosses, not
    the rest of the caller's context: a Prefect task's run context, seen in the executor, would make
    Prefect's own calls there think they run on an event loop. Unobserved, ``job`` itself."""
    if not PROCESS.operations:
        return job
    frontend = FRONTEND.get()
    if not frontend:
        return job

    def run() -> _T:
        acting = FRONTEND.set(frontend)
        try:
            return job()
        finally:
            FRONTEND.reset(acting)

    return run


def observe(observer: Observer) -> Observation:
    """Hear every event of every compute-once call of this process; ``close()`` the result to stop."""
    return PROCESS.add(observer)


_ONCE: dict[Callable[[], Observer], Observation] = {}
_ONCE_LOCK = threading.Lock()


class _InstalledOnce(Observation):
    """What :func:`observe_once` hands out: closing it also forgets it, so that the next
    :func:`observe_once` installs the observer again instead of returning this closed one."""

    def __init__(self, observers: Observers, observer: Observer, make: Callable[[], Observer]) -> None:
        super().__init__(observers, observer)
        self._make = make

    def close(self) -> None:
        with _ONCE_LOCK:  # with the removal: an observe_once meanwhile sees it either open or gone
            if _ONCE.get(self._make) is self:
                del _ONCE[self._make]
            super().close()


def observe_once(make: Callable[[], Observer]) -> Observation:
    """:func:`observe` with ``make()``, once per process however many times (and threads) ask: an
    integration's ``install()`` is called from every task, and its observer must hear each event once.
    Once the observation is closed, the next call installs a new ``make()``. Always under the lock
    (the call is rare and cheap): read without it, the observation found could be one another thread
    is closing, handed out closed."""
    with _ONCE_LOCK:
        observation = _ONCE.get(make)
        if observation is None:
            observer = make()
            PROCESS.add(observer)
            observation = _ONCE[make] = _InstalledOnce(PROCESS, observer, make)
    return observation


_CALLS = itertools.count(1)
_COMPLAINED: set[int] = set()
_COMPLAINED_LOCK = threading.Lock()


class Emitter:
    """The events of one call: fills in the fields every event shares and hands each event to the
    process's observers, the client's and the call's own (a front end's translator).

    A call's own observer may say which event types it wants (a ``kinds`` attribute, a set of
    types): an event nobody wants is never even built, which keeps a call that nobody watches cheap.
    It may also say which of those kinds it ignores when they are routine (an ``ignores_routine``
    attribute, a set of types): a :class:`Finished` of a call that succeeded, a :class:`LeaseAcquired`
    that took over nobody. The log observer logs neither, so a call that nobody else watches builds
    none of them for it (see :meth:`wants_routine`).
    """

    def __init__(
        self,
        key: Key,
        owner: str,
        frontend: str,
        groups: Iterable[Observers | Observer | None],
        *,
        store: str = "",
    ) -> None:
        self.key, self.owner, self.frontend, self.store = key, owner, frontend, store
        self.call = next(_CALLS)
        #: The fields every event of this call shares.
        self._common = {"key": key, "owner": owner, "frontend": frontend, "store": store, "call": self.call}
        self._sets: tuple[Observers, ...] = ()
        direct: list[tuple[Observer, frozenset[type[Event]] | None]] = []
        kinds: set[type[Event]] | None = set()
        routine: set[type[Event]] | None = set()  # the kinds somebody hears even when routine
        for group in groups:
            if group is None:
                continue
            if isinstance(group, Observers):
                self._sets += (group,)
                continue
            # Read once per call: a log observer's kinds depend on the logger's level, which is read
            # (and the set looked up) at every read of the attribute. So a level lowered while the
            # call runs applies from the next call on.
            asked = getattr(group, "kinds", None)
            wanted = None if asked is None else frozenset(asked)
            direct.append((group, wanted))
            if wanted is None or kinds is None:
                kinds = routine = None  # this one wants every event
            else:
                kinds.update(wanted)
                if routine is not None:
                    routine.update(wanted - frozenset(getattr(group, "ignores_routine", ())))
        self._direct = tuple(direct)
        self._kinds = kinds
        self._routine = routine

    @property
    def listening(self) -> bool:
        """Whether anybody hears any event of this call."""
        return bool(self._direct) or any(self._sets)

    def wants(self, kind: type[Event]) -> bool:
        """Whether anybody hears events of type ``kind``."""
        for group in self._sets:  # read at each event: a process observer may come or go meanwhile
            kinds = group.kinds
            if kinds is None or kind in kinds:
                return True
        return self._kinds is None or kind in self._kinds

    def wants_routine(self, kind: type[Event]) -> bool:
        """Whether anybody hears a routine event of type ``kind`` (see the class docstring): the
        :class:`Finished` of a call that succeeded, a :class:`LeaseAcquired` that took over nobody."""
        for group in self._sets:  # process observers hear routine events too
            kinds = group.kinds
            if kinds is None or kind in kinds:
                return True
        return self._routine is None or kind in self._routine

    def make(self, kind: type[_E], **fields: Any) -> _E:
        """An event of this call."""
        fields.update(self._common)
        return build(kind, fields)

    def __call__(self, kind: type[Event], **fields: Any) -> None:
        """Build and send an event, unless nobody wants it."""
        if self.wants(kind):
            self.send(self.make(kind, **fields))

    def send(self, event: Event) -> None:
        # Every observed event passes here on the caller's path: the delivery is inlined (_deliver).
        kind = type(event)
        for group in self._sets:
            for observer, wanted in group.wanting:
                if wanted is None or kind in wanted:
                    try:
                        observer(event)
                    except Exception:
                        _complain_once(observer, event)
        for observer, wanted in self._direct:
            if wanted is None or kind in wanted:
                try:
                    observer(event)
                except Exception:
                    _complain_once(observer, event)


class LazyEmitter:
    """An :class:`Emitter` built on first use: for the calls that rarely have anything to say (a
    ``wait`` or an ``acquire`` reports only a store outage), so that the usual call builds none."""

    __slots__ = ("_emitter", "_make")

    def __init__(self, make: Callable[[], Emitter]) -> None:
        self._make: Callable[[], Emitter] | None = make
        self._emitter: Emitter | None = None

    @property
    def emitter(self) -> Emitter:
        if self._emitter is None:
            assert self._make is not None
            self._emitter, self._make = self._make(), None
        return self._emitter

    @property
    def frontend(self) -> str:
        return self.emitter.frontend

    def wants(self, kind: type[Event]) -> bool:
        return self.emitter.wants(kind)

    def make(self, kind: type[_E], **fields: Any) -> _E:
        return self.emitter.make(kind, **fields)

    def send(self, event: Event) -> None:
        self.emitter.send(event)


def _deliver(observer: Observer, event: Event) -> None:
    try:
        observer(event)
    except Exception:
        _complain_once(observer, event)


def _complain_once(observer: Observer, event: Event) -> None:
    with _COMPLAINED_LOCK:
        if id(observer) in _COMPLAINED:
            return
        _COMPLAINED.add(id(observer))
    log.exception(
        "dibs: the observer %r raised on %s of %s; the call goes on (further errors of this observer "
        "are not logged)",
        observer,
        event.name,
        event.key,
    )


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() and i else c.lower() for i, c in enumerate(name))

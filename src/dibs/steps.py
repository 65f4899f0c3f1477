"""The steps of the compute-once flow: what :mod:`dibs.flow` asks its driver to do, and what each
step is answered with.

The flow decides and never does I/O; a driver (:class:`dibs.seam.StoreIO` in a thread,
:class:`dibs.seam.AsyncStoreIO` on an event loop, or a front end's subclass of one) carries each step
out and sends the answer back, or throws the step's error back in for the flow to decide on:

===================  ================================================================  ==================
step                 what the driver does                                              answer
===================  ================================================================  ==================
:class:`Ask`         the store's one-attempt ``acquire``; a hit's artifact is decoded  :class:`Hit`,
                     (:meth:`~dibs.seam.StoreIO.found`), a grant becomes a lease       :class:`Acquired`
                     handle                                                            or a store's
                                                                                       :class:`Held`
:class:`Read`        the store's ``read``                                              a ``KeyState``
:class:`Watch`       subscribe to the key's changes (the process's watch hub); the     ``following()``
                     subscription lasts until :data:`UNWATCH` or the flow's end
:class:`Pause`       wait up to ``seconds`` for the hub to deliver a change            a ``KeyState`` or
                                                                                       ``None``
:class:`Found`       decode an artifact the hub delivered                              :class:`Hit`
:class:`Wait`        a wait begins: nothing (the flow waits with the steps above), or  ``None``
                     defer it (raise :class:`Suspend`, resume later from ``waiting``)
:class:`Release`     end a lease granted to this call without an artifact              ``None``
:class:`Hold`        start keeping the lease: heartbeats, and the hold's scope         a ``HeldLease``
:class:`Work`        run the work under the held lease                                 its value
:class:`Fail`        the work raised: release with the failure recorded                ``None``
:class:`Complete`    the work returned: store its value (:mod:`dibs.holding` decides)  a ``RunReport``
:class:`Keep`        a lease that outlives the call (a lock): keep it heartbeating,    a ``RunReport``
                     with what the call's ending needs (:class:`Kept`), until it is
                     given back and :func:`dibs.flow.kept_ended` ends the call
:class:`RunUnreserved`  run the work without a lease                                   its value
===================  ================================================================  ==================

Events (:mod:`dibs.events`) are yielded between steps too: the driver hands them to the observers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from dibs.keys import Key
from dibs.records import ArtifactRecord, KeyState
from dibs.stores.requests import AcquireRequest

if TYPE_CHECKING:
    from dibs.events import Emitter
    from dibs.holding import HeldLease
    from dibs.lease import Lease
    from dibs.outcomes import Acquired, Busy

__all__ = [
    "UNWATCH",
    "Ask",
    "Complete",
    "Fail",
    "Found",
    "Hold",
    "Keep",
    "Kept",
    "Pause",
    "Read",
    "Release",
    "RunUnreserved",
    "Step",
    "Suspend",
    "Unwatch",
    "Wait",
    "Waiting",
    "Watch",
    "Work",
]


@dataclasses.dataclass(frozen=True, slots=True)
class Ask:
    """One atomic ``get_or_reserve`` of ``key`` on ``request``'s terms."""

    key: Key
    request: AcquireRequest

    @property
    def refreshing(self) -> bool:
        """Whether no artifact that exists counts (a refresh: ``max_age`` 0)."""
        return self.request.max_age == 0.0

    def takes(self, state: KeyState) -> bool:
        """Whether ``state``'s artifact (if any) answers this ask."""
        return state.artifact is not None and self.request.takes(state.artifact, state.now)

    def sharing(self, fence: int, max_age: float | None) -> Ask:
        """This ask after a refresh found the key busy under token ``fence``: the artifact that lease
        stores (or a later one, not ``max_age`` old) is the fresh one, so concurrent refreshes compute
        once, and share it."""
        return Ask(self.key, dataclasses.replace(self.request, max_age=max_age, min_fence=fence))

    def as_owner(self, owner: str) -> Ask:
        """This ask made by ``owner`` (re-entering the lease that owner holds)."""
        return Ask(self.key, dataclasses.replace(self.request, owner=owner))


@dataclasses.dataclass(frozen=True, slots=True)
class Read:
    """The key's state, read once."""

    key: Key


@dataclasses.dataclass(frozen=True, slots=True)
class Watch:
    """Follow the key's changes from now on (before the waiter's next own look, so nothing is missed)."""

    key: Key


@dataclasses.dataclass(frozen=True, slots=True)
class Unwatch:
    """Stop following the key (the wait is over)."""


#: The one :class:`Unwatch` step.
UNWATCH = Unwatch()


@dataclasses.dataclass(frozen=True, slots=True)
class Pause:
    """Wait up to ``seconds`` for a change the hub delivers (its state), else ``None``."""

    seconds: float


@dataclasses.dataclass(frozen=True, slots=True)
class Found:
    """The key's artifact arrived while waiting: decode it as a hit."""

    key: Key
    artifact: ArtifactRecord


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
    #: The wait elsewhere ended because the store stayed unreachable past the outage patience (its
    #: error): the resumed flow does not ask again, it decides as any waiter whose outage outlasted it.
    unreachable: str | None = None

    def seconds(self, now: float) -> float:
        return 0.0 if self.started is None else max(0.0, now - self.started)


@dataclasses.dataclass(frozen=True)
class Wait:
    """A wait on ``busy`` begins, for at most ``timeout`` seconds (``None``: no limit). A driver that
    gives up its thread instead (an Airflow deferral) raises :class:`Suspend` with ``waiting``, which
    already counts this wait, and a new flow resumes from it later."""

    ask: Ask
    busy: Busy
    waiting: Waiting
    timeout: float | None


class Suspend(Exception):
    """Raised by a :class:`Wait` handler that gives up its thread (an Airflow deferral): the drivers
    close the flow without deciding anything, and the caller resumes later from ``waiting``."""

    def __init__(self, waiting: Waiting) -> None:
        super().__init__(waiting)
        self.waiting = waiting


@dataclasses.dataclass(frozen=True, slots=True)
class Release:
    """End ``lease`` (granted to this call) without an artifact, recording ``error`` (``None``: not a
    failure, e.g. a lease the call refuses to use)."""

    lease: Lease
    error: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Hold:
    """Start keeping ``acquired``'s lease while the work runs."""

    acquired: Acquired


@dataclasses.dataclass(frozen=True, slots=True)
class Work:
    """Run the work while ``held`` is kept."""

    held: HeldLease


@dataclasses.dataclass(frozen=True, slots=True)
class Fail:
    """The work raised ``error``: end ``held`` with the failure recorded."""

    held: HeldLease
    error: BaseException


@dataclasses.dataclass(frozen=True, slots=True)
class Complete:
    """The work returned ``value``: store it under ``held``; a store that stays unreachable meanwhile is
    the call's ``policy`` (``"fail"`` raises, ``"run"`` returns the value unstored)."""

    held: HeldLease
    value: Any
    policy: Literal["fail", "run"]
    compute_seconds: float


@dataclasses.dataclass(frozen=True)
class Kept:
    """A compute-once call whose lease outlives it (a lock): it ends when the lease is given back, and
    :func:`dibs.flow.kept_ended` then says how, from what the holder did under it. This is what that
    ending needs: the call's events, its lease, and its times so far."""

    emitter: Emitter
    acquired: Acquired
    #: When the call started, and when its lease was granted, on ``clock`` (the call's own).
    started: float
    granted: float
    clock: Callable[[], float]
    #: The wall-clock time the lease was granted (a served call found its result then).
    granted_at: float
    waiting: Waiting
    waited: float
    #: How long the lease this call waited out was held (from its grant to this call's, store clock):
    #: the work its holder's result spares this call, if it serves it. ``None``: it waited on nobody.
    spared: float | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Keep:
    """Keep ``acquired``'s lease beyond this call (a lock, released by a later call); ``kept`` is what
    the call's ending needs, once the lease is given back."""

    acquired: Acquired
    kept: Kept


@dataclasses.dataclass(frozen=True, slots=True)
class RunUnreserved:
    """Run the work without a lease (the store is unreachable and the policy says run)."""

    key: Key


Step = (
    Ask
    | Read
    | Watch
    | Unwatch
    | Pause
    | Found
    | Wait
    | Release
    | Hold
    | Work
    | Fail
    | Complete
    | Keep
    | RunUnreserved
)

"""The work under a lease, decided once for every caller.

``Reservations.run``/``compute``, the Airflow operators, ``prefect_dibs`` and ``dibs run`` all hold a
lease through :meth:`dibs.Reservations.hold` (or its async twin), so they all treat the same events
the same way. The decisions live here; the sync and async ``hold`` only carry them out, and the
integrations only log and publish.

=================================  ===========================================================
event                              decision
=================================  ===========================================================
the work raises (anything, also    release the lease with the failure recorded, so a waiter
``KeyboardInterrupt``, a           takes over at once; re-raise. A stop (not an ``Exception``)
cancellation, ``SystemExit``)      is recorded as ``stopped: ...`` but not counted towards
                                   ``max_failures`` (:func:`is_stop`). A caller may say that an
                                   exception is no failure (Airflow's skip): released, not counted
releasing fails                    log it (the lease expires after its ttl); the work's own error
                                   is what the caller sees
the value cannot be serialized,    return it to this caller only (the reservation never changes a
is too large for the store, or     result), release the lease with the error recorded so waiters
its payload cannot be written      compute for themselves, and log an error saying what to change
``complete`` is refused (fenced)   the value is right for this caller: return it, not stored
the store stays unreachable at     the client's ``on_store_unavailable``: ``"fail"`` raises
``complete``                       :class:`~dibs.errors.StoreUnavailable`, ``"run"`` returns the
                                   value, not stored; either way it is logged
heartbeats lose the lease          logged when it happens; the work goes on (its value is still
                                   right), and ``complete`` is then refused as above
the lease is let go from outside   (a lock released, Airflow's ``on_kill``) the heartbeats stop,
the work                           then the lease is released with what happened recorded; the
                                   work's own ending afterwards releases nothing again
=================================  ===========================================================

Every lease held while something runs is held through one :class:`HeldLease`: the sync and async
``hold``, ``with lease:``, Airflow's ``on_kill``, ``DibsLockManager`` (whose hold spans two of
Prefect's calls) and ``dibs run``. Its heartbeats always stop before the lease ends, so a late
heartbeat never reports a false "lease lost", and a lease ends once, whoever ends it first.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Literal, Protocol

from dibs import events
from dibs.errors import ConfigurationError, LeaseLost, SerializationError, StoreUnavailable
from dibs.keys import Key
from dibs.lease import Keeping
from dibs.outcomes import RunReport
from dibs.stops import STOP_PREFIX, STOPS, failure_text, is_stop

if TYPE_CHECKING:
    from dibs.events import Emitter
    from dibs.lease import Lease
    from dibs.stores.base import Store

__all__ = [
    "STOPS",
    "STOP_PREFIX",
    "FailureOf",
    "HeldLease",
    "Logger",
    "beat_reporter",
    "failure_text",
    "heartbeat_reporter",
    "holding",
    "is_stop",
    "lost_reporter",
    "not_held_here",
    "release_after",
    "store_value",
]

log = logging.getLogger("dibs")

#: What a failed work is recorded as: a text, or ``None`` when the exception is no failure.
FailureOf = Callable[[BaseException], str | None]


class Logger(Protocol):
    """Where the decisions are logged: a ``logging.Logger``, Prefect's run logger, Airflow's task logger."""

    def info(self, msg: str, /, *args: Any) -> Any: ...

    def warning(self, msg: str, /, *args: Any) -> Any: ...

    def error(self, msg: str, /, *args: Any) -> Any: ...


# The keys whose work runs in this call stack (this thread, or this asyncio task): asking for one of
# them again from inside its own work would wait for itself forever.
_HELD_HERE: contextvars.ContextVar[frozenset[tuple[int, str]]] = contextvars.ContextVar(
    "dibs_held_here", default=frozenset()
)


@contextlib.contextmanager
def holding(store: Store, key: Key) -> Iterator[None]:
    """Mark ``key`` as computed by this call stack while the block runs (see :func:`not_held_here`)."""
    token = _HELD_HERE.set(_HELD_HERE.get() | {(id(store.record_store), key.digest)})
    try:
        yield
    finally:
        _HELD_HERE.reset(token)


def not_held_here(store: Store, key: Key) -> None:
    """Refuse to wait for a key whose work is running in this very call stack: it would never end."""
    if (id(store.record_store), key.digest) in _HELD_HERE.get():
        raise ConfigurationError(
            f"{key} was asked for from inside its own work: the call would wait for itself forever. "
            "Give the inner computation a key of its own (e.g. another key= or version=)",
            key=str(key),
        )


def lost_reporter(logger: Logger, emit: Emitter | None = None, token: int = 0) -> Callable[[LeaseLost], None]:
    def lost(error: LeaseLost) -> None:
        logger.warning("%s; the work goes on, but its value will not be stored", error)
        if emit is not None:
            emit(
                events.LostLease,
                token=token,
                error=error.message,
                reason=error.fields.get("reason", "unknown"),
            )

    return lost


def beat_reporter(emit: Emitter | None, token: int) -> Callable[[float], None] | None:
    """What a heartbeat tells the observers (how late it ran), if anyone listens for it."""
    if emit is None or not emit.wants(events.HeartbeatSent):
        return None

    def beat(lateness: float) -> None:
        emit(events.HeartbeatSent, token=token, lateness=lateness)

    return beat


def heartbeat_reporter(emit: Emitter | None, token: int) -> Callable[[StoreUnavailable], None] | None:
    """What a failed heartbeat (retried) tells the observers, if anyone listens."""
    if emit is None:
        return None

    def failed(error: StoreUnavailable) -> None:
        emit(events.HeartbeatFailed, token=token, error=str(error))

    return failed


def release_after(
    lease: Lease,
    exc: BaseException,
    failure_of: FailureOf | None,
    logger: Logger,
    emit: Emitter | None = None,
) -> None:
    """The work raised ``exc``: release the lease with the failure recorded, never raising."""
    error = failure_text(exc) if failure_of is None else failure_of(exc)
    if emit is not None:  # counted towards max_failures: neither a skip (None) nor a stop
        counted = error is not None and not is_stop(error)
        emit(events.WorkFailed, token=lease.token, error=error or failure_text(exc), counted=counted)
    try:
        lease.release(error)
        if emit is not None:
            emit(events.LeaseReleased, token=lease.token, error=error)
    except LeaseLost as lost:
        logger.warning(
            "%s: the work failed after the lease was lost (%s); nothing to release", lease.key, lost
        )
    except StoreUnavailable as unreachable:
        logger.warning(
            "%s: could not record the failure (%s); the lease expires after its ttl", lease.key, unreachable
        )


#: Until when every run computes for itself after a value could not be stored (unless the error says).
_SERIALIZABLE = (
    "the work returns data the serializer can store (JSON by default) or the serializer is changed"
)


def store_value(
    lease: Lease,
    value: Any,
    *,
    took_over_from: str | None,
    policy: Literal["fail", "run"],
    logger: Logger,
    emit: Emitter | None = None,
    compute_seconds: float = 0.0,
) -> RunReport:
    """The work returned ``value``: store it as the key's artifact, deciding as the module docstring says."""
    key = lease.key

    def report(stored: bool) -> RunReport:
        return RunReport(
            key, value, "computed", lease.token, lease.owner, took_over_from=took_over_from, stored=stored
        )

    def not_stored(reason: Literal["serialization", "fenced", "unavailable"], error: Exception) -> None:
        if emit is not None:
            emit(
                events.NotStored,
                token=lease.token,
                reason=reason,
                error=str(error),
                compute_seconds=compute_seconds,
            )

    try:
        record = lease.complete(value, compute_seconds=compute_seconds)
    except SerializationError as exc:
        not_stored("serialization", exc)
        release_after(lease, exc, None, logger, emit)
        logger.error(
            "%s: computed, but the value cannot be stored as its artifact (%s); it is returned to this run "
            "only, and the lease was released with this error, so every run computes for itself until %s",
            key,
            exc.message,
            exc.fields.get("remedy") or _SERIALIZABLE,  # a payload store's refusal says what ends it
        )
        return report(stored=False)
    except LeaseLost as exc:
        # Fenced out: someone else owns the key now. The value is still right for this caller.
        logger.warning("%s: computed, but not stored: %s", key, exc)
        not_stored("fenced", exc)
        return report(stored=False)
    except StoreUnavailable as exc:
        # Lease.complete already read the key again for a whole ttl: the store stayed unreachable.
        if policy == "fail":
            logger.error("%s: computed, but the store failed while storing it (policy 'fail'): %s", key, exc)
            raise
        logger.warning("%s: computed, but not stored: the store is unavailable (policy 'run'): %s", key, exc)
        not_stored("unavailable", exc)
        return report(stored=False)
    logger.info("%s: stored its artifact (token %s)", key, lease.token)
    if emit is not None:
        emit(events.ArtifactStored, token=lease.token, size=record.size, compute_seconds=compute_seconds)
    return report(stored=True)


class HeldLease(Keeping):
    """A lease while its work runs: :class:`~dibs.lease.Keeping` (its heartbeats and its one ending)
    with the decisions of this module for how the work ended.

    Heartbeats start at once (``heartbeats=False``: none, for a lease shorter than its ttl); a lost
    lease is logged and heard by ``emit`` and ``on_lost``. Then exactly one ending counts:
    :meth:`fail` (the work raised), :meth:`store` (it returned a value), :meth:`let_go` (ended from
    outside: a lock released, a task killed, from any thread), :meth:`close` (a ``with`` block
    ended) or :meth:`drop` (lost or replaced: nothing to release). Each stops the heartbeats first.
    After one ending, the others release nothing; a value stored after a :meth:`let_go` is refused by
    the store (fenced) and returned to its caller only.
    """

    def __init__(
        self,
        lease: Lease,
        *,
        took_over_from: str | None = None,
        failure_of: FailureOf | None = None,
        logger: Logger | None = None,
        emit: Emitter | None = None,
        on_lost: Callable[[LeaseLost], None] | None = None,
        heartbeats: bool = True,
    ) -> None:
        self.took_over_from = took_over_from
        self.failure_of, self.logger, self.emit = failure_of, logger or log, emit
        reporter = lost_reporter(self.logger, emit, lease.token)

        def lost(error: LeaseLost) -> None:
            reporter(error)
            if on_lost is not None:
                on_lost(error)

        failed = heartbeat_reporter(emit, lease.token)
        beat = beat_reporter(emit, lease.token)
        super().__init__(lease, on_lost=lost, on_failed=failed, on_beat=beat, heartbeats=heartbeats)

    def fail(self, exc: BaseException) -> None:
        """The work raised ``exc``: release with the failure recorded; never raises."""
        if self._end():
            release_after(self.lease, exc, self.failure_of, self.logger, self.emit)

    def store(self, value: Any, *, policy: Literal["fail", "run"], compute_seconds: float = 0.0) -> RunReport:
        """The work returned ``value``: store it as the key's artifact (:func:`store_value`)."""
        self._end()
        return store_value(
            self.lease,
            value,
            took_over_from=self.took_over_from,
            policy=policy,
            logger=self.logger,
            emit=self.emit,
            compute_seconds=compute_seconds,
        )

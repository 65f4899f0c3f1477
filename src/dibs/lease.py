"""A held lease: heartbeat it, complete it with the artifact, or release it with the failure.

A :class:`Lease` is a handle on one store record, identified by its key, owner and token (fence +
random lease id). It holds no thread or connection of its own, so it can be exported to another
process (:meth:`Lease.export` / :meth:`dibs.Reservations.resume`): both may heartbeat it without
coordinating, as in the seeds' orchestrator + remote pairing.

:meth:`Lease.keep_alive` runs heartbeats in a background thread while the work runs. The thread stops
when the ``with`` block ends (not when the process ends), and if the lease is lost it tells the work
through :attr:`KeepAlive.lost`, :meth:`KeepAlive.check` and an optional callback; heartbeats that
fail (the store away, or answering with an error) are retried, and fail the lease once they have
failed for a whole ttl, when another may take the key. The thread is only
started when the first heartbeat is due (see :class:`_Launcher`), so work that ends within one
interval costs no thread at all.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Protocol, Self, TypeVar, cast

from dibs import events
from dibs.backoff import Backoff, Retrying
from dibs.config import validate_seconds
from dibs.errors import ConfigurationError, LeaseLost, SerializationError, StoreUnavailable
from dibs.keys import Key
from dibs.payloads.base import Payload, PayloadUnwritable
from dibs.payloads.references import REFERENCE
from dibs.payloads.references import encode as encode_reference
from dibs.records import ArtifactRecord, LeaseRecord, LeaseToken, checksum
from dibs.serializers import dump_artifact
from dibs.settings import validate_timings
from dibs.stops import failure_text, is_stop
from dibs.stores.requests import NewArtifact

if TYPE_CHECKING:
    from dibs.payloads.referencing import ReferencingStore
    from dibs.serializers import Serializer
    from dibs.settings import Settings
    from dibs.stores.base import Store

__all__ = ["KeepAlive", "Keeping", "Lease", "LeaseSource"]

log = logging.getLogger("dibs")

_EXPORT_PREFIX = "dibs-lease:"
#: How a complete whose reply was lost reads the key again: soon, then at most once a second.
_SETTLING = Backoff(initial=0.05, maximum=1.0, jitter=0.1)


class LeaseSource(Protocol):
    """What a lease needs of whoever got it (a :class:`dibs.Reservations` client): the store it lives
    in, the serializer of its artifact, and the settings its heartbeats follow."""

    @property
    def store(self) -> Store: ...

    @property
    def serializer(self) -> Serializer: ...

    @property
    def settings(self) -> Settings: ...


P = ParamSpec("P")
R = TypeVar("R")


def _for_its_call(operation: Callable[Concatenate[Lease, P], R]) -> Callable[Concatenate[Lease, P], R]:
    """A lease's own operation: its store operations name the front end of the call that made the
    lease (:data:`dibs.events.FRONTEND`), from whichever thread it runs (its heartbeat thread, Prefect's
    release of a lock outside the call that took it). Unobserved, one check."""

    @functools.wraps(operation)
    def operate(self: Lease, /, *args: P.args, **kwargs: P.kwargs) -> R:
        if not self._frontend or not events.PROCESS.operations:
            return operation(self, *args, **kwargs)
        acting = events.FRONTEND.set(self._frontend)
        try:
            return operation(self, *args, **kwargs)
        finally:
            events.FRONTEND.reset(acting)

    return operate


class Lease:
    """The right to compute one key until ``expires_at`` (store clock). See the module docstring."""

    def __init__(self, client: LeaseSource, record: LeaseRecord) -> None:
        self._client = client
        self._record = record
        self._ended = False
        self._granted = time.monotonic()  # the default compute time of complete() counts from here
        self._frontend = events.FRONTEND.get()  # the front end of the call that made it ("": none)

    # -- what the lease is --------------------------------------------------------------------------
    @property
    def key(self) -> Key:
        return self._record.key

    @property
    def owner(self) -> str:
        return self._record.owner

    @property
    def token(self) -> int:
        """The fencing token: strictly increases every time the key changes hands, for the life of the
        store. Clearing the key (forget, prune, reap, a forced release, discard) leaves a tombstone
        that keeps it, so no later holder of this key gets this token or a smaller one: it can fence
        writes outside dibs (accept a write only with a token at least the last one seen)."""
        return self._record.token.fence

    @property
    def expires_at(self) -> float:
        return self._record.expires_at

    @property
    def attempt(self) -> int:
        return self._record.attempt

    @property
    def record(self) -> LeaseRecord:
        return self._record

    @property
    def ended(self) -> bool:
        """Whether this handle completed or released the lease."""
        return self._ended

    def __repr__(self) -> str:
        return f"Lease(key={str(self.key)!r}, owner={self.owner!r}, token={self.token})"

    # -- the lease's operations -------------------------------------------------------------------
    @_for_its_call
    def heartbeat(self) -> float:
        """Extend the lease to store-now + ttl; returns the new expiry. :class:`LeaseLost` if stale."""
        self._record = self._client.store.heartbeat(self.key, self._record.token, self._record.ttl)
        return self._record.expires_at

    @_for_its_call
    def complete(self, value: Any, *, compute_seconds: float | None = None) -> ArtifactRecord:
        """Store ``value`` as the key's artifact and end the lease, fenced by this lease's token.

        ``compute_seconds`` is kept with the artifact (what waiters and hits were spared); by default
        the time since this lease was granted to this process. Given, it must be a number of seconds,
        0 or more (:class:`ConfigurationError` otherwise, before anything is written).

        When the store fails during the write (:class:`StoreUnavailable`), the outcome is unknown: the
        connection may have dropped after the store had already stored the artifact. The key is then
        read again (see :meth:`_settle_complete`) instead of reporting a failure that may be false.
        """
        # Checked before anything is written: a stored infinity or NaN would make the record one that
        # every later read refuses as corrupt. The lease stays held, so a corrected call can follow.
        compute_seconds = validate_seconds(
            "compute_seconds", compute_seconds, allow_none=True, allow_zero=True
        )
        if isinstance(value, Payload):  # in the payload store already (put_payload): publish a reference
            from dibs.payloads.streams import referencing_store

            referencing_store(self._client, "completing a lease with a Payload")
            return self._complete_with(
                REFERENCE, encode_reference(value, ""), value.checksum, compute_seconds
            )
        serializer = self._client.serializer
        try:
            payload = dump_artifact(serializer, value, self.key, self.token)  # signatures bind key + fence
        except SerializationError:
            raise
        except Exception as exc:  # a serializer of the user's, or a value nested too deep (RecursionError)
            raise SerializationError(
                f"serializer {serializer.name!r} cannot store a {type(value).__name__} for {self.key}: "
                f"{type(exc).__name__}: {exc}",
                key=str(self.key),
                value_type=type(value).__name__,
            ) from exc
        offloaded = self._offload(serializer.name, payload, compute_seconds)
        if offloaded is not None:
            return offloaded
        return self._complete_with(serializer.name, payload, checksum(payload), compute_seconds)

    def _offload(
        self, serializer: str, payload: bytes, compute_seconds: float | None
    ) -> ArtifactRecord | None:
        """A payload too large for the record, completed through the payload store: written there
        while its SHA-256 is computed (one pass, not a checksum pass and then a write), then published
        as a reference; ``None`` when the client has no payload store or the payload stays inline.
        A write that fails raises :class:`~dibs.payloads.PayloadUnwritable`, a failed compute to the
        hold (the lease released at once, the value returned), before anything is sent to the records."""
        # Not imported here: a store can only be a ReferencingStore once its module was imported, so
        # a process without payload stores neither imports it nor pays an import per complete.
        referencing = sys.modules.get("dibs.payloads.referencing")
        if referencing is None or not isinstance(self._client.store, referencing.ReferencingStore):
            return None
        store = cast("ReferencingStore", self._client.store)
        if compute_seconds is None:  # the work's time, not the write's
            compute_seconds = time.monotonic() - self._granted
        stored = store.offload(serializer, payload)
        if stored is None:
            return None
        document = encode_reference(stored, "")
        record = self._complete_with(REFERENCE, document, stored.checksum, compute_seconds)
        return store.loaded(record, payload)

    def _complete_with(
        self, serializer: str, payload: bytes, digest: str, compute_seconds: float | None
    ) -> ArtifactRecord:
        if compute_seconds is None:
            compute_seconds = time.monotonic() - self._granted
        artifact = NewArtifact(serializer, payload, digest, compute_seconds)
        try:
            record = self._client.store.complete(self.key, self._record.token, artifact)
        except PayloadUnwritable:
            raise  # nothing reached the records (a store wrapped around a referencing one writes first)
        except StoreUnavailable as exc:
            record = self._settle_complete(artifact, exc)
        self._ended = True
        return record

    def _settle_complete(self, new: NewArtifact, error: StoreUnavailable) -> ArtifactRecord:
        """Resolve a complete whose outcome is unknown by reading the key again, for up to one ttl.

        Our own artifact (this token's fence and this payload's checksum) means the write landed;
        another artifact, or a lease that is no longer ours, means :class:`LeaseLost`; a lease that is
        still ours means the write never landed, and it is sent again (safe: it is fenced by the
        token, and a duplicate of a write that did land is refused, then recognised on the next read).
        Only a store that stays unreachable for the whole ttl gets :class:`StoreUnavailable`, saying
        that whether the artifact was stored is unknown.
        """
        from dibs.stores import transitions

        store, token = self._client.store, self._record.token
        retrying = Retrying(_SETTLING, max(self._record.ttl, 1.0))
        log.warning(
            "completing %s failed (%s); reading the key to find out whether it was stored", self.key, error
        )
        while retrying.sleep():
            try:
                state = store.read(self.key)
            except StoreUnavailable as exc:
                error = exc
                continue
            artifact = state.artifact
            if artifact is not None and artifact.fence == token.fence and artifact.checksum == new.checksum:
                log.info("%s was stored by the complete whose reply was lost (token %s)", self.key, token)
                return artifact
            if artifact is not None or state.lease is None or state.lease.token != token:
                raise transitions.explain_lost(state, token, "complete")
            try:
                return store.complete(self.key, token, new)
            except StoreUnavailable as exc:
                error = exc
            except LeaseLost:
                pass  # our earlier write may have landed since the read: the next read tells
        raise StoreUnavailable(
            f"could not complete {self.key}: the store failed and stayed unreachable for "
            f"{retrying.seconds:.1f}s, so whether the artifact was stored is unknown "
            f"(a later read will tell; if it was not, the lease expires and a waiter takes over): {error}",
            key=str(self.key),
            token=token.fence,
        )

    @_for_its_call
    def release(self, error: BaseException | str | None = None) -> None:
        """End the lease without an artifact so a waiter takes over now; ``error`` is recorded.

        A stop (a recorded text that :func:`dibs.stops.is_stop` recognizes: Ctrl-C, a cancellation,
        a kill) is recorded but not counted as a failure, so it never makes ``max_failures`` refuse
        the key. Every front end words its stops that way, so this is the one place that decides.
        """
        summary = error if isinstance(error, str) or error is None else failure_text(error)
        counted = summary is None or not is_stop(summary)
        self._client.store.release(self.key, self._record.token, summary, counted=counted)
        self._ended = True

    @_for_its_call
    def verify(self) -> None:
        """Check with the store that this lease is still the current one; :class:`LeaseLost` if not.

        A process that received the lease from another one calls this before starting work (the seeds'
        ``LockWasStolenError``): if the lease was taken over meanwhile, it must not run.
        """
        from dibs.stores import transitions

        state = self._client.store.read(self.key)
        if state.artifact is not None or state.lease is None or state.lease.token != self._record.token:
            raise transitions.explain_lost(state, self._record.token, "resume")
        if not state.lease.live_at(state.now):
            self.heartbeat()  # expired but nobody took it: revive it before relying on it
        else:
            self._record = state.lease

    def keep_alive(
        self,
        interval: float | None = None,
        on_lost: Callable[[LeaseLost], None] | None = None,
        on_failed: Callable[[StoreUnavailable], None] | None = None,
        on_beat: Callable[[float], None] | None = None,
    ) -> KeepAlive:
        """A context manager that heartbeats every ``interval`` seconds (default: the client's interval
        for this lease's ttl). A given ``interval`` follows the settings' rules (at least
        :data:`~dibs.settings.MIN_HEARTBEAT_INTERVAL`). ``on_failed`` hears each heartbeat that failed
        for an outage (:class:`StoreUnavailable`) and is retried; any other error is retried as well,
        and logged (with its traceback once), not passed to it; ``on_beat`` hears each one that
        succeeded, with how late it ran (seconds)."""
        if interval is not None:
            interval = validate_timings(heartbeat_interval=interval)[1]
        interval = interval or self._client.settings.heartbeat_for(self._record.ttl)
        return KeepAlive(self, interval, on_lost, on_failed, on_beat)

    # -- hand-off -------------------------------------------------------------------------------
    def export(self) -> str:
        """An opaque string another process can :meth:`~dibs.Reservations.resume`. It is a secret:
        whoever has it can complete the key, so pass it like a credential."""
        doc = {
            "namespace": self.key.namespace,
            "name": self.key.name,
            "owner": self.owner,
            "fence": self.token,
            "lease_id": self._record.token.lease_id,
            "acquired_at": self._record.acquired_at,
            "expires_at": self._record.expires_at,
            "ttl": self._record.ttl,
            "attempt": self._record.attempt,
            "max_expires_at": self._record.max_expires_at,
        }
        return _EXPORT_PREFIX + base64.urlsafe_b64encode(json.dumps(doc).encode()).decode("ascii")

    @staticmethod
    def parse_export(exported: str) -> LeaseRecord:
        try:
            if not exported.startswith(_EXPORT_PREFIX):
                raise ValueError(f"it does not start with {_EXPORT_PREFIX!r}")
            doc = json.loads(base64.urlsafe_b64decode(exported.removeprefix(_EXPORT_PREFIX)))
            return LeaseRecord(
                key=Key(doc["namespace"], doc["name"]),
                owner=doc["owner"],
                token=LeaseToken(int(doc["fence"]), str(doc["lease_id"])),
                acquired_at=float(doc["acquired_at"]),
                expires_at=float(doc["expires_at"]),
                ttl=float(doc["ttl"]),
                attempt=int(doc["attempt"]),
                max_expires_at=None if doc["max_expires_at"] is None else float(doc["max_expires_at"]),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigurationError(
                f"not an exported dibs lease ({exc}); pass the exact string Lease.export() returned"
            ) from exc

    # -- context manager: keep alive while the block runs, release on error -------------------------
    def __enter__(self) -> Self:
        self._held = Keeping(self)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._held.close(exc)


class Keeping:
    """A lease while it is held: its heartbeats, and the one way it ends, whoever ends it first.

    Heartbeats start at once (``heartbeats=False``: none, for a lease shorter than its ttl). Then one
    ending counts: :meth:`let_go` (from any thread: a lock released, a task killed), :meth:`close` (a
    ``with`` block ended) or :meth:`drop` (lost or replaced: nothing to release); each stops the
    heartbeats first, so a late heartbeat never reports a false "lease lost". The hold of a work adds
    its own endings in :class:`dibs.holding.HeldLease`.
    """

    def __init__(
        self,
        lease: Lease,
        *,
        on_lost: Callable[[LeaseLost], None] | None = None,
        on_failed: Callable[[StoreUnavailable], None] | None = None,
        on_beat: Callable[[float], None] | None = None,
        heartbeats: bool = True,
    ) -> None:
        self.lease = lease
        self._guard = threading.Lock()
        self._ended = False
        self.keeper: KeepAlive | None = None
        if heartbeats:
            self.keeper = lease.keep_alive(on_lost=on_lost, on_failed=on_failed, on_beat=on_beat)
            self.keeper.__enter__()

    @property
    def alive(self) -> bool:
        """Whether it has not ended, and its heartbeats (if any) still succeed."""
        return not self._ended and (self.keeper is None or not self.keeper.lost.is_set())

    def _end(self) -> bool:
        """Stop the heartbeats (one in flight finishes first: it never sees the lease ended); whether
        this is the first ending."""
        with self._guard:
            first, self._ended = not self._ended, True
        if self.keeper is not None:
            self.keeper.stop()
        return first

    def let_go(self, error: str | None = None) -> None:
        """End it from outside the work (any thread), recording ``error`` (``None``: nothing failed).
        Raises what the release raises (:class:`~dibs.errors.LeaseLost` if it had ended meanwhile)."""
        if self._end():
            self.lease.release(error)

    def drop(self) -> None:
        """Stop keeping it, releasing nothing: it was lost or replaced (nothing is left to release)."""
        self._end()

    def close(self, exc: BaseException | None) -> None:
        """A ``with lease:`` block ended (``exc``: how): release the lease unless the block completed
        or released it; a lease already lost is only logged."""
        if not self._end() or self.lease.ended:
            return
        try:
            self.lease.release(exc)
        except LeaseLost:
            log.warning("lease on %s was already lost when its block ended", self.lease.key)


def _described(exc: Exception) -> str:
    """A heartbeat's error for a person: an outage by its message (it names the store), anything else
    with its type too (a bare ``KeyError()`` says nothing)."""
    return str(exc) if isinstance(exc, StoreUnavailable) else f"{type(exc).__name__}: {exc}"


class KeepAlive:
    """Background heartbeats for one lease while a block of work runs.

    A heartbeat that fails, whatever the error but :class:`LeaseLost`, is retried every
    ``interval / 4`` until the lease would have expired; only then (or on a definite
    :class:`LeaseLost`) is the lease declared lost: reason ``unreachable`` for an outage
    (:class:`StoreUnavailable`), ``heartbeat_failed`` for an error the store did not expect.
    """

    def __init__(
        self,
        lease: Lease,
        interval: float,
        on_lost: Callable[[LeaseLost], None] | None,
        on_failed: Callable[[StoreUnavailable], None] | None = None,
        on_beat: Callable[[float], None] | None = None,
    ) -> None:
        self.lease = lease
        self.on_beat = on_beat
        self.interval = validate_seconds("heartbeat interval", interval) or 0.0
        self.on_lost = on_lost
        self.on_failed = on_failed
        self.lost = threading.Event()
        self.error: LeaseLost | None = None
        self.beats = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._entered = 0.0

    def __enter__(self) -> Self:
        self._entered = time.monotonic()
        _LAUNCHER.add(self, self._entered + self.interval)
        return self

    def _launch(self) -> None:
        """Start the heartbeat thread (the first heartbeat is due now), unless the block has ended."""
        with self._lock:
            if self._stop.is_set():
                return
            self._thread = threading.Thread(
                target=self._run, name=f"dibs-heartbeat-{self.lease.key.name[:40]}", daemon=True
            )
            self._thread.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def stop(self) -> None:
        _LAUNCHER.remove(self)
        with self._lock:
            self._stop.set()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def check(self) -> None:
        """Raise the :class:`LeaseLost` that stopped the heartbeats, if any: call it between work steps."""
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        last_success = self._entered
        traced = False  # an unexpected error's traceback is logged once in a row of them, not each retry
        wait = max(0.0, self._entered + self.interval - time.monotonic())
        due = self._entered + self.interval
        while not self._stop.wait(wait):
            late = max(0.0, time.monotonic() - due)
            try:
                self.lease.heartbeat()
            except LeaseLost as exc:
                self._declare_lost(exc)
                return
            except Exception as exc:  # an outage, or an error a store did not expect
                # Anything else (a store's own bug, its table dropped under it) is retried as an outage
                # is: raised out of this thread, it would end the heartbeats and tell the holder
                # nothing, while its work went on as if the lease were kept.
                outage = isinstance(exc, StoreUnavailable)
                silent_for = time.monotonic() - last_success
                lost = silent_for >= self.lease.record.ttl
                if not outage and not traced:  # where it came from, once for a run of such errors
                    log.warning("heartbeat of %s raised an unexpected error", self.lease.key, exc_info=exc)
                traced = not outage
                if lost:
                    self._declare_lost(self._unkept(exc, silent_for))
                    return
                log.warning("heartbeat of %s failed, retrying: %s", self.lease.key, _described(exc))
                if isinstance(exc, StoreUnavailable) and self.on_failed is not None:
                    self.on_failed(exc)
                wait = max(self.interval / 4, 0.01)
                due = time.monotonic() + wait
                continue
            traced = False
            last_success = time.monotonic()
            self.beats += 1
            if self.on_beat is not None:
                self.on_beat(late)
            wait = self.interval
            due = time.monotonic() + wait

    def _unkept(self, exc: Exception, silent_for: float) -> LeaseLost:
        """The :class:`LeaseLost` of heartbeats that failed for a whole ttl: ``unreachable`` when the
        store was away, ``heartbeat_failed`` when it answered with an error."""
        if isinstance(exc, StoreUnavailable):
            why, reason = f"the store was unreachable for {silent_for:.1f}s", "unreachable"
        else:
            why, reason = f"its heartbeats failed for {silent_for:.1f}s", "heartbeat_failed"
        lost = LeaseLost(
            f"lost the lease on {self.lease.key}: {why}, longer than the ttl ({_described(exc)})",
            key=str(self.lease.key),
            token=self.lease.token,
            reason=reason,
        )
        lost.__cause__ = exc
        return lost

    def _declare_lost(self, error: LeaseLost) -> None:
        self.error = error
        self.lost.set()
        # A warning, not an error: the work goes on, its value is still right, only not stored. Said
        # once: by the lease's holder in its own log (a task's, a run's) when it listens, else here.
        if self.on_lost is not None:
            self.on_lost(error)
        else:
            log.warning("%s; the work goes on, but its value will not be stored", error)


class _Launcher:
    """Starts each :class:`KeepAlive`'s heartbeat thread when its first heartbeat is due.

    Most blocks of work end well within one heartbeat interval (a third of the ttl by default), and
    then no thread is ever started for them: starting and joining a thread costs about as much as a
    whole reserve-and-complete on a fast store (see ``benchmarks/``). One daemon thread per process
    sleeps until the earliest first heartbeat of the blocks still running; a block still running then
    gets its own thread, which heartbeats exactly as it would have from the start.
    """

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        # A forked child has no threads: it starts its own launcher when it first needs one, and
        # (as with plain threads) the blocks its parent was running are not kept alive in the child.
        self._condition = threading.Condition(threading.Lock())
        self._due: dict[KeepAlive, float] = {}
        self._thread: threading.Thread | None = None
        #: When the thread wakes up next by itself (``inf``: only when notified).
        self._wakes_at = math.inf

    def add(self, keeper: KeepAlive, due: float) -> None:
        with self._condition:
            self._due[keeper] = due
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="dibs-heartbeat-launcher", daemon=True)
                self._thread.start()
            elif due < self._wakes_at:
                # Only a block due before the thread's next wake-up needs it woken now. Blocks that
                # follow each other each start an interval after the last: their thread is already
                # set to wake up before they are due, and waking it for each (a thread switch, and the
                # GIL handed over and back) cost more than the rest of a fast store's reserve+complete.
                self._condition.notify()

    def remove(self, keeper: KeepAlive) -> None:
        with self._condition:
            self._due.pop(keeper, None)  # waking up early for it later is harmless

    def _run(self) -> None:
        while True:
            with self._condition:
                while True:
                    now = time.monotonic()
                    due = [keeper for keeper, at in self._due.items() if at <= now]
                    if due:
                        for keeper in due:
                            del self._due[keeper]
                        break
                    # Bounded: a wait beyond TIMEOUT_MAX raises OverflowError and ends this thread.
                    wait = min(min(self._due.values()) - now, threading.TIMEOUT_MAX) if self._due else None
                    # A block removed before it was due leaves this wake-up as it is: the next block
                    # added is then usually due after it, and needs no notify (see ``add``).
                    self._wakes_at = math.inf if wait is None else now + wait
                    self._condition.wait(wait)
            for keeper in due:
                try:
                    keeper._launch()
                except RuntimeError as exc:  # "can't start new thread": the lease then expires
                    log.error("could not start the heartbeat thread of %s: %s", keeper.lease.key, exc)


_LAUNCHER = _Launcher()

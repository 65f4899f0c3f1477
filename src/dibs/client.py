"""The client: :class:`Reservations` turns the store's one-attempt operations into compute-once calls.

Policy lives here and below, once, above every store: owners, ttl and heartbeats, waiting (through
the watch hub and :mod:`dibs._waiting`), the asks and how their answers become outcomes
(:mod:`dibs.calls`), serialization and integrity checks (:mod:`dibs.artifacts`), the maximum number
of recorded failures, and what to do when the store is unreachable (:mod:`dibs.holding`). Its async
face, :class:`~dibs.aio.AsyncReservations` (``client.aio()``), makes the same decisions, awaited.

Clients are cheap: every client of a process built for one store URL shares one store object, one
connection pool and one watch hub (:mod:`dibs.runtime`), so building one per task, per request or per
deferred trigger costs nothing but the object.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from os import PathLike
from pathlib import Path
from typing import IO, Any, ParamSpec, Protocol, TypeVar, Unpack, overload

from dibs import calls, events, flow, holding, keys
from dibs._closing import Closing
from dibs._waiting import AskAcquire, acquire_until, drive
from dibs.aio import AsyncReservations
from dibs.artifacts import ArtifactReader
from dibs.backoff import Backoff, Deadline
from dibs.calls import AcquireOptions, AcquireOrBusy, AcquireRaising, AskOptions, CallOptions, WaitOptions
from dibs.config import default_owner, default_store_url, validate_seconds
from dibs.errors import ConfigurationError
from dibs.events import Emitter, Observation, Observer, Observers
from dibs.keys import Key
from dibs.lease import Lease
from dibs.outcomes import Acquired, Busy, Hit, Outcome, RunReport
from dibs.payloads import (
    DEFAULT_GRACE,
    DEFAULT_INLINE_LIMIT,
    Payload,
    PayloadStore,
    PayloadUnavailable,
    default_payloads_url,
    referencing,
)
from dibs.records import ArtifactRecord, Held, KeyState, StoreOutcome
from dibs.runtime import runtime
from dibs.serializers import Serializer
from dibs.settings import Configured, Settings, StoreUnavailablePolicy
from dibs.stores import Store, redact_url

__all__ = ["AsyncReservations", "Reservations"]

log = logging.getLogger("dibs")

#: The settings of a client built without any (their values are the constructor's defaults).
DEFAULTS = Settings()

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


class _Decorator(Protocol):
    def __call__(self, fn: Callable[P, R], /) -> Callable[P, R]: ...


class Reservations(Closing, Configured):
    """Compute each key once across every process that shares the store.

    :param store: a :class:`~dibs.stores.Store`, a store URL, or ``None`` for ``DIBS_STORE_URL`` and
        then the embedded SQLite default (see :mod:`dibs.config`). A URL is shared with every other
        client of the process (:mod:`dibs.runtime`); nothing is sent to the store before the first call.
    :param settings: a ready :class:`~dibs.settings.Settings`, or the same settings one by one:
        ``namespace``, ``ttl``, ``heartbeat_interval``, ``max_lease_age``, ``max_age``, ``max_failures``,
        ``on_store_unavailable``, ``serializer``, ``signing_key``, ``backoff`` (see :class:`Settings`).
    :param payloads: a payload store (URL or :class:`~dibs.payloads.PayloadStore`) for artifacts
        larger than ``payload_inline_limit`` bytes (default 64 KiB); ``None``: ``DIBS_PAYLOADS_URL``,
        else every artifact stays in its record. ``payload_grace``: see :mod:`dibs.payloads.collect`.
        See docs/payloads.md.

    Its settings read as its own attributes too (``client.ttl``, ``client.namespace``: see
    :class:`~dibs.settings.Configured`).
    """

    def __init__(
        self,
        store: Store | str | None = None,
        *,
        namespace: str = DEFAULTS.namespace,
        ttl: float = DEFAULTS.ttl,
        heartbeat_interval: float | None = None,
        max_lease_age: float | None = None,
        max_age: float | None = None,
        serializer: Serializer | str | None = None,
        signing_key: bytes | str | None = None,
        backoff: Backoff | None = None,
        max_failures: int | None = None,
        on_store_unavailable: StoreUnavailablePolicy = DEFAULTS.on_store_unavailable,
        settings: Settings | None = None,
        payloads: PayloadStore | str | None = None,
        payload_inline_limit: int = DEFAULT_INLINE_LIMIT,
        payload_grace: float = DEFAULT_GRACE,
    ) -> None:
        chosen: dict[str, Any] = {
            "namespace": namespace,
            "ttl": ttl,
            "heartbeat_interval": heartbeat_interval,
            "max_lease_age": max_lease_age,
            "max_age": max_age,
            "serializer": DEFAULTS.serializer if serializer is None else serializer,
            "signing_key": signing_key,
            "backoff": DEFAULTS.backoff if backoff is None else backoff,
            "max_failures": max_failures,
            "on_store_unavailable": on_store_unavailable,
        }
        if settings is not None:
            changed = sorted(name for name, value in chosen.items() if value != getattr(DEFAULTS, name))
            if changed:
                raise ConfigurationError(
                    f"pass either settings= or individual settings ({', '.join(changed)}), not both; "
                    "use settings.replace(...) to change some of them"
                )
        self.settings = settings if settings is not None else Settings(**chosen)
        self.serializer = self.settings.make_serializer()
        #: Reads this client's artifacts back into values (:mod:`dibs.artifacts`).
        self.artifacts = ArtifactReader(self.settings, self.serializer)
        if isinstance(store, Store):
            self.store, self._shared = store, False
        else:
            url = store if store is not None else default_store_url()
            if not isinstance(url, str):
                raise ConfigurationError(
                    f"store must be a store URL, a dibs Store or None, got {type(store).__name__}"
                )
            self.store, self._shared = runtime().share_store(url), True
        self._records = self.store
        payloads = payloads if payloads is not None else default_payloads_url()
        if payloads is not None:  # large artifacts apart (dibs.payloads): the record store stays as it is
            validate_seconds("payload_grace", payload_grace, allow_zero=True)
            self.store = referencing(
                self.store, payloads, inline_limit=payload_inline_limit, grace=payload_grace
            )
        self._closed = False
        #: This client's observers (see :mod:`dibs.events`); :meth:`observe` adds one.
        self.observers = Observers()
        # What events call the store: its URL's scheme, as stores are chosen by URL (read once: a
        # store's url is redacted on every read).
        self._store_kind = self.store.url.split("://", 1)[0].split("+", 1)[0].lower()

    def observe(self, observer: Observer) -> Observation:
        """Hear every event of this client's compute-once calls; ``close()`` the result to stop."""
        return self.observers.add(observer)

    # -- plumbing ---------------------------------------------------------------------------------
    def key(self, key: str | Key) -> Key:
        """``key`` as a :class:`Key` in this client's namespace (validated)."""
        return Key.parse(key, self.namespace)

    def close(self) -> None:
        """Give this client's share of the store back (the store stays open for other clients of the
        process; a store passed in as an object is left to its owner)."""
        if self._shared and not self._closed:
            self._closed = True
            runtime().return_store(self._records)

    def __repr__(self) -> str:
        # store.url is redacted by every dibs store; a store of the user's may not be.
        return f"Reservations({redact_url(self.store.url)!r}, namespace={self.namespace!r}, ttl={self.ttl:g})"

    def decode(self, key: Key, artifact: ArtifactRecord) -> Any:
        """The value of a stored artifact, after its integrity check (see
        :meth:`dibs.artifacts.ArtifactReader.decode`)."""
        return self.artifacts.decode(key, artifact)

    def _ask_store(self, ask: AskAcquire) -> StoreOutcome:
        return calls.ask_store(self.store, ask)

    def _to_outcome(self, key: Key, outcome: StoreOutcome) -> Outcome:
        return calls.to_outcome(self, key, outcome)

    # -- the contract's calls -------------------------------------------------------------------
    def get_or_reserve(
        self, key: str | Key, owner: str | None = None, **options: Unpack[AskOptions]
    ) -> Outcome:
        """One atomic call: :class:`Hit`, :class:`Acquired` or :class:`Busy` (see the contract).

        ``ttl`` and ``max_lease_age`` override the client's for this lease. ``max_age`` (default: the
        client's) makes an artifact that old a miss; ``refresh=True`` takes the lease even beside an
        artifact (its value replaces the old one); ``min_token`` takes only an artifact stored under
        that token or a later one (after a refresh found the key busy: ``min_token=busy.token``).
        """
        calls.checked("get_or_reserve", options, AskOptions)
        ask = calls.ask_of(self.settings, self.key(key), owner, options)
        return self._to_outcome(ask.key, self._ask_store(ask))

    @overload
    def acquire(
        self, key: str | Key, owner: str | None = None, **options: Unpack[AcquireRaising]
    ) -> Hit | Acquired: ...

    @overload
    def acquire(
        self, key: str | Key, owner: str | None = None, **options: Unpack[AcquireOrBusy]
    ) -> Hit | Acquired | Busy: ...

    def acquire(
        self, key: str | Key, owner: str | None = None, **options: Unpack[AcquireOptions]
    ) -> Hit | Acquired | Busy:
        """Wait (woken by the process's watch hub, asking now and then as a backstop) until the key is
        done or yours. The options (:class:`~dibs.calls.AcquireOptions`):

        :param timeout: seconds to wait while someone else holds the key (``None``: as long as it takes).
        :param ttl: this lease's ttl (default: the client's); ``max_lease_age`` likewise.
        :param max_age: an artifact this old (store clock) is a miss (default: the client's).
        :param refresh: compute again even if an artifact exists, under the lease as always: of several
            concurrent refreshes one computes, and the others get its value.
        :param min_token: only an artifact stored under this token or a later one counts (a refresh
            that waits in several calls passes the first :class:`Busy`'s ``token``).
        :param raise_on_timeout: ``True`` (default) raises :class:`WaitTimeout` naming the holder when
            ``timeout`` passes; ``False`` returns the last :class:`Busy` instead.
        """
        calls.checked("acquire", options, AcquireOptions)
        ask = calls.ask_of(self.settings, self.key(key), owner, options)
        holding.not_held_here(self.store, ask.key)
        deadline = Deadline(options.get("timeout"))
        # Most calls are answered at once (a hit, or a free key), so ask before subscribing; a busy
        # key subscribes, and the loop asks again before it waits, so no change is missed.
        outcome = self._ask_store(ask)
        if isinstance(outcome, Held) and not deadline.expired:
            outcome = self._wait_store(
                calls.ask_again(self.settings, ask, outcome, options.get("max_age")), deadline
            )
        return calls.acquired(self._to_outcome(ask.key, outcome), deadline, options)

    def _wait_store(
        self, ask: AskAcquire, deadline: Deadline, held: Callable[[Held], None] | None = None
    ) -> StoreOutcome:
        """Ask until the key is not busy or ``deadline`` passes, woken by the watch hub; ``held``
        hears who holds it meanwhile."""
        with runtime().subscribe(self.store, ask.key) as subscription:
            loop = acquire_until(ask, deadline, self.backoff, subscription.is_following, held)
            return drive(loop, self.store, subscription)

    def wait(self, key: str | Key, **options: Unpack[WaitOptions]) -> Hit | None:
        """Wait until the key is done (a :class:`Hit`) or nobody holds it (``None``); reserve nothing.

        With ``for_artifact=True`` only an artifact ends the wait (what a sensor wants); an artifact
        ``max_age`` old (default: the client's), or stored under a token below ``min_token``, does
        not count. ``timeout``: seconds to wait at most (``None``: as long as it takes).
        ``decode=False`` waits for the artifact's record only: the hit's ``value`` is the stored
        :class:`~dibs.records.ArtifactRecord` itself, and a payload in the payload store is checked to
        be there whole (its size) but never opened; :meth:`decode` reads the value later, if wanted.
        """
        calls.checked("wait", options, WaitOptions)
        waiting = calls.WaitFor.of(self.settings, self.key(key), options)
        while True:
            try:
                return waiting.ended(self.artifacts, self._wait_state(waiting))
            except PayloadUnavailable:
                continue  # it went bad as it was decoded: a miss (logged); wait on for another

    def _wait_state(self, waiting: calls.WaitFor) -> KeyState:
        """:meth:`wait`'s state, before its artifact is decoded (``dibs wait`` streams a large one)."""
        store = waiting.through(self.store)
        holding.not_held_here(store, waiting.key)
        state = waiting.first_read(store)  # as in acquire: subscribe only once the key turns out busy
        if not waiting.settles(state) and not waiting.deadline.expired:
            with runtime().subscribe(store, waiting.key) as subscription:
                state = drive(waiting.loop(self.settings, subscription), store, subscription)
        return state

    def hold(
        self,
        got: Acquired | Lease | holding.HeldLease,
        work: Callable[[], T],
        *,
        failure_of: holding.FailureOf | None = None,
        logger: holding.Logger | None = None,
        emit: Emitter | None = None,
    ) -> RunReport:
        """Run ``work()`` while holding the lease: heartbeats, then complete or release (see
        :mod:`dibs.holding` for every decision). Returns how it went; ``report.value`` is the value.

        :param got: the lease, or a :class:`~dibs.holding.HeldLease` already keeping it (one that
            something else may end meanwhile: Airflow's ``on_kill``); then the other parameters are its.
        :param failure_of: how a failure of ``work`` is recorded (``None``: not as a failure);
            default ``Type: message``.
        :param logger: where the decisions are logged (an orchestrator's task logger, say).
        :param emit: the call's :class:`~dibs.events.Emitter`, to hear what happens (see :mod:`dibs.flow`).
        """
        held = calls.held_for(got, failure_of, logger, emit)
        started = time.monotonic()
        with holding.holding(self.store, held.lease.key):
            try:
                value = work()
            except BaseException as exc:
                held.fail(exc)
                raise
        return held.store(value, policy=self.on_store_unavailable, compute_seconds=time.monotonic() - started)

    def compute(
        self,
        key: str | Key,
        fn: Callable[..., Any],
        *,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        **options: Unpack[CallOptions],
    ) -> RunReport:
        """Get the key's value, computing it with ``fn(*args, **kwargs)`` only if nobody else does.

        Says how the value was obtained: ``computed``, ``waited``, ``hit``, or ``unreserved`` (the
        store was unreachable and ``on_store_unavailable="run"``). The options
        (:class:`~dibs.calls.CallOptions`): ``owner``, ``timeout``, ``max_age`` and ``refresh`` are
        :meth:`acquire`'s: an artifact that old, or any with ``refresh``, is computed again.
        ``observer`` hears this call's events (besides the client's and the process's observers).
        """
        calls.checked("compute", options, CallOptions)
        call = self.call(key, **options)
        return call.drive(flow.Steps(self, lambda: fn(*args, **(kwargs or {})), emit=call.emitter))

    def call(
        self,
        key: str | Key,
        *,
        resume: flow.Waiting | None = None,
        frontend: str = "python",
        clock: Callable[[], float] = time.monotonic,
        ttl: float | None = None,
        max_lease_age: float | None = None,
        on_store_unavailable: StoreUnavailablePolicy | None = None,
        **options: Unpack[CallOptions],
    ) -> flow.Call:
        """One compute-once call, not started: its flow and the emitter of its events (for front ends
        that drive the flow themselves, see :mod:`dibs.flow`). The options are :meth:`compute`'s;
        ``resume`` continues a call that waited elsewhere (``clock`` then must be ``time.time``, which
        a resumed wait can be measured on); ``ttl``, ``max_lease_age`` and ``on_store_unavailable``
        override the client's for this call."""
        calls.checked("call", options, CallOptions)
        k = self.key(key)
        owner = options.get("owner") or default_owner()
        timeout = validate_seconds("timeout", options.get("timeout"), allow_none=True, allow_zero=True)
        max_age, refresh = options.get("max_age"), options.get("refresh", False)
        ask = calls.ask_of(
            self.settings,
            k,
            owner,
            {"ttl": ttl, "max_lease_age": max_lease_age, "max_age": max_age, "refresh": refresh},
        )
        translate = calls.log_event if frontend == "python" else None  # the other front ends say it their way
        observers = (events.PROCESS, self.observers, translate, options.get("observer"))
        emitter = Emitter(k, owner, frontend, observers, store=self._store_kind)
        steps = flow.compute_once(
            ask,
            emitter=emitter,
            policy=on_store_unavailable or self.on_store_unavailable,
            timeout=timeout,
            max_age=calls.max_age_of(self.settings, max_age),
            resume=resume,
            clock=clock,
        )
        return flow.Call(steps, emitter)

    def run(self, key: str | Key, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """``fn(*args, **kwargs)``, computed once across every process racing on ``key``."""
        value: R = self.compute(key, fn, args=args, kwargs=kwargs).value
        return value

    @overload
    def reserved(self, fn: Callable[P, R], /) -> Callable[P, R]: ...

    @overload
    def reserved(
        self,
        fn: None = None,
        /,
        *,
        key: str | None = None,
        version: str | None = None,
        exclude: tuple[str, ...] = (),
        max_age: float | None = None,
        refresh: bool = False,
    ) -> _Decorator: ...

    def reserved(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        key: str | None = None,
        version: str | None = None,
        exclude: tuple[str, ...] = (),
        max_age: float | None = None,
        refresh: bool = False,
    ) -> Any:
        """Decorator: each distinct call computes once; the key is ``qualname[@version]/<digest>`` of the
        function's code and arguments (see :func:`dibs.derive_key`), or ``key`` formatted with the
        arguments. ``max_age`` and ``refresh`` are :meth:`compute`'s."""

        def decorate(func: Callable[P, R]) -> Callable[P, R]:
            @functools.wraps(func)
            def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
                name = (
                    keys.format_key(key, func, args, kwargs)
                    if key is not None
                    else keys.derive_key(func, args, kwargs, version=version, exclude=exclude)
                )
                report = self.compute(name, func, args=args, kwargs=kwargs, max_age=max_age, refresh=refresh)
                value: R = report.value
                return value

            return wrapper

        return decorate(fn) if fn is not None else decorate

    # -- hand-off ---------------------------------------------------------------------------------
    def resume(self, exported: str, *, verify: bool = True) -> Lease:
        """A lease exported by another process; verified with the store (:class:`LeaseLost` if stolen)."""
        lease = Lease(self, Lease.parse_export(exported))
        if verify:
            lease.verify()
        return lease

    # -- inspection and repair --------------------------------------------------------------------
    def status(self, key: str | Key) -> KeyState:
        return self.store.read(self.key(key))

    def list(self, namespace: str | None = None, *, all_namespaces: bool = False) -> Iterator[KeyState]:
        return self.store.list(None if all_namespaces else (namespace or self.namespace))

    def force_release(self, key: str | Key) -> bool:
        return self.store.force_release(self.key(key))

    def forget(self, key: str | Key) -> bool:
        return self.store.forget(self.key(key))

    def reap(self, *, all_namespaces: bool = False) -> int:
        """Clear expired leases nobody took over, and discard records that hold nothing (see
        :meth:`discard`); returns how many records changed."""
        return self.store.reap(None if all_namespaces else self.namespace)

    def discard(self, key: str | Key) -> bool:
        """Clear the key's record down to a tombstone if it holds nothing (no lease, artifact or
        failure), as a lock that is released for good should leave nothing behind but its fence (so
        tokens keep rising), and listings leave it out. ``True`` if the record changed."""
        return self.store.discard(self.key(key))

    def prune(self, older_than: float, *, all_namespaces: bool = False) -> int:
        """Clear artifacts (with their payloads) and failures older than ``older_than`` seconds (store
        clock) and records that hold nothing, never a key someone holds; returns how many records
        changed. Each leaves a tombstone that keeps the key's fence, so tokens never rewind."""
        seconds = validate_seconds("older_than", older_than, allow_zero=True)
        assert seconds is not None
        return self.store.prune(None if all_namespaces else self.namespace, seconds)

    # -- large artifacts as files and streams (dibs.payloads) ---------------------------------------
    def put_payload(
        self,
        source: bytes | bytearray | memoryview | str | PathLike[str] | IO[bytes],
        *,
        serializer: str = "bytes",
    ) -> Payload:
        """Store a file (path), a stream or bytes in the payload store, streaming; return the result
        from the work (or ``lease.complete`` it) and the lease publishes a reference to it without
        loading it. ``serializer`` names the format of the bytes (readers of the value decode it so)."""
        from dibs.payloads import streams

        return streams.put(self, source, serializer)

    def open_artifact(self, key: str | Key) -> IO[bytes]:
        """The key's artifact as stored, as a binary stream (checked as it is read: see
        :func:`dibs.payloads.streams.open_artifact`)."""
        from dibs.payloads import streams

        return streams.open_artifact(self, self.key(key))

    def artifact_path(self, key: str | Key) -> AbstractContextManager[Path]:
        """``with client.artifact_path(key) as path:`` the key's artifact as a local file, checked."""
        from dibs.payloads import streams

        return streams.artifact_path(self, self.key(key))

    def aio(self) -> AsyncReservations:
        """The async face of this client, sharing its store and settings."""
        return AsyncReservations(self)

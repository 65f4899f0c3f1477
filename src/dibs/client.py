"""The client: :class:`Reservations`, the contract's calls as a façade over the one flow.

Every call is a path of :mod:`dibs.flow`, which decides everything (owners and lease terms, waiting,
a store that cannot be reached, ``max_failures``, the hold), carried out in the caller's thread by
:class:`dibs.seam.StoreIO`; its async face, :class:`~dibs.aio.AsyncReservations` (``client.aio()``),
drives the same paths on an event loop. What a call takes is :mod:`dibs.options`; reading artifacts
back is :mod:`dibs.artifacts`; the Python front end's log lines are :mod:`dibs.logs`.

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

from dibs import events, flow, holding, keys
from dibs._closing import Closing
from dibs.aio import AsyncReservations
from dibs.artifacts import ArtifactReader
from dibs.backoff import Backoff, Outage
from dibs.config import default_owner, default_store_url, validate_seconds
from dibs.errors import ConfigurationError
from dibs.events import Emitter, Observation, Observer, Observers
from dibs.keys import Key
from dibs.lease import Lease
from dibs.logs import log_event
from dibs.options import (
    AcquireOptions,
    AcquireOrBusy,
    AcquireRaising,
    AskOptions,
    CallOptions,
    WaitOptions,
    ask_of,
    checked,
    max_age_of,
)
from dibs.outcomes import Acquired, Busy, Hit, Outcome, RunReport
from dibs.payloads import (
    DEFAULT_GRACE,
    DEFAULT_INLINE_LIMIT,
    Payload,
    PayloadStore,
    default_payloads_url,
    referencing,
    unread,
)
from dibs.records import ArtifactRecord, KeyState
from dibs.runtime import runtime
from dibs.seam import StoreIO, holding_what
from dibs.serializers import Serializer
from dibs.settings import Configured, Settings, StoreUnavailablePolicy
from dibs.steps import Waiting
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
        ``on_store_unavailable``, ``serializer``, ``signing_key``, ``backoff``, ``outage_patience``
        (see :class:`Settings`).
    :param payloads: a payload store (URL or :class:`~dibs.payloads.PayloadStore`) for artifacts
        larger than ``payload_inline_limit`` bytes (default 64 KiB); ``None``: ``DIBS_PAYLOADS_URL``,
        else, on the embedded SQLite database, the folder ``payloads`` beside its file, else every
        artifact stays in its record (:func:`dibs.payloads.default_payloads_url`). ``payload_grace``:
        see :mod:`dibs.payloads.collect`.
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
        outage_patience: float | None = DEFAULTS.outage_patience,
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
            "outage_patience": outage_patience,
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
        #: What this client's calls decide with (:class:`dibs.flow.Rules`), read from its settings once.
        self.rules = flow.Rules(
            self.settings.backoff, Outage(self.settings.outage_patience), self.settings.max_failures
        )
        #: Reads this client's artifacts back into values (:mod:`dibs.artifacts`).
        self.artifacts = ArtifactReader(self.settings, self.serializer)
        url: str | None = None
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
        payloads = payloads if payloads is not None else default_payloads_url(url)
        if payloads is not None:  # large artifacts apart (dibs.payloads): the record store stays as it is
            validate_seconds("payload_grace", payload_grace, allow_zero=True)
            self.store = referencing(
                self.store, payloads, inline_limit=payload_inline_limit, grace=payload_grace
            )
        self._closed = False
        #: The seam of this client's single asks (get_or_reserve): they never wait nor hold, so one
        #: seam, which keeps no state of theirs, serves all of them, from any thread.
        self._asks = StoreIO(self)
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

    # -- the contract's calls: each one path of the flow (dibs.flow), carried out in this thread ----------
    def get_or_reserve(
        self, key: str | Key, owner: str | None = None, **options: Unpack[AskOptions]
    ) -> Outcome:
        """One atomic call: :class:`Hit`, :class:`Acquired` or :class:`Busy` (see the contract).

        ``ttl`` and ``max_lease_age`` override the client's for this lease. ``max_age`` (default: the
        client's) makes an artifact that old a miss; ``refresh=True`` takes the lease even beside an
        artifact (its value replaces the old one); ``min_token`` takes only an artifact stored under
        that token or a later one (after a refresh found the key busy: ``min_token=busy.token``).
        """
        return self._asks.drive(self._asking(key, owner, options))

    def _asking(self, key: str | Key, owner: str | None, options: AskOptions) -> flow.Flow[Outcome]:
        """:meth:`get_or_reserve`'s flow (both faces drive the same)."""
        checked("get_or_reserve", options, AskOptions)
        return flow.reserve(ask_of(self.settings, self.key(key), owner, options), rules=self.rules)

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
        done or yours. The options (:class:`~dibs.options.AcquireOptions`):

        :param timeout: seconds to wait while someone else holds the key (``None``: as long as it takes).
        :param ttl: this lease's ttl (default: the client's); ``max_lease_age`` likewise.
        :param max_age: an artifact this old (store clock) is a miss (default: the client's).
        :param refresh: compute again even if an artifact exists, under the lease as always: of several
            concurrent refreshes one computes, and the others get its value.
        :param min_token: only an artifact stored under this token or a later one counts (a refresh
            that waits in several calls passes the first :class:`Busy`'s ``token``).
        :param raise_on_timeout: ``True`` (default) raises :class:`WaitTimeout` naming the holder when
            ``timeout`` passes; ``False`` returns the last :class:`Busy` instead.

        While it waits, a store that cannot be reached is waited for too (``outage_patience``).
        """
        path, emitter = self._acquiring(key, owner, options)
        answer: Hit | Acquired | Busy = StoreIO(self).drive(path, emitter)
        return answer

    def _acquiring(
        self, key: str | Key, owner: str | None, options: AcquireOptions
    ) -> tuple[flow.Flow[Outcome], events.LazyEmitter]:
        """:meth:`acquire`'s flow and the emitter of its outage events (both faces drive the same)."""
        checked("acquire", options, AcquireOptions)
        ask = ask_of(self.settings, self.key(key), owner, options)
        emitter = self._quiet_emitter(ask.key, ask.request.owner)
        path = flow.reserve(
            ask,
            rules=self.rules,
            emitter=emitter,
            timeout=validate_seconds("timeout", options.get("timeout"), allow_none=True, allow_zero=True),
            raise_on_timeout=options.get("raise_on_timeout", True),
            max_age=max_age_of(self.settings, options.get("max_age")),
        )
        return path, emitter

    def wait(
        self,
        key: str | Key,
        *,
        seen: Callable[[KeyState], None] | None = None,
        **options: Unpack[WaitOptions],
    ) -> Hit | None:
        """Wait until the key is done (a :class:`Hit`) or nobody holds it (``None``); reserve nothing.

        With ``for_artifact=True`` only an artifact ends the wait (what a sensor wants); an artifact
        ``max_age`` old (default: the client's), or stored under a token below ``min_token``, does
        not count. ``timeout``: seconds to wait at most (``None``: as long as it takes).
        ``decode=False`` waits for the artifact's record only: the hit's ``value`` is the stored
        :class:`~dibs.records.ArtifactRecord` itself, and a payload in the payload store is checked to
        be there whole (its size) but never opened; :meth:`decode` reads the value later, if wanted.
        A waiter holds nothing: a store that cannot be reached is waited for too (``outage_patience``),
        after the first read (``resumed=True``: from the first read on, for a wait that continues one).
        ``seen`` is shown every state of the key the wait reads or is notified of, the first included
        (who holds it, and when that changes); it must not raise.
        """
        path, emitter, store = self._waiting(key, options)
        return StoreIO(self, store=store, seen=seen).drive(path, emitter)

    def _waiting(
        self, key: str | Key, options: WaitOptions
    ) -> tuple[flow.Flow[Hit | None], events.LazyEmitter, Store]:
        """:meth:`wait`'s flow, the emitter of its outage events, and the store it reads through: a
        record-only wait reads a payload-referencing store's unread twin (:func:`dibs.payloads.unread`),
        which only asks the payload store whether the payload is there whole. It is one store per
        process, a view of the same records: it shares their watch hub (:mod:`dibs.hub`), so a
        record-only waiter costs no connection of its own."""
        checked("wait", options, WaitOptions)
        decode = options.get("decode", True)
        if not isinstance(decode, bool):  # decode=None would otherwise quietly mean record-only
            raise ConfigurationError(f"decode must be True or False, got {decode!r}")
        k = self.key(key)
        emitter = self._quiet_emitter(k, "")
        path = flow.wait_for(
            k,
            rules=self.rules,
            emitter=emitter,
            timeout=validate_seconds("timeout", options.get("timeout"), allow_none=True, allow_zero=True),
            for_artifact=options.get("for_artifact", False),
            max_age=max_age_of(self.settings, options.get("max_age")),
            min_token=options.get("min_token"),
            decode=decode,
            resumed=options.get("resumed", False),
        )
        return path, emitter, self.store if decode else unread(self.store, "size")

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

        :param got: the lease (or the :class:`Acquired` that holds it), or a
            :class:`~dibs.holding.HeldLease` already keeping it (one that something else may end
            meanwhile); then the other parameters are its.
        :param failure_of: how a failure of ``work`` is recorded (``None``: not as a failure);
            default ``Type: message``.
        :param logger: where the decisions are logged (an orchestrator's task logger, say).
        :param emit: the call's :class:`~dibs.events.Emitter`, to hear what happens.
        """
        acquired, keeping = holding_what(got)
        io = StoreIO(self, work, emit=emit, failure_of=failure_of, logger=logger, keeping=keeping)
        return io.drive(flow.hold(acquired, self.on_store_unavailable))

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
        (:class:`~dibs.options.CallOptions`): ``owner``, ``timeout``, ``max_age`` and ``refresh`` are
        :meth:`acquire`'s: an artifact that old, or any with ``refresh``, is computed again.
        ``observer`` hears this call's events (besides the client's and the process's observers).
        """
        call = self._calling("compute", key, options)
        return call.drive(StoreIO(self, lambda: fn(*args, **(kwargs or {})), emit=call.emitter))

    def _calling(self, name: str, key: str | Key, options: CallOptions) -> flow.Call:
        """:meth:`compute`'s call, its options checked as ``name``'s (both faces drive the same)."""
        checked(name, options, CallOptions)
        return self.call(key, **options)

    def call(
        self,
        key: str | Key,
        *,
        resume: Waiting | None = None,
        frontend: str = "python",
        clock: Callable[[], float] = time.monotonic,
        ttl: float | None = None,
        max_lease_age: float | None = None,
        on_store_unavailable: StoreUnavailablePolicy | None = None,
        progress_every: float | None = None,
        keep: bool = False,
        reenters: Callable[[str], bool] | None = None,
        **options: Unpack[CallOptions],
    ) -> flow.Call:
        """One compute-once call, not started: its flow and the emitter of its events (for front ends
        that drive the flow with a seam of their own, see :mod:`dibs.seam`). The options are
        :meth:`compute`'s; ``resume`` continues a call that waited elsewhere (``clock`` then must be
        ``time.time``, which a resumed wait can be measured on); ``ttl``, ``max_lease_age`` and
        ``on_store_unavailable`` override the client's for this call (the policy at its first ask and at
        its ``complete``); ``progress_every``, ``keep`` and ``reenters`` are
        :func:`dibs.flow.compute_once`'s."""
        checked("call", options, CallOptions)
        k = self.key(key)
        owner = options.get("owner")
        owner = default_owner() if owner is None else owner  # "" is refused, as the contract says
        timeout = validate_seconds("timeout", options.get("timeout"), allow_none=True, allow_zero=True)
        progress_every = validate_seconds("progress_every", progress_every, allow_none=True)
        max_age, refresh = options.get("max_age"), options.get("refresh", False)
        ask = ask_of(
            self.settings,
            k,
            owner,
            {"ttl": ttl, "max_lease_age": max_lease_age, "max_age": max_age, "refresh": refresh},
        )
        translate = log_event if frontend == "python" else None  # the other front ends say it their way
        observers = (events.PROCESS, self.observers, translate, options.get("observer"))
        emitter = Emitter(k, owner, frontend, observers, store=self._store_kind)
        steps = flow.compute_once(
            ask,
            emitter=emitter,
            rules=self.rules,
            policy=on_store_unavailable or self.on_store_unavailable,
            timeout=timeout,
            max_age=max_age_of(self.settings, max_age),
            resume=resume,
            clock=clock,
            progress_every=progress_every,
            keep=keep,
            reenters=reenters,
        )
        return flow.Call(steps, emitter)

    def release_own(
        self, key: str | Key, owns: Callable[[str], bool], error: str | None = None
    ) -> flow.Released:
        """Give back the live lease on ``key`` of an owner ``owns`` recognises, from a process that does
        not have the lease in hand (a lock released from another copy of its manager, a ``dibs run``
        stopped just as its lease was granted), recording ``error``; see :func:`dibs.flow.release_own`."""
        return StoreIO(self).drive(flow.release_own(self.key(key), owns, ttl=self.ttl, error=error))

    def _quiet_emitter(self, key: Key, owner: str) -> events.LazyEmitter:
        """The emitter of a call that reports only a store outage (``acquire``, ``wait``), built only if
        it has one to report."""
        return events.LazyEmitter(
            lambda: Emitter(
                key, owner, "python", (events.PROCESS, self.observers, log_event), store=self._store_kind
            )
        )

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

    def reap(self, *, all_namespaces: bool = False, progress: Callable[[int], None] | None = None) -> int:
        """Clear expired leases nobody took over, and discard records that hold nothing (see
        :meth:`discard`); returns how many records changed. ``progress``, when given, is told now and
        then how many have changed so far."""
        namespace = None if all_namespaces else self.namespace
        if progress is None:  # a store of another package may not take it
            return self.store.reap(namespace)
        return self.store.reap(namespace, progress=progress)

    def discard(self, key: str | Key) -> bool:
        """Clear the key's record down to a tombstone if it holds nothing (no lease, artifact or
        failure), as a lock that is released for good should leave nothing behind but its fence (so
        tokens keep rising), and listings leave it out. ``True`` if the record changed."""
        return self.store.discard(self.key(key))

    def prune(
        self,
        older_than: float,
        *,
        all_namespaces: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Clear artifacts (with their payloads) and failures older than ``older_than`` seconds (store
        clock) and records that hold nothing, never a key someone holds; returns how many records
        changed. Each leaves a tombstone that keeps the key's fence, so tokens never rewind.
        ``progress``, when given, is told now and then how many have changed so far."""
        seconds = validate_seconds("older_than", older_than, allow_zero=True)
        assert seconds is not None
        namespace = None if all_namespaces else self.namespace
        if progress is None:  # a store of another package may not take it
            return self.store.prune(namespace, seconds)
        return self.store.prune(namespace, seconds, progress=progress)

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

"""The client: :class:`Reservations` turns the store's one-attempt operations into compute-once calls.

Policy lives here, once, above every store: owners, ttl and heartbeats, waiting (through the watch
hub and :mod:`dibs._waiting`), serialization and integrity checks, the maximum number of recorded
failures, and what to do when the store is unreachable (through :mod:`dibs.holding`).

Clients are cheap: every client of a process built for one store URL shares one store object, one
connection pool and one watch hub (:mod:`dibs.runtime`), so building one per task, per request or per
deferred trigger costs nothing but the object.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager
from os import PathLike
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal, ParamSpec, Protocol, TypeVar, overload

from dibs import events, flow, holding, keys
from dibs._closing import Closing
from dibs._waiting import AskAcquire, Loop, acquire_until, adrive, drive, is_settled, read_until
from dibs.backoff import Backoff, Deadline
from dibs.config import default_owner, default_store_url, validate_seconds
from dibs.errors import (
    ConfigurationError,
    ReservationError,
    SerializationError,
    TooManyFailures,
    WaitTimeout,
)
from dibs.events import Emitter, Event, Observation, Observer, Observers
from dibs.keys import Key
from dibs.lease import Lease
from dibs.outcomes import Acquired, Busy, Hit, Outcome, RunReport
from dibs.payloads import (
    DEFAULT_GRACE,
    DEFAULT_INLINE_LIMIT,
    REFERENCE,
    Payload,
    PayloadStore,
    default_payloads_url,
    referencing,
)
from dibs.records import ArtifactRecord, FailureRecord, Granted, Held, KeyState, Present, StoreOutcome
from dibs.runtime import runtime
from dibs.serializers import (
    BytesSerializer,
    JSONSerializer,
    Serializer,
    SignedPickleSerializer,
    load_artifact,
    resolve_serializer,
)
from dibs.settings import Settings, StoreUnavailablePolicy, validate_timings
from dibs.stores import AcquireRequest, Store, redact_url

if TYPE_CHECKING:
    from concurrent.futures import Future

    from dibs.hub import Subscription

__all__ = ["AsyncReservations", "Reservations"]

log = logging.getLogger("dibs")

#: The settings of a client built without any (their values are the constructor's defaults).
DEFAULTS = Settings()

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

#: Artifacts larger than this are decoded in the I/O executor by async callers, never on their loop.
_DECODE_ON_LOOP_BYTES = 64 * 1024
#: Serializers whose value depends on the payload alone (no key, no signature): safe to share.
_SHAREABLE_SERIALIZERS = frozenset({"json", "bytes"})
_SHAREABLE_READERS = frozenset({JSONSerializer, BytesSerializer})
#: Values no caller can change, so every waiter may get the same object.
_IMMUTABLE = frozenset({str, bytes, int, float, bool, type(None)})
#: Decoded values by artifact record (records read together are one object, equal records one entry).
_DECODED: weakref.WeakKeyDictionary[ArtifactRecord, tuple[Key, Any]] = weakref.WeakKeyDictionary()
_DECODED_LOCK = threading.Lock()


class _Decorator(Protocol):
    def __call__(self, fn: Callable[P, R], /) -> Callable[P, R]: ...


class Reservations(Closing):
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

    # -- settings, for reading ----------------------------------------------------------------------
    @property
    def namespace(self) -> str:
        return self.settings.namespace

    @property
    def ttl(self) -> float:
        return self.settings.ttl

    @property
    def heartbeat_interval(self) -> float:
        return self.settings.heartbeat_every

    @property
    def max_lease_age(self) -> float | None:
        return self.settings.max_lease_age

    @property
    def max_age(self) -> float | None:
        return self.settings.max_age

    @property
    def max_failures(self) -> int | None:
        return self.settings.max_failures

    @property
    def on_store_unavailable(self) -> StoreUnavailablePolicy:
        return self.settings.on_store_unavailable

    @property
    def backoff(self) -> Backoff:
        return self.settings.backoff

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

    def _terms(self, ttl: float | None, max_lease_age: float | None) -> tuple[float, float | None]:
        """The ttl and maximum age of one lease: the call's, else the client's; checked together."""
        ttl = self.ttl if ttl is None else ttl
        max_lease_age = self.max_lease_age if max_lease_age is None else max_lease_age
        checked_ttl, _, checked_age = validate_timings(ttl=ttl, max_lease_age=max_lease_age)
        assert checked_ttl is not None
        return checked_ttl, checked_age

    def _ask(
        self,
        key: Key,
        owner: str | None,
        ttl: float | None,
        max_lease_age: float | None,
        *,
        max_age: float | None = None,
        refresh: bool = False,
        min_token: int | None = None,
    ) -> AskAcquire:
        """One ask: the lease's terms, and which artifact counts (a refresh takes none that exists)."""
        max_age = 0.0 if refresh else self._max_age(max_age)
        if min_token is not None and (isinstance(min_token, bool) or not isinstance(min_token, int)):
            raise ConfigurationError(f"min_token must be a lease's token (an int), got {min_token!r}")
        terms = self._terms(ttl, max_lease_age)
        return AskAcquire(key, AcquireRequest(owner or default_owner(), *terms, max_age, min_token))

    def _max_age(self, max_age: float | None) -> float | None:
        """The call's maximum artifact age, else the client's; checked."""
        return validate_seconds("max_age", max_age, allow_none=True) if max_age is not None else self.max_age

    def _ask_again(self, first: AskAcquire, answer: StoreOutcome, max_age: float | None) -> AskAcquire:
        """The ask a waiter repeats. After a refresh found the key busy, the artifact the busy lease
        stores (or a later one) is the fresh one: concurrent refreshes compute once, and share it."""
        if first.refreshing and isinstance(answer, Held):
            return first.sharing(answer.lease.token.fence, self._max_age(max_age))
        return first

    def _ask_store(self, ask: AskAcquire) -> StoreOutcome:
        return self.store.acquire(ask.key, ask.request)

    def decode(self, key: Key, artifact: ArtifactRecord) -> Any:
        """The value of a stored artifact, after its integrity check.

        An immutable value of a keyless serializer (JSON, bytes) is decoded once per process: a
        thousand waiters handed one artifact share its value (:data:`_DECODED`)."""
        if artifact.serializer == REFERENCE:  # read through a client without the payload store
            raise ConfigurationError(
                f"artifact of {key} is kept in a payload store (its record holds a reference); give this "
                "client the writers' payload store: Reservations(..., payloads=URL) or DIBS_PAYLOADS_URL",
                key=str(key),
            )
        shared = artifact.serializer in _SHAREABLE_SERIALIZERS
        if shared:
            shared = type(self._reader_for(key, artifact.serializer)) in _SHAREABLE_READERS
        if shared:
            with _DECODED_LOCK:
                cached = _DECODED.get(artifact)
            if cached is not None and cached[0] == key:
                return cached[1]
        payload = artifact.verified_payload(key)
        reader = self._reader_for(key, artifact.serializer)
        value = self._load(key, artifact, reader, payload)
        if shared and type(value) in _IMMUTABLE:
            with _DECODED_LOCK:
                _DECODED[artifact] = (key, value)
        return value

    def _load(self, key: Key, artifact: ArtifactRecord, reader: Serializer, payload: bytes) -> Any:
        try:
            return load_artifact(reader, payload, key, artifact.fence)  # signatures bind key + fence
        except ReservationError as exc:
            if str(key) in str(exc):
                raise
            # A serializer does not know which key it reads: a refused signature must still say where.
            raise type(exc)(f"artifact of {key}: {exc}", **{**exc.fields, "key": str(key)}) from exc
        except Exception as exc:
            raise SerializationError(
                f"artifact of {key} could not be read by serializer {artifact.serializer!r}: "
                f"{type(exc).__name__}: {exc}",
                key=str(key),
            ) from exc

    def _reader_for(self, key: Key, name: str) -> Serializer:
        # An artifact is read with the serializer that wrote it, but never with one that would be
        # unsafe: a pickle is only read when this client has a signing key to check it with.
        if name == self.serializer.name:
            return self.serializer
        if name in {"json", "bytes"}:
            return resolve_serializer(name)
        if name == SignedPickleSerializer.name and self.settings.signing_key is not None:
            return SignedPickleSerializer(self.settings.signing_key)
        raise SerializationError(
            f"artifact of {key} was written with serializer {name!r}, which this client (serializer "
            f"{self.serializer.name!r}) cannot read safely; configure the writer's serializer "
            "(and signing key) here too",
            key=str(key),
        )

    def _hit(self, key: Key, artifact: ArtifactRecord) -> Hit:
        return Hit(
            key=key,
            value=self.decode(key, artifact),
            producer=artifact.producer,
            created_at=artifact.created_at,
            token=artifact.fence,
            serializer=artifact.serializer,
            size=artifact.size,
            compute_seconds=artifact.compute_seconds,
        )

    def _refused(self, outcome: StoreOutcome) -> FailureRecord | None:
        """The failure record that makes ``max_failures`` refuse a granted lease, if it does."""
        if isinstance(outcome, Granted) and self.max_failures is not None:
            failure = outcome.failure
            if failure is not None and failure.count >= self.max_failures:
                return failure
        return None

    def _to_outcome(self, key: Key, outcome: StoreOutcome) -> Outcome:
        if isinstance(outcome, Present):
            return self._hit(key, outcome.artifact)
        if isinstance(outcome, Granted):
            lease = Lease(self, outcome.lease)
            failure = self._refused(outcome)
            if failure is not None:
                lease.release()  # not a new failure: we refuse to run, we did not fail
                raise TooManyFailures(
                    f"{lease.key} failed {failure.count} times (max_failures={self.max_failures}); last "
                    f"error from {failure.owner!r}: {failure.error}. Fix the cause, then run "
                    f"'dibs forget {lease.key.name!r} --namespace {lease.key.namespace}' to try again",
                    key=str(lease.key),
                    failures=failure.count,
                )
            return Acquired(lease, outcome.took_over_from, outcome.failure)
        held = outcome.lease
        return Busy(
            key=held.key,
            holder=held.owner,
            since=held.acquired_at,
            expires_at=held.expires_at,
            attempt=held.attempt,
            now=outcome.now,
            last_failure=outcome.failure,
            token=held.token.fence,
        )

    # -- the contract's calls -------------------------------------------------------------------
    def get_or_reserve(
        self,
        key: str | Key,
        owner: str | None = None,
        *,
        ttl: float | None = None,
        max_lease_age: float | None = None,
        max_age: float | None = None,
        refresh: bool = False,
        min_token: int | None = None,
    ) -> Outcome:
        """One atomic call: :class:`Hit`, :class:`Acquired` or :class:`Busy` (see the contract).

        ``ttl`` and ``max_lease_age`` override the client's for this lease. ``max_age`` (default: the
        client's) makes an artifact that old a miss; ``refresh=True`` takes the lease even beside an
        artifact (its value replaces the old one); ``min_token`` takes only an artifact stored under
        that token or a later one (after a refresh found the key busy: ``min_token=busy.token``).
        """
        ask = self._ask(
            self.key(key), owner, ttl, max_lease_age, max_age=max_age, refresh=refresh, min_token=min_token
        )
        return self._to_outcome(ask.key, self._ask_store(ask))

    @overload
    def acquire(
        self,
        key: str | Key,
        owner: str | None = None,
        *,
        timeout: float | None = None,
        ttl: float | None = None,
        max_lease_age: float | None = None,
        max_age: float | None = None,
        refresh: bool = False,
        min_token: int | None = None,
        raise_on_timeout: Literal[True] = True,
    ) -> Hit | Acquired: ...

    @overload
    def acquire(
        self,
        key: str | Key,
        owner: str | None = None,
        *,
        timeout: float | None = None,
        ttl: float | None = None,
        max_lease_age: float | None = None,
        max_age: float | None = None,
        refresh: bool = False,
        min_token: int | None = None,
        raise_on_timeout: Literal[False],
    ) -> Hit | Acquired | Busy: ...

    def acquire(
        self,
        key: str | Key,
        owner: str | None = None,
        *,
        timeout: float | None = None,
        ttl: float | None = None,
        max_lease_age: float | None = None,
        max_age: float | None = None,
        refresh: bool = False,
        min_token: int | None = None,
        raise_on_timeout: bool = True,
    ) -> Hit | Acquired | Busy:
        """Wait (woken by the process's watch hub, asking now and then as a backstop) until the key is
        done or yours.

        :param timeout: seconds to wait while someone else holds the key (``None``: as long as it takes).
        :param ttl: this lease's ttl (default: the client's); ``max_lease_age`` likewise.
        :param max_age: an artifact this old (store clock) is a miss (default: the client's).
        :param refresh: compute again even if an artifact exists, under the lease as always: of several
            concurrent refreshes one computes, and the others get its value.
        :param min_token: only an artifact stored under this token or a later one counts (a refresh
            that waits in several calls passes the first :class:`Busy`'s ``token``).
        :param raise_on_timeout: ``True`` raises :class:`WaitTimeout` naming the holder when ``timeout``
            passes; ``False`` returns the last :class:`Busy` instead.
        """
        ask = self._ask(
            self.key(key), owner, ttl, max_lease_age, max_age=max_age, refresh=refresh, min_token=min_token
        )
        result, _ = self._acquire(ask, Deadline(timeout), max_age, raise_on_timeout)
        return result

    def _acquire(
        self, ask: AskAcquire, deadline: Deadline, max_age: float | None, raise_on_timeout: bool
    ) -> tuple[Hit | Acquired | Busy, Held | None]:
        """:meth:`acquire`, and the busy answer it waited on first (``None``: it did not wait)."""
        holding.not_held_here(self.store, ask.key)
        # Most calls are answered at once (a hit, or a free key), so ask before subscribing; a busy
        # key subscribes, and the loop asks again before it waits, so no change is missed.
        outcome = self._ask_store(ask)
        first = outcome if isinstance(outcome, Held) else None
        if first is not None and not deadline.expired:
            ask = self._ask_again(ask, first, max_age)
            outcome = self._wait_store(ask, deadline)
        result = self._to_outcome(ask.key, outcome)
        if isinstance(result, Busy) and raise_on_timeout:
            raise _gave_up(result.key, deadline, busy=result)
        return result, first

    def _wait_store(
        self, ask: AskAcquire, deadline: Deadline, held: Callable[[Held], None] | None = None
    ) -> StoreOutcome:
        """Ask until the key is not busy or ``deadline`` passes, woken by the watch hub; ``held``
        hears who holds it meanwhile."""
        with runtime().subscribe(self.store, ask.key) as subscription:
            loop = acquire_until(ask, deadline, self.backoff, lambda: subscription.following, held)
            return drive(loop, self.store, subscription)

    def wait(
        self,
        key: str | Key,
        *,
        timeout: float | None = None,
        for_artifact: bool = False,
        max_age: float | None = None,
        min_token: int | None = None,
    ) -> Hit | None:
        """Wait until the key is done (a :class:`Hit`) or nobody holds it (``None``); reserve nothing.

        With ``for_artifact=True`` only an artifact ends the wait (what a sensor wants); an artifact
        ``max_age`` old (default: the client's), or stored under a token below ``min_token``, does
        not count.
        """
        k = self.key(key)
        max_age = self._max_age(max_age)
        deadline = Deadline(timeout)
        state = self._wait_state(k, deadline, for_artifact, max_age, min_token)
        return self._settled(state, deadline, for_artifact, max_age, min_token)

    def _wait_state(
        self, k: Key, deadline: Deadline, for_artifact: bool, max_age: float | None, min_token: int | None
    ) -> KeyState:
        """:meth:`wait`'s state, before its artifact is decoded (``dibs wait`` streams a large one)."""
        holding.not_held_here(self.store, k)
        state = self.store.read(k)  # as in acquire: subscribe only once the key turns out to be busy
        if not is_settled(state, for_artifact, max_age, min_token) and not deadline.expired:
            with runtime().subscribe(self.store, k) as subscription:
                loop = self._read_until(
                    k, deadline, subscription, for_artifact=for_artifact, max_age=max_age, min_token=min_token
                )
                state = drive(loop, self.store, subscription)
        return state

    def _read_until(
        self,
        k: Key,
        deadline: Deadline,
        subscription: Subscription,
        *,
        for_artifact: bool,
        max_age: float | None,
        min_token: int | None,
    ) -> Loop[KeyState]:
        """The waiting loop of :meth:`wait` (and its async twin), woken by ``subscription``; each
        driver runs it with its own I/O (:func:`dibs._waiting.drive` or ``adrive``)."""
        return read_until(
            k,
            deadline,
            self.backoff,
            lambda: subscription.following,
            for_artifact=for_artifact,
            max_age=max_age,
            min_fence=min_token,
        )

    def _settled(
        self,
        state: KeyState,
        deadline: Deadline,
        for_artifact: bool,
        max_age: float | None = None,
        min_token: int | None = None,
    ) -> Hit | None:
        artifact = state.artifact
        if artifact is not None and artifact.is_fresh(state.now, max_age=max_age, min_fence=min_token):
            return self._hit(state.key, artifact)
        if state.live_lease is not None or for_artifact:
            raise _gave_up(state.key, deadline, state=state)
        return None

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
        held = _held(got, failure_of, logger, emit)
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
        owner: str | None = None,
        timeout: float | None = None,
        max_age: float | None = None,
        refresh: bool = False,
        observer: Observer | None = None,
    ) -> RunReport:
        """Get the key's value, computing it with ``fn(*args, **kwargs)`` only if nobody else does.

        Says how the value was obtained: ``computed``, ``waited``, ``hit``, or ``unreserved`` (the
        store was unreachable and ``on_store_unavailable="run"``). ``max_age`` and ``refresh`` are
        :meth:`acquire`'s: an artifact that old, or any with ``refresh``, is computed again.
        ``observer`` hears this call's events (besides the client's and the process's observers).
        """
        call = self.call(
            key, owner=owner, timeout=timeout, max_age=max_age, refresh=refresh, observer=observer
        )
        return call.drive(flow.Steps(self, lambda: fn(*args, **(kwargs or {})), emit=call.emitter))

    def call(
        self,
        key: str | Key,
        *,
        owner: str | None = None,
        timeout: float | None = None,
        max_age: float | None = None,
        refresh: bool = False,
        resume: flow.Waiting | None = None,
        frontend: str = "python",
        observer: Observer | None = None,
        clock: Callable[[], float] = time.monotonic,
        ttl: float | None = None,
        max_lease_age: float | None = None,
        on_store_unavailable: StoreUnavailablePolicy | None = None,
    ) -> flow.Call:
        """One compute-once call, not started: its flow and the emitter of its events (for front ends
        that drive the flow themselves, see :mod:`dibs.flow`). ``resume`` continues a call that waited
        elsewhere (``clock`` then must be ``time.time``, which a resumed wait can be measured on);
        ``ttl``, ``max_lease_age`` and ``on_store_unavailable`` override the client's for this call."""
        k = self.key(key)
        owner = owner or default_owner()
        timeout = validate_seconds("timeout", timeout, allow_none=True, allow_zero=True)
        ask = self._ask(k, owner, ttl, max_lease_age, max_age=max_age, refresh=refresh)
        translate = _log_event if frontend == "python" else None  # the other front ends say it their way
        observers = (events.PROCESS, self.observers, translate, observer)
        emitter = Emitter(k, owner, frontend, observers, store=self._store_kind)
        steps = flow.compute_once(
            ask,
            emitter=emitter,
            policy=on_store_unavailable or self.on_store_unavailable,
            timeout=timeout,
            max_age=self._max_age(max_age),
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


class AsyncReservations:
    """The same calls for event loops (Airflow's triggerer, async Prefect tasks, services).

    Waiting awaits the watch hub (a future on the caller's loop, no thread per waiter), and every store
    operation runs in the runtime's small I/O executor (:mod:`dibs.runtime`), never on the loop and
    never in the loop's default executor. The decisions are the sync client's: the same waiting loops
    and the same hold decisions, only awaited.
    """

    def __init__(self, client: Reservations) -> None:
        self.client = client

    async def _outcome(self, key: Key, outcome: StoreOutcome) -> Outcome:
        """The sync client's outcome, built off the loop when that costs I/O or a large decode."""
        c = self.client
        large = isinstance(outcome, Present) and outcome.artifact.size > _DECODE_ON_LOOP_BYTES
        if large or c._refused(outcome) is not None:
            return await runtime().io(c._to_outcome, key, outcome)
        return c._to_outcome(key, outcome)

    async def get_or_reserve(
        self,
        key: str | Key,
        owner: str | None = None,
        *,
        ttl: float | None = None,
        max_lease_age: float | None = None,
        max_age: float | None = None,
        refresh: bool = False,
        min_token: int | None = None,
    ) -> Outcome:
        """:meth:`Reservations.get_or_reserve`, awaited."""
        c = self.client
        ask = c._ask(
            c.key(key), owner, ttl, max_lease_age, max_age=max_age, refresh=refresh, min_token=min_token
        )
        return await self._outcome(ask.key, await _AsyncStoreIO(c).acquire(ask))

    @overload
    async def acquire(
        self,
        key: str | Key,
        owner: str | None = None,
        *,
        timeout: float | None = None,
        ttl: float | None = None,
        max_lease_age: float | None = None,
        max_age: float | None = None,
        refresh: bool = False,
        min_token: int | None = None,
        raise_on_timeout: Literal[True] = True,
    ) -> Hit | Acquired: ...

    @overload
    async def acquire(
        self,
        key: str | Key,
        owner: str | None = None,
        *,
        timeout: float | None = None,
        ttl: float | None = None,
        max_lease_age: float | None = None,
        max_age: float | None = None,
        refresh: bool = False,
        min_token: int | None = None,
        raise_on_timeout: Literal[False],
    ) -> Hit | Acquired | Busy: ...

    async def acquire(
        self,
        key: str | Key,
        owner: str | None = None,
        *,
        timeout: float | None = None,
        ttl: float | None = None,
        max_lease_age: float | None = None,
        max_age: float | None = None,
        refresh: bool = False,
        min_token: int | None = None,
        raise_on_timeout: bool = True,
    ) -> Hit | Acquired | Busy:
        """:meth:`Reservations.acquire`, awaited."""
        c = self.client
        ask = c._ask(
            c.key(key), owner, ttl, max_lease_age, max_age=max_age, refresh=refresh, min_token=min_token
        )
        result, _ = await self._acquire(ask, Deadline(timeout), max_age, raise_on_timeout)
        return result

    async def _acquire(
        self, ask: AskAcquire, deadline: Deadline, max_age: float | None, raise_on_timeout: bool
    ) -> tuple[Hit | Acquired | Busy, Held | None]:
        c = self.client
        holding.not_held_here(c.store, ask.key)
        io = _AsyncStoreIO(c)
        outcome = await io.acquire(ask)
        first = outcome if isinstance(outcome, Held) else None
        if first is not None and not deadline.expired:
            ask = c._ask_again(ask, first, max_age)
            outcome = await self._wait_store(ask, deadline)
        result = await self._outcome(ask.key, outcome)
        if isinstance(result, Busy) and raise_on_timeout:
            raise _gave_up(result.key, deadline, busy=result)
        return result, first

    async def _ask_store(self, ask: AskAcquire) -> StoreOutcome:
        """One ask in the I/O executor; a cancelled caller leaves nothing held (:class:`_AsyncStoreIO`)."""
        return await _AsyncStoreIO(self.client).acquire(ask)

    async def _wait_store(
        self, ask: AskAcquire, deadline: Deadline, held: Callable[[Held], None] | None = None
    ) -> StoreOutcome:
        """:meth:`Reservations._wait_store`, awaited on the watch hub (no thread per waiter)."""
        c = self.client
        with runtime().subscribe(c.store, ask.key) as subscription:
            loop = acquire_until(ask, deadline, c.backoff, lambda: subscription.following, held)
            return await adrive(loop, _AsyncStoreIO(c), subscription)

    async def wait(
        self,
        key: str | Key,
        *,
        timeout: float | None = None,
        for_artifact: bool = False,
        max_age: float | None = None,
        min_token: int | None = None,
        seen: Callable[[KeyState], None] | None = None,
    ) -> Hit | None:
        """:meth:`Reservations.wait`, awaited.

        ``seen`` is shown every state of the key this wait reads or is notified of, the first one
        included, so a watcher can say who holds the key and when that changes without reading it
        again (Airflow's trigger logs it); it must not raise.
        """
        c = self.client
        k = c.key(key)
        max_age = c._max_age(max_age)
        holding.not_held_here(c.store, k)
        deadline = Deadline(timeout)
        io = _AsyncStoreIO(c)
        state = await io.read(k)
        if seen is not None:
            seen(state)
        if not is_settled(state, for_artifact, max_age, min_token) and not deadline.expired:
            with runtime().subscribe(c.store, k) as subscription:
                loop = c._read_until(
                    k, deadline, subscription, for_artifact=for_artifact, max_age=max_age, min_token=min_token
                )
                state = await adrive(loop, io, subscription, seen)
        if state.artifact is not None and state.artifact.size > _DECODE_ON_LOOP_BYTES:
            return await runtime().io(c._settled, state, deadline, for_artifact, max_age, min_token)
        return c._settled(state, deadline, for_artifact, max_age, min_token)

    async def status(self, key: str | Key) -> KeyState:
        return await runtime().io(self.client.status, key)

    async def hold(
        self,
        got: Acquired | Lease | holding.HeldLease,
        work: Callable[[], Awaitable[T]],
        *,
        failure_of: holding.FailureOf | None = None,
        logger: holding.Logger | None = None,
        emit: Emitter | None = None,
    ) -> RunReport:
        """:meth:`Reservations.hold` for a coroutine: the same decisions, with the store's part in the
        I/O executor. Heartbeats run in their own thread, so they go on even while the work hogs the loop.
        A cancelled work releases its lease (recorded as stopped) even if it is cancelled again meanwhile.
        """
        import asyncio

        rt = runtime()
        held = _held(got, failure_of, logger, emit)
        started = time.monotonic()
        with holding.holding(self.client.store, held.lease.key):
            try:
                value = await work()
            except BaseException as exc:
                # Shielded: a second cancellation must not stop the release that frees the key.
                await asyncio.shield(rt.io(held.fail, exc))
                raise
        policy = self.client.on_store_unavailable
        seconds = time.monotonic() - started
        return await rt.io(functools.partial(held.store, value, policy=policy, compute_seconds=seconds))

    async def compute(
        self,
        key: str | Key,
        fn: Callable[..., Awaitable[Any]],
        *,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        owner: str | None = None,
        timeout: float | None = None,
        max_age: float | None = None,
        refresh: bool = False,
        observer: Observer | None = None,
    ) -> RunReport:
        """:meth:`Reservations.compute` for a coroutine function."""
        call = self.client.call(
            key, owner=owner, timeout=timeout, max_age=max_age, refresh=refresh, observer=observer
        )
        steps = flow.AsyncSteps(self, lambda: fn(*args, **(kwargs or {})), emit=call.emitter)
        return await call.adrive(steps)

    async def run(
        self, key: str | Key, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs
    ) -> R:
        """``await fn(*args, **kwargs)``, computed once across every process racing on ``key``."""
        value: R = (await self.compute(key, fn, args=args, kwargs=kwargs)).value
        return value


class _AsyncStoreIO:
    """A store's reads and asks for :func:`dibs._waiting.adrive`, each run in the runtime's I/O executor."""

    def __init__(self, client: Reservations) -> None:
        self._client = client

    async def acquire(self, ask: AskAcquire) -> StoreOutcome:
        """One ask in the I/O executor. A cancelled caller leaves nothing held.

        Cancelling the await does not stop a store call already running in the executor thread: the
        store may still grant the lease after the caller has gone, and then nobody would hold it but
        the store, for a whole ttl (issue 16, item 4). So the call is a ``concurrent.futures`` future
        of our own: when the awaiting coroutine is cancelled, a callback on that future releases any
        lease it grants. The callback runs when the store call ends, in the executor, whatever the
        event loop does meanwhile (a second cancel, the loop closing): the release is shielded.
        """
        import asyncio

        client = self._client
        future = runtime().executor().submit(client._ask_store, ask)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.add_done_callback(functools.partial(_release_unreceived, client, ask))
            raise

    async def read(self, key: Key) -> KeyState:
        return await runtime().read(self._client.store, key)


def _release_unreceived(client: Reservations, ask: AskAcquire, future: Future[StoreOutcome]) -> None:
    """``future`` (a store ask whose caller was cancelled) ended: release the lease it granted, if any.

    Not a failure (the caller was stopped before it could start), so nothing is recorded. Never raises:
    this runs in an executor's callback, where an exception would only be logged by the executor.
    """
    if future.cancelled() or future.exception() is not None:
        return  # never ran, or the store refused: nothing was granted
    outcome = future.result()
    if not isinstance(outcome, Granted) or not _granted_by_this_ask(outcome):
        return
    if not threading.current_thread().name.startswith(runtime().IO_THREAD_PREFIX):
        # The store answered before the cancellation landed, so this runs where the callback was
        # added (an event loop's thread): do the store call in the executor instead of blocking it.
        try:
            runtime().executor().submit(_release_quietly, client, ask.key, outcome)
            return
        except RuntimeError:  # the executor is shut down (interpreter exit): release here
            pass
    _release_quietly(client, ask.key, outcome)


def _granted_by_this_ask(outcome: Granted) -> bool:
    """Whether the ask made this lease (new, or taken over) rather than re-entering one its owner
    already held: that one belongs to whoever took it first, and a cancelled re-entry must not free it.
    The store says which (:attr:`~dibs.records.Granted.reentered`)."""
    return not outcome.reentered


def _release_quietly(client: Reservations, key: Key, outcome: Granted) -> None:
    try:
        client.store.release(key, outcome.lease.token, None)
    except Exception as exc:  # lost meanwhile, or the store is unreachable: the lease expires after its ttl
        log.warning(
            "%s: the lease granted to a cancelled acquire could not be released (%s); "
            "it expires after its ttl",
            key,
            exc,
        )
    else:
        log.info("%s: released the lease granted to a cancelled acquire (token %s)", key, outcome.lease.token)


def _held(
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


class _LogEvents:
    """The Python front end's log lines: the ``dibs`` logger's words for a few of the flow's events
    (only these are built when nobody else listens)."""

    kinds = frozenset({events.ArtifactFound, events.LeaseAcquired, events.RanUnreserved, events.Finished})

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


_log_event = _LogEvents()


def _gave_up(
    key: Key, deadline: Deadline, *, busy: Busy | None = None, state: KeyState | None = None
) -> WaitTimeout:
    """The one wording of every wait that timed out: who holds the key, or why nobody does."""
    if busy is None and state is not None and state.live_lease is not None:
        lease = state.live_lease
        busy = Busy(
            key, lease.owner, lease.acquired_at, lease.expires_at, lease.attempt, state.now, state.failure
        )
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

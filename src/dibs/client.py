"""The client: :class:`Reservations` turns the store's one-attempt operations into compute-once calls.

Everything that is policy lives here, once, above every store: owners, ttl and heartbeats, waiting
and backoff (through :mod:`dibs.waiting`), serialization and integrity checks, the maximum number of
recorded failures, and what to do when the store is unreachable.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, Literal, ParamSpec, Protocol, Self, TypeVar, overload

from dibs import keys
from dibs.config import default_owner, default_store_url, validate_seconds
from dibs.errors import (
    ConfigurationError,
    LeaseLost,
    ReservationError,
    SerializationError,
    StoreUnavailable,
    TooManyFailures,
    WaitTimeout,
)
from dibs.keys import Key
from dibs.lease import Lease
from dibs.outcomes import Acquired, Busy, Hit, Outcome, RunReport
from dibs.records import (
    ArtifactRecord,
    Granted,
    Held,
    KeyState,
    LeaseRecord,
    LeaseToken,
    Present,
    StoreOutcome,
)
from dibs.serializers import Serializer, SignedPickleSerializer, load_artifact, resolve_serializer
from dibs.stores import Store, open_store, redact_url
from dibs.stores.base import Watch
from dibs.waiting import AskAcquire, Backoff, Deadline, acquire_until, adrive, drive, read_until

__all__ = ["AsyncReservations", "Reservations"]

log = logging.getLogger("dibs")

P = ParamSpec("P")
R = TypeVar("R")

StoreUnavailablePolicy = Literal["fail", "run"]


class _Decorator(Protocol):
    def __call__(self, fn: Callable[P, R], /) -> Callable[P, R]: ...


class Reservations:
    """Compute each key once across every process that shares the store.

    :param store: a :class:`~dibs.stores.Store`, a store URL, or ``None`` for ``DIBS_STORE_URL`` and
        then the embedded SQLite default (see :mod:`dibs.config`).
    :param namespace: the namespace of keys given as plain strings.
    :param ttl: seconds a lease lives without a heartbeat; a crashed holder is taken over this long
        after its last heartbeat.
    :param heartbeat_interval: seconds between heartbeats (default ``ttl / 3``).
    :param max_lease_age: if set, no lease lives longer than this, however often it heartbeats
        (the seeds' "malicious eternal extension").
    :param serializer: ``"json"`` (default), ``"bytes"``, ``"pickle"`` (needs ``signing_key``) or an object.
    :param max_failures: after this many recorded failures of a key, :class:`TooManyFailures` is raised
        instead of trying again, until someone runs ``dibs forget``. ``None``: try forever.
    :param on_store_unavailable: ``"fail"`` raises :class:`StoreUnavailable`; ``"run"`` makes
        :meth:`compute` run the work unreserved (and log it): the lock never changes a result.
    """

    def __init__(
        self,
        store: Store | str | None = None,
        *,
        namespace: str = "default",
        ttl: float = 60.0,
        heartbeat_interval: float | None = None,
        max_lease_age: float | None = None,
        serializer: Serializer | str | None = None,
        signing_key: bytes | str | None = None,
        backoff: Backoff | None = None,
        max_failures: int | None = None,
        on_store_unavailable: StoreUnavailablePolicy = "fail",
    ) -> None:
        self.namespace = keys.validate_namespace(namespace)
        self.ttl = validate_seconds("ttl", ttl) or 0.0
        interval = validate_seconds("heartbeat_interval", heartbeat_interval, allow_none=True)
        self.heartbeat_interval = interval if interval is not None else self.ttl / 3
        if self.heartbeat_interval >= self.ttl:
            raise ConfigurationError(
                f"heartbeat_interval ({self.heartbeat_interval:g}s) must be shorter than "
                f"ttl ({self.ttl:g}s), "
                "or the lease expires between heartbeats; a third of the ttl is a good choice",
                setting="heartbeat_interval",
            )
        self.max_lease_age = validate_seconds("max_lease_age", max_lease_age, allow_none=True)
        if self.max_lease_age is not None and self.max_lease_age < self.ttl:
            raise ConfigurationError(
                f"max_lease_age ({self.max_lease_age:g}s) must be at least the ttl ({self.ttl:g}s)",
                setting="max_lease_age",
            )
        if max_failures is not None and (not isinstance(max_failures, int) or max_failures < 1):
            raise ConfigurationError(f"max_failures must be a positive integer or None, got {max_failures!r}")
        self.max_failures = max_failures
        if on_store_unavailable not in ("fail", "run"):
            raise ConfigurationError(
                f"on_store_unavailable must be 'fail' or 'run', got {on_store_unavailable!r}"
            )
        self.on_store_unavailable: StoreUnavailablePolicy = on_store_unavailable
        self.serializer = resolve_serializer(serializer, signing_key=signing_key)
        self._signing_key = signing_key
        self.backoff = backoff or Backoff()
        self._owns_store = not isinstance(store, Store)
        self.store: Store = store if isinstance(store, Store) else self._open(store or default_store_url())

    # -- plumbing --------------------------------------------------------------------------------
    def _open(self, url: str) -> Store:
        """The store at ``url``. If it is unreachable right now, policy ``"fail"`` raises at once;
        policy ``"run"`` must still run the work, so the store is opened on first use instead."""
        try:
            return open_store(url)
        except StoreUnavailable as exc:
            if self.on_store_unavailable == "fail":
                log.error("store %s is unavailable (policy 'fail'): %s", redact_url(url), exc)
                raise
            log.warning(
                "store %s is unavailable; opening it on first use (policy 'run'): %s", redact_url(url), exc
            )
            return _OpenLater(url)

    def key(self, key: str | Key) -> Key:
        """``key`` as a :class:`Key` in this client's namespace (validated)."""
        return Key.parse(key, self.namespace)

    def close(self) -> None:
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Reservations({self.store.url!r}, namespace={self.namespace!r}, ttl={self.ttl:g})"

    def decode(self, key: Key, artifact: ArtifactRecord) -> Any:
        """The value of a stored artifact, after its integrity check."""
        payload = artifact.verified_payload(key)
        reader = self._reader_for(key, artifact.serializer)
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
        if name == SignedPickleSerializer.name and self._signing_key is not None:
            return SignedPickleSerializer(self._signing_key)
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
        )

    def _to_outcome(self, key: Key, outcome: StoreOutcome) -> Outcome:
        if isinstance(outcome, Present):
            return self._hit(key, outcome.artifact)
        if isinstance(outcome, Granted):
            lease = Lease(self, outcome.lease)
            failure = outcome.failure
            if self.max_failures is not None and failure is not None and failure.count >= self.max_failures:
                lease.release()  # not a new failure: we refuse to run, we did not fail
                raise TooManyFailures(
                    f"{lease.key} failed {failure.count} times (max_failures={self.max_failures}); last "
                    f"error from {failure.owner!r}: {failure.error}. Fix the cause, then run "
                    f"'dibs forget {lease.key.name!r} --namespace {lease.key.namespace}' to try again",
                    key=str(lease.key),
                    failures=failure.count,
                )
            return Acquired(lease, outcome.took_over_from, failure)
        held = outcome.lease
        return Busy(
            key=held.key,
            holder=held.owner,
            since=held.acquired_at,
            expires_at=held.expires_at,
            attempt=held.attempt,
            now=outcome.now,
            last_failure=outcome.failure,
        )

    # -- the contract's calls -------------------------------------------------------------------
    def get_or_reserve(self, key: str | Key, owner: str | None = None) -> Outcome:
        """One atomic call: :class:`Hit`, :class:`Acquired` or :class:`Busy` (see the contract)."""
        k = self.key(key)
        outcome = self.store.acquire(k, owner or default_owner(), self.ttl, self.max_lease_age)
        return self._to_outcome(k, outcome)

    def acquire(
        self, key: str | Key, owner: str | None = None, *, timeout: float | None = None
    ) -> Hit | Acquired:
        """Wait (backing off, or woken by the store) until the key is done or yours.

        :raises WaitTimeout: after ``timeout`` seconds of someone else holding the key.
        """
        k = self.key(key)
        ask = AskAcquire(k, owner or default_owner(), self.ttl, self.max_lease_age)
        deadline = Deadline(timeout)
        # Most calls are answered at once (a hit, or a free key), so ask before opening a watch,
        # which can cost a connection (PostgreSQL LISTEN) or a subscription (Redis). Only a busy key
        # opens one, and the loop then asks again before it waits, so no wake-up is missed.
        outcome = self.store.acquire(ask.key, ask.owner, ask.ttl, ask.max_lease_age)
        if isinstance(outcome, Held) and not deadline.expired:
            loop = acquire_until(ask, deadline, self.backoff, notifies=self.store.notifies)
            with self.store.watch(k) as watch:
                outcome, _ = drive(loop, self.store, watch)
        result = self._to_outcome(k, outcome)
        if isinstance(result, Busy):
            raise _wait_timeout(result, deadline)
        return result

    def wait(self, key: str | Key, *, timeout: float | None = None, for_artifact: bool = False) -> Hit | None:
        """Wait until the key is done (a :class:`Hit`) or nobody holds it (``None``); reserve nothing.

        With ``for_artifact=True`` only an artifact ends the wait (what a sensor wants).
        """
        k = self.key(key)
        deadline = Deadline(timeout)
        state = self.store.read(k)  # as in acquire: a watch only once the key turns out to be busy
        if not _wait_is_over(state, for_artifact) and not deadline.expired:
            notifies = self.store.notifies
            loop = read_until(k, deadline, self.backoff, notifies=notifies, for_artifact=for_artifact)
            with self.store.watch(k) as watch:
                state = drive(loop, self.store, watch)
        return self._settled(state, deadline, for_artifact)

    def _settled(self, state: KeyState, deadline: Deadline, for_artifact: bool) -> Hit | None:
        if state.artifact is not None:
            return self._hit(state.key, state.artifact)
        lease = state.live_lease
        if lease is not None or for_artifact:
            holder = f"held by {lease.owner!r} until {lease.expires_at:.3f}" if lease else "not computed yet"
            raise WaitTimeout(
                f"gave up on {state.key} after {deadline.elapsed:.1f}s: {holder}",
                key=str(state.key),
                holder=lease.owner if lease else None,
            )
        return None

    def compute(
        self,
        key: str | Key,
        fn: Callable[..., Any],
        *,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        owner: str | None = None,
        timeout: float | None = None,
    ) -> RunReport:
        """Get the key's value, computing it with ``fn(*args, **kwargs)`` only if nobody else does.

        The work runs with background heartbeats; success stores the value, failure releases the lease
        with the error recorded (so a waiter takes over at once) and re-raises.
        """
        k = self.key(key)
        owner = owner or default_owner()
        started = time.monotonic()
        try:
            got = self.acquire(k, owner, timeout=timeout)
        except StoreUnavailable as exc:
            if self.on_store_unavailable == "fail":
                log.error("store unavailable for %s, not running it (policy 'fail'): %s", k, exc)
                raise
            log.warning("store unavailable for %s, running unreserved (policy 'run'): %s", k, exc)
            value = fn(*args, **(kwargs or {}))
            return RunReport(k, value, "unreserved", None, owner, stored=False)
        waited = time.monotonic() - started
        if isinstance(got, Hit):
            role: Literal["waited", "hit"] = "waited" if waited > self.backoff.initial else "hit"
            log.info("%s: using the artifact stored by %s (token %s)", k, got.producer, got.token)
            return RunReport(k, got.value, role, got.token, got.producer, waited_seconds=waited)
        lease = got.lease
        if got.took_over_from:
            log.warning(
                "%s: took over the expired lease of %s (token %s)", k, got.took_over_from, lease.token
            )
        with lease.keep_alive():
            try:
                value = fn(*args, **(kwargs or {}))
            except BaseException as exc:
                _release_quietly(lease, exc)
                raise
        try:
            lease.complete(value)
        except SerializationError as exc:
            _release_quietly(lease, exc)  # the value cannot be stored: free the key for a waiter
            raise
        except LeaseLost as exc:
            # Fenced out: someone else owns the key now. Our value is still right for our own caller.
            log.warning("%s: computed, but not stored: %s", k, exc)
            return RunReport(k, value, "computed", lease.token, owner, waited_seconds=waited, stored=False)
        except StoreUnavailable as exc:
            # Lease.complete already re-read the key for a whole ttl: the store stayed unreachable.
            if self.on_store_unavailable == "fail":
                log.error("%s: computed, but the store failed while storing it (policy 'fail'): %s", k, exc)
                raise
            log.warning("%s: computed, but not stored: the store is unavailable (policy 'run'): %s", k, exc)
            return RunReport(k, value, "computed", lease.token, owner, waited_seconds=waited, stored=False)
        return RunReport(
            k, value, "computed", lease.token, owner, waited_seconds=waited, took_over_from=got.took_over_from
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
    ) -> _Decorator: ...

    def reserved(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        key: str | None = None,
        version: str | None = None,
        exclude: tuple[str, ...] = (),
    ) -> Any:
        """Decorator: each distinct call computes once; the key is the function's identity, ``version``
        and a canonical digest of its arguments (or ``key``, formatted with the arguments)."""

        def decorate(func: Callable[P, R]) -> Callable[P, R]:
            @functools.wraps(func)
            def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
                name = (
                    keys.format_key(key, func, args, kwargs)
                    if key is not None
                    else keys.derive_key(func, args, kwargs, version=version, exclude=exclude)
                )
                return self.run(name, func, *args, **kwargs)

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
        return self.store.reap(None if all_namespaces else self.namespace)

    def aio(self) -> AsyncReservations:
        """The async face of this client, sharing its store and settings."""
        return AsyncReservations(self)


class AsyncReservations:
    """Awaitable ``get_or_reserve``, ``acquire`` and ``wait`` for event loops (Airflow's triggerer).

    It drives the same waiting loops as :class:`Reservations` (see :mod:`dibs.waiting`) and runs the
    store's operations off the event loop, so nothing here blocks the loop.
    """

    def __init__(self, client: Reservations) -> None:
        self.client = client
        from dibs.stores.aio import AsyncStore  # here, so that `import dibs` does not import asyncio

        self.store = AsyncStore(client.store)

    async def get_or_reserve(self, key: str | Key, owner: str | None = None) -> Outcome:
        k = self.client.key(key)
        c = self.client
        outcome = await self.store.acquire(k, owner or default_owner(), c.ttl, c.max_lease_age)
        return c._to_outcome(k, outcome)

    async def acquire(
        self, key: str | Key, owner: str | None = None, *, timeout: float | None = None
    ) -> Hit | Acquired:
        c = self.client
        k = c.key(key)
        deadline = Deadline(timeout)
        ask = AskAcquire(k, owner or default_owner(), c.ttl, c.max_lease_age)
        # As in Reservations.acquire: a watch only once the key turns out to be busy.
        outcome = await self.store.acquire(ask.key, ask.owner, ask.ttl, ask.max_lease_age)
        if isinstance(outcome, Held) and not deadline.expired:
            loop = acquire_until(ask, deadline, c.backoff, notifies=c.store.notifies)
            watch = await self.store.watch(k)
            try:
                outcome, _ = await adrive(loop, self.store, watch)
            finally:
                await watch.close()
        result = c._to_outcome(k, outcome)
        if isinstance(result, Busy):
            raise _wait_timeout(result, deadline)
        return result

    async def wait(
        self, key: str | Key, *, timeout: float | None = None, for_artifact: bool = False
    ) -> Hit | None:
        c = self.client
        k = c.key(key)
        deadline = Deadline(timeout)
        state = await self.store.read(k)  # as in Reservations.wait
        if not _wait_is_over(state, for_artifact) and not deadline.expired:
            loop = read_until(k, deadline, c.backoff, notifies=c.store.notifies, for_artifact=for_artifact)
            watch = await self.store.watch(k)
            try:
                state = await adrive(loop, self.store, watch)
            finally:
                await watch.close()
        return c._settled(state, deadline, for_artifact)

    async def status(self, key: str | Key) -> KeyState:
        return await self.store.read(self.client.key(key))


def _wait_is_over(state: KeyState, for_artifact: bool) -> bool:
    """What ends a wait at once (the rule :func:`dibs.waiting.read_until` applies to every read)."""
    return state.artifact is not None or (not for_artifact and state.live_lease is None)


class _OpenLater(Store):
    """A store that could not be opened yet: each operation tries to open it again, and raises
    :class:`StoreUnavailable` while it cannot, so the client's policy decides call by call."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._store: Store | None = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return self._store.url if self._store is not None else redact_url(self._url)

    def _opened(self) -> Store:
        with self._lock:
            if self._store is None:
                self._store = open_store(self._url)
                self.notifies = self._store.notifies
            return self._store

    def read(self, key: Key) -> KeyState:
        return self._opened().read(key)

    def acquire(self, key: Key, owner: str, ttl: float, max_lease_age: float | None) -> StoreOutcome:
        return self._opened().acquire(key, owner, ttl, max_lease_age)

    def heartbeat(self, key: Key, token: LeaseToken, ttl: float) -> LeaseRecord:
        return self._opened().heartbeat(key, token, ttl)

    def complete(
        self, key: Key, token: LeaseToken, serializer: str, payload: bytes, checksum: str
    ) -> ArtifactRecord:
        return self._opened().complete(key, token, serializer, payload, checksum)

    def release(self, key: Key, token: LeaseToken, error: str | None = None) -> None:
        self._opened().release(key, token, error)

    def force_release(self, key: Key) -> bool:
        return self._opened().force_release(key)

    def forget(self, key: Key) -> bool:
        return self._opened().forget(key)

    def list(self, namespace: str | None = None) -> Iterator[KeyState]:
        return self._opened().list(namespace)

    def reap(self, namespace: str | None = None) -> int:
        return self._opened().reap(namespace)

    def watch(self, key: Key) -> Watch:
        return self._opened().watch(key)

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.close()


def _wait_timeout(busy: Busy, deadline: Deadline) -> WaitTimeout:
    return WaitTimeout(
        f"gave up on {busy.key} after {deadline.elapsed:.1f}s: held by {busy.holder!r} "
        f"(attempt {busy.attempt}, {busy.remaining:.1f}s left on its lease)",
        key=str(busy.key),
        holder=busy.holder,
    )


def _release_quietly(lease: Lease, error: BaseException) -> None:
    try:
        lease.release(error)
    except LeaseLost as lost:
        log.warning("%s: work failed after the lease was lost (%s); nothing to release", lease.key, lost)
    except StoreUnavailable as unreachable:
        log.warning("%s: could not record the failure (%s); the lease will expire", lease.key, unreachable)

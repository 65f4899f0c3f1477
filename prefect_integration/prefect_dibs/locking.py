"""``DibsLockManager``: Prefect's ``LockManager`` protocol on dibs leases, so locks expire when their
holder dies.

Prefect's SERIALIZABLE cache isolation takes a lock per cache key around a cached task
(``Transaction.begin`` → ``ResultStore.acquire_lock(key, holder, timeout)``) and releases it on
commit or rollback. The task engine passes no ``hold_timeout``, so with Prefect's own managers a
holder killed with SIGKILL leaves its lock behind forever: ``FileSystemLockManager`` keeps a lock
file with no expiry, and every waiter (and every later run) blocks on it.

Here a lock is a dibs lease whose owner is Prefect's ``holder``. While held, a heartbeat thread per
lock extends it (every ``ttl / 3`` by default); if the holder dies the heartbeats stop, the lease
expires after ``ttl`` on the store's clock, and a waiter takes it over at once. A lock is not an
artifact: locks live in their own namespace (``prefect.locks``) and are only ever released, never
completed, so they can never be mistaken for a cached value.

A released lock leaves no record behind (Prefect's own managers delete theirs too): the record is
removed at release unless someone took the lock meanwhile. Prefect's ``cache_expiration`` needs
nothing here: Prefect applies it to its own result records, and passes a lock manager only the key,
the holder and the timeouts (``ResultStore.acquire_lock``); a lock never holds a result.

``hold_timeout`` keeps Prefect's meaning (the lock is gone that long after it was taken, whatever
the holder does): it becomes the lease's maximum age, and a lease shorter than the ttl is not
heartbeated at all.

The manager holds configuration only when pickled (``__getstate__``): no client, no threads, no held
leases, so Dask and Ray runners can ship it; a copy opens its own client on first use. Locks are
judged by the store, not by this object: ``is_locked``/``is_lock_holder`` read the store, and
``release_lock`` works from any copy or process for the same holder.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import logging
import threading
from typing import Any

from prefect.locking.protocol import LockManager

from dibs import Reservations
from dibs.backoff import Backoff
from dibs.config import validate_seconds
from dibs.errors import ConfigurationError, InvalidKey, LeaseLost, ReservationError, WaitTimeout
from dibs.keys import Key, validate_namespace
from dibs.lease import KeepAlive, Lease
from dibs.outcomes import Acquired, Busy, Hit, Outcome
from dibs.runtime import runtime
from dibs.settings import validate_timings
from prefect_dibs import _runs
from prefect_dibs._clients import ClientSettings, StoreSpec, resolve_client, spec_identity
from prefect_dibs._watching import Seen, Watch, await_key, expiry_cause, wait_for_key

__all__ = ["DibsLockManager"]

log = logging.getLogger("prefect_dibs.locking")

#: Waiters on stores that cannot notify poll at most this often by default. Prefect's own managers
#: poll every 0.1 s; a lock hand-off is on the critical path of every waiting task, and a read is cheap.
DEFAULT_LOCK_BACKOFF = Backoff(initial=0.01, maximum=0.25)


@dataclasses.dataclass
class _Held:
    """A lease this manager took, and the heartbeats keeping it alive (``None``: short enough not to)."""

    lease: Lease
    keeper: KeepAlive | None

    def stop(self) -> None:
        if self.keeper is not None:
            self.keeper.stop()

    def alive_with(self, lease: Lease) -> bool:
        """Whether this is ``lease`` (same token) and its heartbeats, if any, still succeed."""
        same = self.lease.record.token == lease.record.token
        return same and (self.keeper is None or not self.keeper.lost.is_set())


class DibsLockManager(LockManager):
    """Prefect's ``LockManager`` on any dibs store, with locks that expire when their holder dies.

    :param store: a store URL, a :class:`~prefect_dibs.DibsStore` block or its saved name, a
        :class:`dibs.Reservations` client (then the manager cannot be pickled), or ``None``
        (``DIBS_STORE_URL``, then the embedded SQLite default). The store must be shared by every
        process running the cached tasks: use a SQL, Redis or blob store across machines.
    :param namespace: the key namespace of locks; keep it apart from reserved tasks' artifacts.
    :param ttl: seconds after its holder's last heartbeat that a lock is taken over (default: the
        block's ttl, else 60).
    :param heartbeat_interval: seconds between heartbeats (default a third of the ttl).
    :param backoff: how waiters poll stores that cannot notify.

    Example::

        from prefect import task
        from prefect.cache_policies import INPUTS, TASK_SOURCE
        from prefect_dibs import DibsLockManager

        policy = (INPUTS + TASK_SOURCE).configure(
            isolation_level="SERIALIZABLE",
            lock_manager=DibsLockManager("postgresql+psycopg://dibs@db/dibs", ttl=30),
        )

        @task(cache_policy=policy)
        def expensive(x: int) -> int: ...
    """

    def __init__(
        self,
        store: StoreSpec = None,
        *,
        namespace: str = "prefect.locks",
        ttl: float | None = None,
        heartbeat_interval: float | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        self.store = store
        self.namespace = validate_namespace(namespace)
        self.ttl, self.heartbeat_interval, _ = validate_timings(
            ttl=ttl, heartbeat_interval=heartbeat_interval
        )
        self.backoff = backoff or DEFAULT_LOCK_BACKOFF
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._client: Reservations | None = None
        self._client_lock = threading.Lock()
        self._held: dict[Key, _Held] = {}
        self._lost_by: dict[Key, str] = {}  # holders whose lock expired while this manager held it
        self._held_lock = threading.Lock()

    # -- pickling: configuration only ------------------------------------------------------------------
    _CONFIG = ("store", "namespace", "ttl", "heartbeat_interval", "backoff")

    def __getstate__(self) -> dict[str, Any]:
        if isinstance(self.store, Reservations):
            raise TypeError(
                "a DibsLockManager built on a live dibs.Reservations client cannot be pickled (it would "
                "copy open connections); build it from a store URL or a DibsStore block instead"
            )
        return {name: getattr(self, name) for name in self._CONFIG}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    def __eq__(self, other: object) -> bool:
        # Prefect refuses to combine cache policies with two *different* lock managers; two managers
        # with the same configuration are the same locks.
        if not isinstance(other, DibsLockManager):
            return NotImplemented
        return self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())

    def _identity(self) -> tuple[Any, ...]:
        return (spec_identity(self.store), self.namespace, self.ttl, self.heartbeat_interval, self.backoff)

    def __repr__(self) -> str:
        store = self.store
        where = store.store.url if isinstance(store, Reservations) else getattr(store, "url", store)
        return f"DibsLockManager({where!r}, namespace={self.namespace!r}, ttl={self.ttl})"

    # -- plumbing ------------------------------------------------------------------------------------
    @property
    def client(self) -> Reservations:
        """This manager's dibs client, opened on first use (and again in each unpickled copy)."""
        if self._client is None:
            with self._client_lock:
                if self._client is None:
                    self._client = self._open_client()
        return self._client

    def _open_client(self) -> Reservations:
        if isinstance(self.store, Reservations):
            given = self.store
            ttl = self.ttl or given.ttl
            interval = self.heartbeat_interval or (
                given.settings.heartbeat_interval if ttl == given.ttl else None
            )
            # Same store object (and connections), our namespace and timings.
            ours = dataclasses.replace(
                given.settings,
                namespace=self.namespace,
                ttl=ttl,
                heartbeat_interval=interval,
                backoff=self.backoff,
            )
            return Reservations(given.store, settings=ours)
        overrides = ClientSettings(
            namespace=self.namespace,
            ttl=self.ttl,
            heartbeat_interval=self.heartbeat_interval,
            backoff=self.backoff,
        )
        return resolve_client(self.store, overrides)

    def _key(self, key: str) -> Key:
        """Prefect's lock key as a dibs key; keys dibs cannot take as names (too long, binary) are hashed."""
        try:
            return Key(self.namespace, key)
        except InvalidKey:
            return Key(
                self.namespace, "sha256:" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
            )

    def _terms(self, hold_timeout: float | None) -> tuple[float | None, float | None]:
        """The ttl and maximum age of one lock: Prefect's ``hold_timeout`` is the lock's maximum age,
        and a lock shorter than the ttl lives only that long (``None``: the client's)."""
        if hold_timeout is None:
            return None, None
        hold = validate_seconds("hold_timeout", hold_timeout)
        assert hold is not None
        return min(self.client.ttl, hold), hold

    # -- acquiring -----------------------------------------------------------------------------------
    def acquire_lock(
        self,
        key: str,
        holder: str,
        acquire_timeout: float | None = None,
        hold_timeout: float | None = None,
    ) -> bool:
        """Take the lock on ``key`` for ``holder``, waiting up to ``acquire_timeout`` seconds (``None``:
        as long as it takes, ``0``: one attempt). Re-entrant for the same holder. A lock whose holder
        stopped heartbeating is taken over once it expires."""
        k = self._key(key)
        ttl, max_age = self._terms(hold_timeout)
        client = self.client
        owner = _runs.lock_owner(holder)
        got = client.get_or_reserve(k, owner, ttl=ttl, max_lease_age=max_age)
        if isinstance(got, Busy) and _runs.lock_holder(got.holder) == holder:
            # The same holder, asking from another run context: re-enter its lock as its owner.
            got = client.get_or_reserve(k, got.holder, ttl=ttl, max_lease_age=max_age)
        wait: _LockWait | None = None
        seen: Seen | None = None
        if isinstance(got, Busy) and acquire_timeout != 0:
            wait = _LockWait(k, got)
            got, seen = wait_for_key(
                client, k, owner, got, wait.watch(), timeout=acquire_timeout, ttl=ttl, max_lease_age=max_age
            )
        return self._settle(k, got, hold_timeout, wait, seen)

    async def aacquire_lock(
        self,
        key: str,
        holder: str,
        acquire_timeout: float | None = None,
        hold_timeout: float | None = None,
    ) -> bool:
        """:meth:`acquire_lock` for event loops: the waiting never blocks the loop."""
        k = self._key(key)
        client = await runtime().io(lambda: self.client)  # may load a block: not on the loop
        ttl, max_age = self._terms(hold_timeout)
        aclient = client.aio()
        owner = _runs.lock_owner(holder)
        got = await aclient.get_or_reserve(k, owner, ttl=ttl, max_lease_age=max_age)
        if isinstance(got, Busy) and _runs.lock_holder(got.holder) == holder:
            got = await aclient.get_or_reserve(k, got.holder, ttl=ttl, max_lease_age=max_age)
        wait: _LockWait | None = None
        seen: Seen | None = None
        if isinstance(got, Busy) and acquire_timeout != 0:
            wait = _LockWait(k, got)
            got, seen = await await_key(
                aclient, k, owner, got, wait.watch(), timeout=acquire_timeout, ttl=ttl, max_lease_age=max_age
            )
        # Settling may stop a stale heartbeat thread (a join): keep it off the loop, in this run's context
        # (its logger).
        settle = contextvars.copy_context().run
        return await runtime().io(settle, self._settle, k, got, hold_timeout, wait, seen)

    def _settle(
        self,
        key: Key,
        outcome: Outcome,
        hold_timeout: float | None,
        wait: _LockWait | None,
        seen: Seen | None,
    ) -> bool:
        if isinstance(outcome, Busy):
            if wait is not None:
                wait.gave_up()
            return False
        if isinstance(outcome, Hit):
            raise ConfigurationError(
                f"{key} has an artifact: the lock namespace {self.namespace!r} is shared with reserved "
                "tasks; give the DibsLockManager a namespace of its own"
            )
        if wait is not None:
            wait.acquired()
        if outcome.took_over_from is not None:
            (wait.logger if wait is not None else _LockWait.current_logger()).warning(
                "took over the cache lock %r from %s: %s",
                key.name,
                _runs.holder_link(_runs.lock_run(outcome.took_over_from)),
                expiry_cause(
                    outcome.took_over_from, outcome.lease.record.acquired_at, seen, limit="hold_timeout"
                ),
            )
        lease = outcome.lease
        with self._held_lock:
            current = self._held.get(key)
            if current is not None and current.alive_with(lease):
                return True  # re-entry of a lock this manager already keeps alive
        held = _Held(lease, None)
        if hold_timeout is None or hold_timeout > lease.record.ttl:
            # Heartbeats start before the lock is published here, so a release racing with this
            # acquisition always finds a lease whose heartbeats it can stop.
            held.keeper = lease.keep_alive(on_lost=lambda error: self._lost(key, held, error))
            held.keeper.__enter__()
        with self._held_lock:
            stale = self._held.get(key)
            self._held[key] = held
        if stale is not None:
            stale.stop()
        return True

    def _lost(self, key: Key, held: _Held, error: LeaseLost) -> None:
        # Called from the heartbeat thread: forget the lease (the store already has).
        with self._held_lock:
            if self._held.get(key) is held:
                del self._held[key]
                self._lost_by[key] = _runs.lock_holder(held.lease.owner)
        log.warning("lost the lock %r: %s", key.name, error)

    # -- releasing -----------------------------------------------------------------------------------
    def release_lock(self, key: str, holder: str) -> None:
        """Release ``holder``'s lock on ``key`` (from any process or copy of this manager).

        Releasing a lock that is not held at all is a no-op: Prefect may release again after a
        rollback (see prefect#17676). Raises ``ValueError`` if someone else holds it.
        """
        k = self._key(key)
        with self._held_lock:
            held = self._held.get(k)
            if held is not None and _runs.lock_holder(held.lease.owner) == holder:
                del self._held[k]
            else:
                held = None
            lost_here = self._lost_by.get(k) == holder
            if lost_here:
                del self._lost_by[k]
        if held is not None:
            held.stop()
            try:
                held.lease.release()
                self._discard(k)
                return
            except LeaseLost as exc:
                # The lease ran out (a pause longer than the ttl, or hold_timeout): judge by the store.
                log.warning("the lock %r was no longer held by %r when released: %s", k.name, holder, exc)
                lost_here = True
        client = self.client
        live = client.status(k).live_lease
        if live is None:
            return
        if _runs.lock_holder(live.owner) != holder:
            if lost_here:
                # This manager did hold it for this holder, which overran its lease; someone else has
                # the lock now. Raising here would fail a run whose work is done (Prefect releases in
                # commit and rollback); Prefect already refused its late write (is_lock_holder).
                log.warning("the lock %r of %r was taken over by %r meanwhile", k.name, holder, live.owner)
                return
            raise ValueError(f"No lock held by {holder} for transaction with key {key}")
        # Held by this holder through another process or copy: re-entering (as its exact owner) returns
        # the current lease (and its token) atomically, so the release is fenced like any other.
        outcome = client.get_or_reserve(k, live.owner)
        if isinstance(outcome, Acquired):
            outcome.lease.release()
            self._discard(k)
        elif isinstance(outcome, Busy):
            raise ValueError(f"No lock held by {holder} for transaction with key {key}")

    def _discard(self, key: Key) -> None:
        """A released lock leaves nothing behind but a tombstone that keeps its fencing token (as
        Prefect's own managers delete their lock files), unless someone took the lock meanwhile,
        which keeps it. The tombstone is not listed, and keeps the next holder's token higher."""
        try:
            self.client.discard(key)
        except ReservationError as exc:  # the lock is released: a leftover record is only clutter
            log.debug("could not remove the record of the released lock %r: %s", key.name, exc)

    def release_all(self) -> None:
        """Release every lock this manager holds and stop their heartbeats (for shutdown and tests)."""
        with self._held_lock:
            held_now = list(self._held.items())
            self._held.clear()
        for _, held in held_now:
            held.stop()
            with contextlib.suppress(LeaseLost):  # expired meanwhile: nothing left to release
                held.lease.release()
                self._discard(held.lease.key)

    # -- inspecting and waiting ------------------------------------------------------------------------
    def is_locked(self, key: str) -> bool:
        """Whether anyone holds a live lock on ``key`` (by the store's clock)."""
        return self.client.status(self._key(key)).live_lease is not None

    def is_lock_holder(self, key: str, holder: str) -> bool:
        """Whether ``holder`` holds a live lock on ``key`` (by the store, so from any process)."""
        live = self.client.status(self._key(key)).live_lease
        return live is not None and _runs.lock_holder(live.owner) == holder

    def wait_for_lock(self, key: str, timeout: float | None = None) -> bool:
        """Wait until nobody holds ``key``; ``False`` if it is still held after ``timeout`` seconds."""
        try:
            self.client.wait(self._key(key), timeout=timeout)
        except WaitTimeout:
            return False
        return True

    async def await_for_lock(self, key: str, timeout: float | None = None) -> bool:
        """:meth:`wait_for_lock` for event loops."""
        client = await runtime().io(lambda: self.client)  # may load a block: not on the loop
        try:
            await client.aio().wait(self._key(key), timeout=timeout)
        except WaitTimeout:
            return False
        return True


class _LockWait:
    """A run waiting for a lock says so, and on whom: in its logs (the task run's; in a flow-level
    transaction, the flow run's) and, in a task run, its state (see :mod:`prefect_dibs._runs`).

    The holder is named by the run that took the lock, not by Prefect's random holder id.
    """

    def __init__(self, key: Key, busy: Busy) -> None:
        self.key = key
        self.ctx = _runs.task_run_context()
        self.logger = self.current_logger()
        self._in_run = self.logger is not _runs.log
        self._say(
            "waiting for the cache lock %r held by %s (its lease runs %.1fs more unless renewed; if its "
            "holder dies, this run takes it over)",
            key.name,
            _runs.holder_link(_runs.lock_run(busy.holder)),
            busy.remaining,
        )
        self._mark_waiting(busy)

    @staticmethod
    def current_logger() -> Any:
        return _runs.run_logger(_runs.task_run_context())

    def watch(self) -> Watch:
        return Watch(changed=self._changed)

    def _say(self, message: str, *args: Any) -> None:
        # Outside any run there is no run log to inform, only the library's own (quietly).
        (self.logger.info if self._in_run else log.debug)(message, *args)

    def _mark_waiting(self, busy: Busy) -> None:
        run = _runs.lock_run(busy.holder)
        _runs.mark_state(self.ctx, "Waiting", f"waiting for the cache lock {self.key.name!r} held by {run!r}")

    def _changed(self, seen: Seen) -> None:
        self._say(
            "the cache lock %r changed hands: now held by %s; still waiting",
            self.key.name,
            _runs.holder_link(_runs.lock_run(seen.busy.holder)),
        )
        self._mark_waiting(seen.busy)

    def acquired(self) -> None:
        _runs.mark_state(self.ctx, "Running", f"holding the cache lock {self.key.name!r}")

    def gave_up(self) -> None:
        _runs.mark_state(self.ctx, "Running", f"gave up waiting for the cache lock {self.key.name!r}")

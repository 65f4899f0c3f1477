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

A lock is a compute-once call that keeps its lease (``dibs.flow``, ``keep=True``), and it ends when the
lock is released: then the manager reads how Prefect used it (:func:`_how_held`) and the flow says
how the call ended (:func:`dibs.flow.kept_ended`), which is what metrics, traces and Prefect events
count. A task run that computed its result under the lock *computed*; one that Prefect served from
its cache once it held the lock (its state ``Cached``) was *served*: a hit, or after a wait on the
holder that computed it, a waiter spared that holder's hold. A transaction that rolled back failed.

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
from typing import Any, Literal, Self

from prefect.locking.protocol import LockManager

from dibs import Backoff, Reservations, RunReport, events
from dibs.errors import ConfigurationError, InvalidKey, LeaseLost, ReservationError, WaitTimeout
from dibs.integration import (
    AsyncStoreIO,
    Call,
    HeldLease,
    Keep,
    Kept,
    StoreIO,
    kept_ended,
    runtime,
    validate_seconds,
    validate_timings,
)
from dibs.keys import Key, validate_namespace
from prefect_dibs import _runs
from prefect_dibs import events as prefect_events
from prefect_dibs._clients import ClientSettings, StoreSpec, resolve_client, spec_identity
from prefect_dibs._takeover import expiry_cause

__all__ = ["DibsLockManager"]

log = logging.getLogger("prefect_dibs.locking")

#: Waiters on stores that cannot notify poll at most this often by default. Prefect's own managers
#: poll every 0.1 s; a lock hand-off is on the critical path of every waiting task, and a read is cheap.
DEFAULT_LOCK_BACKOFF = Backoff(initial=0.01, maximum=0.25)


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
        self._held: dict[Key, HeldLease] = {}
        self._calls: dict[Key, Kept] = {}  # the call of each held lock, ended at its release
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
    # A lock is the compute-once flow's ask and wait (dibs.flow): the same timeout, takeover, re-entry
    # and store policies as every front end, and the same events. Its hold is not a work's: Prefect
    # takes and releases a lock in two calls, so the flow keeps the lease (keep=True: the Keep step,
    # _keep here, starts its heartbeats), and release_lock ends it.
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
        call = self._call(self.client, key, holder, acquire_timeout, hold_timeout)
        try:
            return self._locked(
                call.drive(_LockIO(self.client, emit=call.emitter).taking(self, hold_timeout))
            )
        except WaitTimeout:
            return False

    async def aacquire_lock(
        self,
        key: str,
        holder: str,
        acquire_timeout: float | None = None,
        hold_timeout: float | None = None,
    ) -> bool:
        """:meth:`acquire_lock` for event loops: the waiting never blocks the loop."""
        client = await runtime().io(lambda: self.client)  # may load a block: not on the loop
        call = self._call(client, key, holder, acquire_timeout, hold_timeout)
        io = _AsyncLockIO(client, emit=call.emitter).taking(self, hold_timeout)
        try:
            return self._locked(await call.adrive(io))
        except WaitTimeout:
            return False

    def _call(
        self,
        client: Reservations,
        key: str,
        holder: str,
        acquire_timeout: float | None,
        hold_timeout: float | None,
    ) -> Call:
        """One lock acquisition as a compute-once call that keeps its lease: never run unreserved (a
        lock that is not taken protects nothing), re-entered by the same holder asking from another
        run context (the lease of an owner with this holder is its own)."""
        prefect_events.install()  # its outcome reaches Prefect's event feed, as a reserved task's does
        k = self._key(key)
        ttl, max_age = self._terms(hold_timeout)
        return client.call(
            k,
            owner=_runs.lock_owner(holder),
            timeout=acquire_timeout,
            frontend="prefect",
            observer=_LockNarrator(announce=acquire_timeout != 0),
            ttl=ttl,
            max_lease_age=max_age,
            on_store_unavailable="fail",
            keep=True,
            reenters=lambda owner: _runs.lock_holder(owner) == holder,
        )

    def _locked(self, report: RunReport) -> bool:
        if report.role in ("hit", "waited"):
            raise ConfigurationError(
                f"{report.key} has an artifact: the lock namespace {self.namespace!r} is shared with "
                "reserved tasks; give the DibsLockManager a namespace of its own"
            )
        return True

    def _keep(self, step: Keep, hold_timeout: float | None, emit: events.Emitter | None = None) -> RunReport:
        """The flow's hold step for a lock: keep the lease (heartbeating it unless it is shorter than
        its ttl) until :meth:`release_lock`, which ends the call; its heartbeats and a loss reach the
        observers (``emit``)."""
        acquired = step.acquired
        lease, key = acquired.lease, acquired.lease.key
        report = RunReport(
            key, None, "computed", lease.token, lease.owner, took_over_from=acquired.took_over_from
        )
        with self._held_lock:
            current = self._held.get(key)
            reentry = (
                current is not None and current.lease.record.token == lease.record.token and current.alive
            )
        if reentry:  # a lock this manager already keeps alive: the call that took it ends at release
            _end(step.kept, "held")
            return report
        # Heartbeats (unless the lock lives less than a ttl) start before the lock is published here,
        # so a release racing with this acquisition always finds a lease whose heartbeats it can stop.
        held = HeldLease(
            lease,
            emit=emit,
            on_lost=lambda error: self._lost(key, held, error),
            heartbeats=hold_timeout is None or hold_timeout > lease.record.ttl,
        )
        with self._held_lock:
            stale = self._held.get(key)
            self._held[key] = held
            self._calls[key] = step.kept
        if stale is not None:
            stale.drop()
        return report

    def _lost(self, key: Key, held: HeldLease, error: LeaseLost) -> None:
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
            call = None
            if held is not None and _runs.lock_holder(held.lease.owner) == holder:
                del self._held[k]
                call = self._calls.pop(k, None)
            else:
                held = None
            lost_here = self._lost_by.get(k) == holder
            if lost_here:
                del self._lost_by[k]
        if held is not None:
            ending = _how_held(key)  # read now, in the run releasing it: its call ends once it is given back
            try:
                held.let_go()
                self._discard(k)
                return
            except LeaseLost as exc:
                # The lease ran out (a pause longer than the ttl, or hold_timeout): judge by the store.
                log.warning("the lock %r was no longer held by %r when released: %s", k.name, holder, exc)
                lost_here = True
            finally:
                if call is not None:
                    _end(call, *ending)
        # Held by this holder through another process or copy: the flow gives it back as its owner
        # (re-entering returns the current lease and its token atomically: the release is fenced).
        released = self.client.release_own(k, lambda owner: _runs.lock_holder(owner) == holder)
        if released.outcome == "released":
            self._discard(k)
        elif released.outcome == "other":
            if lost_here:
                # This manager did hold it for this holder, which overran its lease; someone else has
                # the lock now. Raising here would fail a run whose work is done (Prefect releases in
                # commit and rollback); Prefect already refused its late write (is_lock_holder).
                log.warning(
                    "the lock %r of %r was taken over by %r meanwhile", k.name, holder, released.holder
                )
                return
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
            calls = list(self._calls.values())
            self._held.clear()
            self._calls.clear()
        for call in calls:  # given back by the manager, not by their holders
            _end(call, "held")
        for _, held in held_now:
            with contextlib.suppress(LeaseLost):  # expired meanwhile: nothing left to release
                held.let_go()
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


_Ending = Literal["held", "stored", "served", "failed"]


def _how_held(key: str) -> tuple[_Ending, str | None]:
    """How the holder of the lock on ``key`` used it, as Prefect says when its transaction releases the
    lock (as it commits or rolls back): ``failed`` when it rolled back (the task failed), ``served``
    when its task run found the cached result under the lock (Prefect names that state ``Cached``:
    nothing ran), else ``stored`` (the task stored its result). A lock released outside its own
    transaction (by hand, or by a flow's transaction committing its children) is only ``held``."""
    from prefect.transactions import get_transaction

    transaction = get_transaction()
    if transaction is None or transaction.key != key:
        return "held", None
    if transaction.is_rolled_back():
        return "failed", "Prefect rolled the transaction back: the task failed"
    task_run = getattr(_runs.task_run_context(), "task_run", None)
    state = getattr(task_run, "state", None)
    return ("served" if getattr(state, "name", None) == "Cached" else "stored"), None


def _end(call: Kept, ending: _Ending, error: str | None = None) -> None:
    """A lock's call ended (:func:`dibs.flow.kept_ended` decides how; its events go to its observers)."""
    for event in kept_ended(call, ending, error):
        call.emitter.send(event)


class _Taking:
    """Which manager keeps the lock a flow takes, and for how long at most."""

    manager: DibsLockManager
    hold_timeout: float | None

    def taking(self, manager: DibsLockManager, hold_timeout: float | None) -> Self:
        self.manager, self.hold_timeout = manager, hold_timeout
        return self


class _LockIO(_Taking, StoreIO):
    """A lock's steps: its lease kept by the manager until ``release_lock`` (the flow's Keep step)."""

    def keep(self, step: Keep) -> RunReport:
        return self.manager._keep(step, self.hold_timeout, self.emit)


class _AsyncLockIO(_Taking, AsyncStoreIO):
    """:class:`_LockIO` for event loops."""

    async def keep(self, step: Keep) -> RunReport:
        # Keeping may stop a stale heartbeat thread (a join): off the loop, in this run's context.
        keep = contextvars.copy_context().run
        return await runtime().io(keep, self.manager._keep, step, self.hold_timeout, self.emit)


class _LockNarrator:
    """The flow's events in a lock waiter's words (:class:`_LockWait`), and a takeover explained."""

    def __init__(self, *, announce: bool) -> None:
        self.announce = announce
        self.wait: _LockWait | None = None

    def __call__(self, event: events.Event) -> None:
        wait = self.wait
        if isinstance(event, events.KeyBusy) and wait is None and self.announce:
            self.wait = _LockWait(event.key, event.holder, event.expires_in)
        elif isinstance(event, events.HolderChanged) and wait is not None:
            wait.changed(event.holder)
        elif isinstance(event, events.Waited) and wait is not None:
            if event.outcome == "acquired":
                wait.acquired()
            elif event.outcome in ("timeout", "unavailable"):
                wait.gave_up()
        elif isinstance(event, events.LeaseAcquired) and event.took_over_from is not None:
            (wait.logger if wait is not None else _LockWait.current_logger()).warning(
                "took over the cache lock %r from %s: %s",
                event.key.name,
                _runs.holder_link(_runs.lock_run(event.took_over_from)),
                expiry_cause(event, limit="hold_timeout"),
            )


class _LockWait:
    """A run waiting for a lock says so, and on whom: in its logs (the task run's; in a flow-level
    transaction, the flow run's) and, in a task run, its state (see :mod:`prefect_dibs._runs`).

    The holder is named by the run that took the lock, not by Prefect's random holder id.
    """

    def __init__(self, key: Key, holder: str, remaining: float) -> None:
        self.key = key
        self.ctx = _runs.task_run_context()
        self.logger = self.current_logger()
        self._in_run = self.logger is not _runs.log
        self._say(
            "waiting for the cache lock %r held by %s (its lease runs %.1fs more unless renewed; if its "
            "holder dies, this run takes it over)",
            key.name,
            _runs.holder_link(_runs.lock_run(holder)),
            remaining,
        )
        self._mark_waiting(holder)

    @staticmethod
    def current_logger() -> Any:
        return _runs.run_logger(_runs.task_run_context())

    def _say(self, message: str, *args: Any) -> None:
        # Outside any run there is no run log to inform, only the library's own (quietly).
        (self.logger.info if self._in_run else log.debug)(message, *args)

    def _mark_waiting(self, holder: str) -> None:
        run = _runs.lock_run(holder)
        _runs.mark_state(self.ctx, "Waiting", f"waiting for the cache lock {self.key.name!r} held by {run!r}")

    def changed(self, holder: str) -> None:
        self._say(
            "the cache lock %r changed hands: now held by %s; still waiting",
            self.key.name,
            _runs.holder_link(_runs.lock_run(holder)),
        )
        self._mark_waiting(holder)

    def acquired(self) -> None:
        _runs.mark_state(self.ctx, "Running", f"holding the cache lock {self.key.name!r}")

    def gave_up(self) -> None:
        _runs.mark_state(self.ctx, "Running", f"gave up waiting for the cache lock {self.key.name!r}")

"""The store interface: a few one-attempt atomic operations, and nothing else.

A store never waits, retries, sleeps or heartbeats: those policies live once, in
:class:`dibs.Reservations` and the hold loop, above every store. Each operation either does its
one atomic thing against the service or raises; contention is an *answer* (:class:`~dibs.records.Held`),
not an error. Service errors are translated at this boundary into :class:`~dibs.errors.StoreUnavailable`.

Two families implement it:

* :class:`RecordStore` subclasses read a whole record and replace it with a compare-and-swap
  (memory, filesystem, Azure blobs); the state machine itself is :mod:`dibs.stores.transitions`.
* Stores that decide inside the service (SQL, Redis) override the operations directly.

Waiting is not a store operation either. A store offers a :meth:`Store.change_feed` (see
:mod:`dibs.stores.feeds`), and the process's one watch hub per record store
(:attr:`Store.record_store`, :mod:`dibs.hub`) turns it into wake-ups for any number of waiters.
Async callers run these same one-attempt operations in the runtime's small I/O executor
(:mod:`dibs.runtime`) instead of a second, async copy of every store.
"""

from __future__ import annotations

import abc
import builtins
import dataclasses
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import ClassVar, TypeVar

from dibs._closing import Closing
from dibs.errors import ArtifactTooLarge, CorruptRecord, ReservationError, StoreUnavailable
from dibs.keys import Key
from dibs.records import ArtifactRecord, KeyState, LeaseRecord, LeaseToken, StoreOutcome
from dibs.stores import pages, timing, transitions
from dibs.stores.feeds import ChangeFeed, ReadPollingFeed
from dibs.stores.requests import AcquireRequest, NewArtifact

__all__ = [
    "AcquireRequest",
    "Listing",
    "NewArtifact",
    "RecordStore",
    "Skipped",
    "Store",
    "refuse_too_large",
]

T = TypeVar("T")
#: A record as read for a compare-and-swap: its state and the store's version of it.
Loaded = tuple[KeyState, object]


log = logging.getLogger(__name__)

#: What a prune or reap tells as it goes (the CLI's progress on a terminal): how many records it has
#: changed so far. Called now and then, never for every record.
Progress = Callable[[int], None]
#: How many records a removal that goes key by key considers between two calls of its progress.
PROGRESS_EVERY = 1000


@dataclasses.dataclass(frozen=True)
class Skipped:
    """A record that :meth:`Store.list` could not read: where it is and why (the error's message)."""

    where: str
    why: str


class Listing(Iterator[KeyState]):
    """What :meth:`Store.list` returns: the readable records, in key order, and the ones it skipped.

    Tombstones (what removal leaves: a record with only the key's fence, see
    :func:`~dibs.stores.transitions.tombstone`) are left out here, once for every store: after a
    prune, ``dibs ls`` would otherwise list every key ever used as "free". Nothing that works through
    a listing needs them (``reap`` and ``prune`` have nothing left to do to one); reading the key
    directly still shows its fence.

    The one rule of every store for a record it cannot read while listing (a foreign value, a damaged
    row, a directory where a file belongs): skip it, log a warning naming it, count it in
    :attr:`skipped`, and go on with every other key. One bad record must not stop ``dibs ls`` or the
    reaper; reading that key directly still raises :class:`~dibs.errors.CorruptRecord`.
    """

    def __init__(self, states: Iterable[KeyState] = (), skipped: Iterable[Skipped] = ()) -> None:
        kept = (state for state in states if not transitions.is_tombstone(state))
        self._states = iter(sorted(kept, key=lambda state: state.key))
        self.skipped = tuple(skipped)

    def __iter__(self) -> Listing:
        return self

    def __next__(self) -> KeyState:
        return next(self._states)


def skip(skipped: list[Skipped], where: str, error: CorruptRecord) -> None:
    """Apply the listing rule to one unreadable record (see :class:`Listing`)."""
    log.warning("skipping an unreadable record: %s", error)
    skipped.append(Skipped(where, str(error)))


#: Runs a change on each of some records (up to :data:`PROGRESS_EVERY`) and returns each one's answer,
#: in order: one after another by default; a store whose time is its round trips runs several at once
#: (Azure: :meth:`RecordStore._each`).
Each = Callable[[Callable[[KeyState], int], Sequence[KeyState]], Iterable[int]]


def _one_by_one(change: Callable[[KeyState], int], states: Sequence[KeyState]) -> list[int]:
    return [change(state) for state in states]


def change_each(
    considered: Iterable[KeyState],
    chosen: Callable[[KeyState], bool],
    change: Callable[[KeyState], int],
    where: Callable[[Key], str],
    *,
    progress: Progress | None = None,
    each: Each = _one_by_one,
) -> int:
    """The one loop of a removal that goes key by key: of each :data:`PROGRESS_EVERY` records
    ``considered``, the ``chosen`` ones are changed by ``change`` (which decides again, atomically, and
    returns how many records it changed), through ``each``; then ``progress`` is told the count so
    far. A record damaged since it was listed is skipped, named by ``where``, as by list."""

    def one(state: KeyState) -> int:
        try:
            return change(state)
        except CorruptRecord as exc:
            skip([], where(state.key), exc)
            return 0

    changed = 0
    states = builtins.list(considered)
    for start in range(0, len(states), PROGRESS_EVERY):
        changed += sum(each(one, [s for s in states[start : start + PROGRESS_EVERY] if chosen(s)]))
        if progress is not None:
            progress(changed)
    return changed


def reap_each(
    store: Store,
    namespace: str | None,
    clear_expired: Callable[[Key], bool],
    where: Callable[[Key], str],
    progress: Progress | None = None,
    *,
    listing: Iterable[KeyState] | None = None,
    each: Each = _one_by_one,
) -> int:
    """The one way to reap (see :meth:`Store.reap`), for every store: each listed record whose lease
    expired is cleared by ``clear_expired`` (which must check the expiry again, atomically, on the
    store's clock: the holder may have renewed since the listing), and each record that then holds
    nothing is discarded, both steps of a record in turn, through ``each`` (see :func:`change_each`).

    ``listing`` is what to consider instead of ``store.list(namespace)``: states with at least the
    key, its lease expiry and what it holds (see :meth:`RecordStore._removal_candidates`)."""

    def expired(state: KeyState) -> bool:
        return state.lease is not None and not state.lease.live_at(state.now)

    def reap(state: KeyState) -> int:
        cleared = expired(state) and clear_expired(state.key)
        return int(store.discard(state.key) or cleared)

    return change_each(
        store.list(namespace) if listing is None else listing,
        lambda state: expired(state) or transitions.holds_nothing(state),
        reap,
        where,
        progress=progress,
        each=each,
    )


#: What runs when any store closes, with the store: the process's runtime adds its own (it stops
#: the store's watch hub, so no listening connection outlives the store). Stores know nothing above them.
CLOSE_HOOKS: list[Callable[[Store], None]] = []


class Store(Closing):
    """One-attempt atomic operations on reservation records. See the module docstring."""

    #: URL scheme(s) the store registers under, e.g. ``"sqlite"``.
    scheme: ClassVar[str] = ""
    #: Whose clock judges expiry, for the docs and ``dibs show``.
    clock: ClassVar[str] = "the store service's clock"
    #: Whether the reads a person makes (:meth:`list_page`, :meth:`latest`, :meth:`leases`,
    #: :meth:`count_states`) read the whole namespace: ``True`` for a store that keeps no index of its
    #: own and answers them from :meth:`list` (the defaults below). A store that finds them through
    #: indexes says ``False``, per instance where that depends on its settings.
    scans: bool = True

    def __init_subclass__(cls, **kwargs: object) -> None:
        """Time the key operations this class defines, for observers (see :mod:`dibs.stores.timing`)."""
        super().__init_subclass__(**kwargs)
        for operation in timing.TIMED:
            method = cls.__dict__.get(operation)
            if callable(method) and not getattr(method, "__isabstractmethod__", False):
                setattr(cls, operation, timing.timed(operation, method))

    @property
    @abc.abstractmethod
    def url(self) -> str:
        """The store's URL with any secret removed: safe to log."""

    @property
    def record_store(self) -> Store:
        """The store that keeps this one's records: itself, or the one a wrapper (a payload-referencing
        store) keeps them in. Two stores with one record store are one set of keys: a key held through
        one is held through the other (see :func:`dibs.holding.not_held_here`)."""
        return self

    @abc.abstractmethod
    def read(self, key: Key) -> KeyState:
        """The key's state at one instant of the store's clock (an empty state if never seen)."""

    @abc.abstractmethod
    def acquire(self, key: Key, request: AcquireRequest) -> StoreOutcome:
        """``get_or_reserve`` in one atomic step: :class:`Present`, :class:`Granted` or :class:`Held`.

        An artifact counts only if it is fresh by the store's clock (:meth:`AcquireRequest.takes
        <dibs.stores.requests.AcquireRequest.takes>`); a stale one is no hit, the lease can be taken
        beside it, and the new artifact replaces it on ``complete``. The terms come as one object (see
        :mod:`dibs.stores.requests`), so a new term never changes this signature.
        """

    @abc.abstractmethod
    def heartbeat(self, key: Key, token: LeaseToken, ttl: float) -> LeaseRecord:
        """Extend the lease to store-now + ``ttl`` (capped by its max age); :class:`LeaseLost` if stale."""

    @abc.abstractmethod
    def complete(self, key: Key, token: LeaseToken, artifact: NewArtifact) -> ArtifactRecord:
        """Store ``artifact`` and end the lease atomically, only while ``token`` is current.

        Its ``compute_seconds`` (how long the work ran) is kept with it when given."""

    @abc.abstractmethod
    def release(self, key: Key, token: LeaseToken, error: str | None = None, *, counted: bool = True) -> None:
        """End the lease without an artifact, recording ``error`` when given: as a failure (its count
        goes up) unless ``counted`` is false, for a stop, which is recorded but not counted."""

    @abc.abstractmethod
    def force_release(self, key: Key) -> bool:
        """Drop the lease whoever holds it (operator repair). ``True`` if there was one."""

    @abc.abstractmethod
    def forget(self, key: Key) -> bool:
        """Drop the artifact and failure history so the key computes again. ``True`` if any existed."""

    @abc.abstractmethod
    def list(self, namespace: str | None = None) -> Iterator[KeyState]:
        """Every key the store knows (in ``namespace`` when given), artifacts without payloads.

        Stores return a :class:`Listing`: unreadable records are skipped and counted, never raised.
        """

    @abc.abstractmethod
    def reap(self, namespace: str | None = None, *, progress: Progress | None = None) -> int:
        """Clear expired leases nobody took over, and discard records that then hold nothing (they
        become tombstones: see :meth:`discard`); returns how many records changed. Unreadable records
        are skipped (and logged) as by :meth:`list`, and left as they are. ``progress`` is told now
        and then how many have changed so far."""

    @abc.abstractmethod
    def discard(self, key: Key) -> bool:
        """Turn the key's record into a tombstone if it holds nothing (no lease, artifact or failure),
        atomically (a lease taken meanwhile keeps it). ``True`` if the record changed (a tombstone
        already is not changed again).

        No record is ever deleted: a tombstone keeps the key's fence (and its version, where the
        store compares one), so the next holder's token is higher than every earlier one (see
        :func:`~dibs.stores.transitions.tombstone`). Listings leave tombstones out.
        """

    @abc.abstractmethod
    def prune(self, namespace: str | None, older_than: float, *, progress: Progress | None = None) -> int:
        """Clear the records :func:`~dibs.stores.transitions.prunable` says are ``older_than`` seconds
        old by the store's clock (artifacts with their payloads, failures, and records that hold
        nothing), each only if it is still so when it is cleared, leaving a tombstone (see
        :meth:`discard`); returns how many records changed. Unreadable records are skipped.
        ``progress`` is told now and then how many have changed so far."""

    # -- the reads a person makes (dibs.stores.pages): bounded by what they show ------------------------
    # Apart from the per-call operations above: ``dibs ls``, ``dibs top`` and the Airflow Reservations
    # page. These defaults stream :meth:`list` and filter (the memory and file stores, and Redis on a
    # cluster without a hash tag); a store that can find what is asked for without a scan overrides
    # them (SQL and Redis, by their indexes; Azure, from its listing's metadata). The two paged reads
    # keep their public signatures here only: a store overrides the one hook both come to, :meth:`page`.
    def list_page(
        self,
        namespace: str | None,
        *,
        state: str | None = None,
        after: str | None = None,
        limit: int = pages.PAGE,
    ) -> pages.Page:
        """Up to ``limit`` records (of ``namespace``, or of all), in key order, only those whose
        :attr:`~dibs.records.KeyState.status` is ``state`` when given, starting after the cursor
        ``after`` (a previous page's :attr:`~dibs.stores.pages.Page.after`). Tombstones are never
        listed; unreadable records are skipped and counted, as by :meth:`list`."""
        return self.page(pages.Query(namespace, state=state, after=after, limit=limit))

    def prunable_page(
        self,
        namespace: str | None,
        older_than: float,
        *,
        after: str | None = None,
        limit: int = pages.PAGE,
    ) -> pages.Page:
        """Up to ``limit`` records (of ``namespace``, or of all) that :meth:`prune` with ``older_than``
        would clear now (:func:`~dibs.stores.transitions.prunable`), in key order, after the cursor
        ``after``: what ``dibs prune --dry-run`` lists, a page at a time. Unreadable records are
        skipped and counted, as by :meth:`list`."""
        return self.page(pages.Query(namespace, after=after, limit=limit, older_than=older_than))

    def page(self, query: pages.Query) -> pages.Page:
        """The page ``query`` asks for (:meth:`list_page`, or with its ``older_than``,
        :meth:`prunable_page`): what a store that finds pages without a scan overrides. The query is
        already checked. The default streams :meth:`list` and keeps what the query keeps."""
        return pages.page_of(self.list(query.namespace), query)

    def list_pages(
        self,
        namespace: str | None,
        *,
        state: str | None = None,
        after: str | None = None,
        limit: int = pages.PAGE,
        first: int | None = None,
    ) -> Iterator[pages.Page]:
        """The pages of :meth:`list_page` one after the other, from ``after`` to the last (``dibs ls``),
        each of ``limit`` records, or from ``first`` doubling up to ``limit`` (a lookup that may end
        after a few). A store that :attr:`scans` reads its listing once for all of them, not once a
        page."""
        return self._pages(pages.Query(namespace, state=state, after=after, limit=limit), first)

    def prunable_pages(
        self, namespace: str | None, older_than: float, *, after: str | None = None, limit: int = pages.PAGE
    ) -> Iterator[pages.Page]:
        """The pages of :meth:`prunable_page` one after the other (``dibs prune --dry-run``); a store that
        :attr:`scans` reads its listing once for all of them."""
        return self._pages(pages.Query(namespace, after=after, limit=limit, older_than=older_than))

    def _pages(self, query: pages.Query, first: int | None = None) -> Iterator[pages.Page]:
        if self.scans:
            return pages.pages_of(self.list(query.namespace), query)
        return pages.successive(self.read_page, query, first)

    def read_page(self, query: pages.Query) -> pages.Page:
        """The page ``query`` asks for, through :meth:`list_page` or :meth:`prunable_page`: a store
        written before :meth:`page` that overrides those itself is read through its own overrides
        (a store that overrides :meth:`page` comes to it either way)."""
        if query.older_than is None:
            return self.list_page(query.namespace, state=query.state, after=query.after, limit=query.limit)
        return self.prunable_page(query.namespace, query.older_than, after=query.after, limit=query.limit)

    def latest(self, namespace: str | None, kind: pages.Kind, *, limit: int) -> builtins.list[KeyState]:
        """The ``limit`` records whose artifact (``kind="artifact"``) or last failure (``"failure"``)
        is newest, newest first."""
        return pages.latest_of(self.list(namespace), kind, limit)

    def leases(self, namespace: str | None, *, expired: bool, limit: int) -> builtins.list[KeyState]:
        """Up to ``limit`` keys held now (status ``held``), soonest expiry first; with ``expired``,
        those whose lease expired with nobody taking over yet (status ``expired``), latest first."""
        return pages.leases_of(self.list(namespace), expired=expired, limit=limit)

    def count_states(self, namespace: str | None, *, up_to: int = pages.COUNT_CAP) -> dict[str, int]:
        """How many keys are ``held``, ``expired``, ``done`` and ``failed``, each counted up to
        ``up_to`` (a count of ``up_to`` means at least that many)."""
        return pages.count_of(self.list(namespace), up_to)

    def overview(
        self, namespace: str | None, *, leases: int, recent: int, up_to: int = pages.COUNT_CAP
    ) -> pages.Overview:
        """What ``dibs top`` shows of ``namespace`` (or of all): :meth:`count_states`, ``leases`` held and
        expired leases (:meth:`leases`) and the ``recent`` newest artifacts and failures (:meth:`latest`).
        A store that :attr:`scans` answers from one listing rather than five."""
        if self.scans:
            return pages.overview_of(self.list(namespace), leases=leases, recent=recent, up_to=up_to)
        return pages.Overview(
            counts=self.count_states(namespace, up_to=up_to),
            held=self.leases(namespace, expired=False, limit=leases),
            expired=self.leases(namespace, expired=True, limit=leases),
            artifacts=self.latest(namespace, "artifact", limit=recent),
            failures=self.latest(namespace, "failure", limit=recent),
        )

    def read_many(self, keys: Sequence[Key]) -> builtins.list[KeyState]:
        """The states of several keys, for the watch hub (stores that can read them together override
        this). A key whose record cannot be read is left out: its waiters then ask for themselves, and
        get the error."""
        states = []
        for key in keys:
            try:
                states.append(self.read(key))
            except StoreUnavailable:
                raise
            except ReservationError as exc:
                log.debug("the watch hub skipped %s: %s", key, exc)
        return states

    def view_many(self, states: Sequence[KeyState]) -> builtins.list[KeyState]:
        """``states``, read from :attr:`record_store`, as this store shows them (one each, in order).

        The process's watch hub follows a record store once for every store wrapped around it (see
        :mod:`dibs.hub`), and hands each waiter the states as the store it waits through would have
        read them: a payload-referencing store resolves references here (and may load a payload, or
        only check it is there). A store that keeps its own records shows them as they are."""
        return builtins.list(states)

    @property
    def view_loads(self) -> bool:
        """Whether :meth:`view_many` may load payloads (slow: a remote file system's open). The watch
        hub shows states through such views after every other, so their waiters never hold back
        those of the views that only read records."""
        return False

    def change_feed(self) -> ChangeFeed | None:
        """The feed that tells this process's watch hub which keys may have changed (see
        :mod:`dibs.stores.feeds`). ``None`` leaves every waiter to poll on its own."""
        return ReadPollingFeed(self)

    def close(self) -> None:
        """Release connections and clients. The store must not be used afterwards.

        Subclasses that hold connections extend this (and call it): it stops the process's watch hub
        of this store, so no listening connection outlives the store.
        """
        for hook in CLOSE_HOOKS:
            hook(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


class RecordStore(Store):
    """A store that reads one record per key and replaces it with a compare-and-swap.

    Subclasses implement :meth:`_load` (the state plus an opaque version such as an ETag or a file's
    inode) and :meth:`_swap` (write only if the version is unchanged); every operation is then the
    transition function applied between the two. A lost swap is retried with a fresh read, because a
    swap only fails when somebody else *changed* the record, so progress is guaranteed.
    """

    #: How often a lost compare-and-swap is retried before the store reports contention.
    max_swap_attempts: ClassVar[int] = 64

    @abc.abstractmethod
    def _load(self, key: Key) -> tuple[KeyState, object]:
        """Read the key's state (``now`` on the store's clock) and a version for :meth:`_swap`."""

    @abc.abstractmethod
    def _swap(self, key: Key, version: object, new: KeyState, old: KeyState) -> bool | Loaded:
        """Write ``new`` only if the record is still at ``version``; ``False`` if someone changed it.
        ``old`` is the state ``new`` was decided from (a store that keeps payloads apart deletes the
        one ``new`` no longer names, after the swap). A record is never deleted (removal writes a
        tombstone), so no version of it comes back and no late delete hits a payload named again.

        A store that had to read the record anyway to tell a lost swap from a lost reply returns that
        read (state and version) instead of ``False``, and the next attempt decides from it.
        """

    def read(self, key: Key) -> KeyState:
        return self._load(key)[0]

    def _removal_candidates(self, namespace: str | None) -> Iterable[KeyState]:
        """The records ``prune`` and ``reap`` consider: :meth:`list`, unless the store can name its
        candidates more cheaply (Azure: from the listing's metadata). Each needs only what the removal
        rules read (key, ``now``, lease expiry, artifact and failure times, attempts): every change is
        decided again by its own read and compare-and-swap."""
        return self.list(namespace)

    def _update(
        self,
        key: Key,
        change: Callable[[KeyState], tuple[T, KeyState | None]],
        loaded: Loaded | None = None,
    ) -> T:
        """Apply ``change`` with a compare-and-swap, again on a fresh read while somebody else wins.

        ``loaded`` is a read the caller already made (it saves the first ``_load``).
        """
        for _ in range(self.max_swap_attempts):
            state, version = loaded if loaded is not None else self._load(key)
            result, new_state = change(state)
            if new_state is None:
                return result
            swapped = self._swap(key, version, new_state, state)
            if swapped is True:
                return result
            loaded = swapped if isinstance(swapped, tuple) else None
        raise StoreUnavailable(
            f"{key} changed {self.max_swap_attempts} times while this client tried to update it; "
            "the store is under heavy contention on this key",
            key=str(key),
        )

    def acquire(self, key: Key, request: AcquireRequest) -> StoreOutcome:
        return self._update(key, lambda state: transitions.acquire(state, request))

    def heartbeat(self, key: Key, token: LeaseToken, ttl: float) -> LeaseRecord:
        return self._update(key, lambda state: transitions.heartbeat(state, token, ttl))

    def complete(self, key: Key, token: LeaseToken, artifact: NewArtifact) -> ArtifactRecord:
        return self._update(key, lambda state: transitions.complete(state, token, artifact))

    def release(self, key: Key, token: LeaseToken, error: str | None = None, *, counted: bool = True) -> None:
        self._update(key, lambda state: (None, transitions.release(state, token, error, counted)))

    def force_release(self, key: Key) -> bool:
        return self._update(key, lambda state: _changed(transitions.force_release(state)))

    def forget(self, key: Key) -> bool:
        return self._update(key, lambda state: _changed(transitions.forget(state)))

    def reap(self, namespace: str | None = None, *, progress: Progress | None = None) -> int:
        return reap_each(
            self,
            namespace,
            lambda key: self._update(key, lambda s: _changed(transitions.reap(s))),
            str,
            progress,
            listing=self._removal_candidates(namespace),
            each=self._each,
        )

    def discard(self, key: Key) -> bool:
        return self._update(key, lambda state: _changed(transitions.discard(state)))

    def prune(self, namespace: str | None, older_than: float, *, progress: Progress | None = None) -> int:
        return change_each(
            self._removal_candidates(namespace),
            lambda state: transitions.prunable(state, older_than),
            lambda state: self._update(state.key, lambda s: _changed(transitions.prune(s, older_than))),
            str,
            progress=progress,
            each=self._each,
        )

    def _each(self, change: Callable[[KeyState], int], states: Sequence[KeyState]) -> Iterable[int]:
        """How ``prune`` and ``reap`` change their chosen records (see :data:`Each`): one after
        another, each its own read and compare-and-swap. A store whose time is round trips to a
        service runs several at once (Azure); each change is the same one either way."""
        return _one_by_one(change, states)


def _changed(new_state: KeyState | None) -> tuple[bool, KeyState | None]:
    return new_state is not None, new_state


def refuse_too_large(
    key: Key, payload_size: int, needed: int, limit: int, *, where: str, remedy: str
) -> None:
    """Refuse, before anything is sent, a ``complete`` whose write (``needed`` bytes for a payload of
    ``payload_size``) is more than the store takes in one write (``limit``, named by ``where``).

    Every store that has such a limit calls this first: a store that is sent too much fails in its own
    way (Redis and MySQL drop the connection, which looks like a network failure and was re-sent for a
    whole ttl; SQLite raised a raw driver error and left the key held). :class:`ArtifactTooLarge` is a
    :class:`~dibs.errors.SerializationError`, so the client releases the lease with the failure
    recorded and returns the value to its own caller, as it does for a value it cannot serialize.
    """
    if needed > limit:
        raise ArtifactTooLarge(
            f"cannot store the artifact of {key}: its {payload_size:,} bytes make a {needed:,}-byte write, "
            f"more than {where} ({limit:,} bytes); nothing was stored. {remedy}",
            key=str(key),
            size=payload_size,
            limit=limit,
        )

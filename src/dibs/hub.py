"""The watch hub: one thread per record store and process, following the store, waking its waiters.

A triggerer with a thousand deferred tasks, or a worker with hundreds of threads, may wait on many
keys of one store at once. Opening a listening connection, or a thread, per waiter does not survive
that (a PostgreSQL server refuses clients at about a hundred connections). So each process has one
:class:`WatchHub` per record store, with one :class:`~dibs.stores.feeds.ChangeFeed` (a ``LISTEN``
connection, a Redis pattern subscription, a ``data_version`` probe, a poller):

* a waiter :meth:`~WatchHub.subscribe`\\ s to its key, which costs a dictionary entry;
* when the feed says some keys may have changed, the hub reads them once (in one batch where the
  store can) and hands the same state to every waiter on each key whose state changed: a thousand
  waiters on one key cost one read, not a thousand;
* the hub follows a *record* store (:attr:`~dibs.stores.Store.record_store`): the stores wrapped
  around it (a payload-referencing store that loads payloads, its twin that hands them out unread)
  are views of the same records, and share its one hub and feed. A waiter subscribes through the
  store it waits on, and the hub hands it each state as that store shows it
  (:meth:`~dibs.stores.Store.view_many`), computed once per view and change: a thousand waiters that
  load a payload cost one load, and the Airflow triggerer's record-only waiters never open one;
* sync waiters block on their own :class:`threading.Event`; async waiters await a future on their
  own event loop, resolved with one ``call_soon_threadsafe`` per loop and delivery, a bounded batch
  per iteration of that loop (:func:`dibs._batches.resolve_in_batches`): no thread per waiter, and
  a thousand waiters woken together never hold their loop for more than a batch.

Nothing depends on the hub being right, only on how fast waiters learn: every waiter still asks the
store itself after a backstop pause (see :mod:`dibs.flow`), and at its holder's expiry, which no
store announces. A pause that ends while the hub is reading the waiter's key lasts until that read
is offered: a large value held in its record takes seconds to read, and the waiter's own ask would
read it a second time beside the hub's (two copies in memory). While the hub cannot follow the store
(its connection is refused, say) it says so (:attr:`WatchHub.following`) and waiters poll at the
ordinary backoff until it is back; after every reconnection it reads all watched keys, so nothing
that happened meanwhile is missed. A feed that opens but cannot hear (a PostgreSQL ``LISTEN`` behind
a transaction pooler, which proves that it hears before it counts) is not following either: one
warning says why and what to set, and the hub tries it again only after a while
(:class:`~dibs.stores.feeds.Unheard`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Collection, Hashable

from dibs._batches import wake_soon
from dibs._closing import Closing
from dibs.backoff import Backoff
from dibs.errors import StoreUnavailable
from dibs.keys import Key
from dibs.records import KeyState
from dibs.stores.base import Store
from dibs.stores.feeds import ChangeFeed, Unheard, fingerprint

__all__ = ["Subscription", "WatchHub"]

log = logging.getLogger("dibs.hub")

#: The longest the hub blocks inside its feed, so that it notices closing and idleness promptly.
POLL_SECONDS = 0.5
#: How often a waiter whose pause ended while the hub reads its key looks whether that read is over.
READ_POLL = 0.05
#: Pauses between attempts to (re)open a feed that failed: from the first to the last, doubling.
REOPEN_FIRST, REOPEN_LAST = 0.1, 5.0
_REOPENING = Backoff(initial=REOPEN_FIRST, maximum=REOPEN_LAST, notify_maximum=REOPEN_LAST, jitter=0.0)


#: Locks shared by all subscriptions, picked by a subscription's identity: a lock per subscription
#: was one more object per waiter for the garbage collector to traverse (a triggerer keeps a thousand
#: waiters, issue 20); each lock is held for a few assignments, so sharing costs no waiting. A list,
#: renewed in place in a forked child.
_LOCKS = [threading.Lock() for _ in range(64)]


def _new_locks_after_fork() -> None:
    # A lock the hub's thread held when the process forked stays held in the child, with no thread to
    # release it: the child's subscriptions get locks of their own (the parent's hubs are forgotten too).
    _LOCKS[:] = [threading.Lock() for _ in _LOCKS]


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_locks_after_fork)


class Subscription(Closing):
    """One waiter's interest in one key, until :meth:`close`.

    The hub offers it each new state of the key it reads (or ``None``: "ask the store yourself");
    a waiter takes the latest offer with :meth:`wait` in a thread or :meth:`wait_async` on an event loop.
    """

    __slots__ = ("_closed", "_event", "_future", "_has", "_hub", "_lock", "_loop", "_offered", "key", "view")

    def __init__(self, hub: WatchHub | None, key: Key, view: Store | None = None) -> None:
        self.key = key
        #: The store this waiter reads through, when it is a view of the hub's record store (``None``:
        #: the hub's store itself).
        self.view = view
        self._hub = hub
        self._lock = _LOCKS[(id(self) >> 4) % len(_LOCKS)]
        self._offered: KeyState | None = None
        self._has = False
        self._event: threading.Event | None = None
        # The async waiter, if one waits: its loop and the future it awaits (two slots, not a tuple).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._future: asyncio.Future[None] | None = None
        self._closed = False

    @property
    def following(self) -> bool:
        """Whether the hub follows the store right now: then this waiter's own asking is only a backstop."""
        return self._hub is not None and self._hub.following

    def is_following(self) -> bool:
        """:attr:`following`, as a function for the waiting loops to call."""
        return self._hub is not None and self._hub.following

    # -- the hub's side (its thread) --------------------------------------------------------------
    def _offer(self, state: KeyState | None) -> tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None:
        """Keep ``state`` for the waiter and wake it; the async waiter to wake on its loop, if any."""
        with self._lock:
            self._offered, self._has = state, True
            if self._event is not None:
                self._event.set()
            loop, future, self._loop, self._future = self._loop, self._future, None, None
        return None if loop is None or future is None else (loop, future)

    def _take(self) -> KeyState | None:
        state, self._offered, self._has = self._offered, None, False
        return state

    # -- the waiter's side --------------------------------------------------------------------------
    def wait(self, timeout: float) -> KeyState | None:
        """Block up to ``timeout`` seconds for the hub's next offer; ``None`` if none came (or it said
        "ask yourself")."""
        with self._lock:
            if self._has:
                return self._take()
            if self._event is None:
                self._event = threading.Event()
            event = self._event
            event.clear()
        event.wait(max(0.0, timeout))
        with self._lock:
            if self._has:
                return self._take()
        # The hub is reading this key: its answer comes with that read (a large value takes a while to
        # read), and an ask of the waiter's own now would read the same value a second time.
        while self._hub is not None and self._hub.reading(self.key):
            event.wait(READ_POLL)
            with self._lock:
                if self._has:
                    return self._take()
        return None

    async def wait_async(self, timeout: float) -> KeyState | None:
        """:meth:`wait` for an event loop: no thread is held, the loop is never blocked."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._has:
                return self._take()
            future: asyncio.Future[None] = loop.create_future()
            self._loop, self._future = loop, future
        timer = loop.call_later(max(0.0, timeout), _resolve, future)
        try:
            await future
        finally:
            timer.cancel()
            with self._lock:
                if self._future is future:
                    self._loop = self._future = None
        with self._lock:
            if self._has:
                return self._take()
        while self._hub is not None and self._hub.reading(self.key):  # as in wait()
            await asyncio.sleep(READ_POLL)
            with self._lock:
                if self._has:
                    return self._take()
        return None

    def close(self) -> None:
        """Stop following the key (safe to call twice)."""
        if not self._closed:
            self._closed = True
            if self._hub is not None:
                self._hub._unsubscribe(self)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _Watched:
    """The subscriptions of one key, and the fingerprint of the last state handed to them."""

    __slots__ = ("key", "reading", "seen", "subscriptions")

    def __init__(self, key: Key) -> None:
        self.key = key
        self.subscriptions: set[Subscription] = set()
        self.seen: Hashable = None
        #: How many reads of the hub's are under way for the key (until their states are offered).
        self.reading = 0


class WatchHub:
    """Follows one store for every waiter of this process. See the module docstring.

    Created by :func:`dibs.runtime.runtime` (one per record store object, shared by the stores wrapped
    around it); its thread starts with the first subscription and ends, closing the feed, after the
    feed's ``idle_seconds`` without any.
    """

    def __init__(self, store: Store, feed: ChangeFeed) -> None:
        self._store = store
        self._feed = feed
        self._lock = threading.Lock()
        self._watched: dict[str, _Watched] = {}
        self._thread: threading.Thread | None = None
        self._following = False
        self._closed = False
        self._stopped = threading.Event()
        #: A feed that opened but did not hear (:class:`~dibs.stores.feeds.Unheard`) is not opened
        #: again before this (monotonic) time, whichever thread of the hub tries; and said once.
        self._unheard_until = 0.0
        self._told_unheard = False

    @property
    def following(self) -> bool:
        """Whether the feed is open: waiters are woken by the hub and only ask now and then themselves."""
        return self._following

    def reading(self, key: Key) -> bool:
        """Whether the hub is reading ``key`` for its waiters right now (its state is offered after)."""
        entry = self._watched.get(key.digest)
        return entry is not None and entry.reading > 0

    @property
    def watched(self) -> int:
        """How many keys somebody waits on."""
        return len(self._watched)

    @property
    def waiters(self) -> int:
        """How many subscriptions (waiters) there are, on all keys."""
        with self._lock:
            return sum(len(entry.subscriptions) for entry in self._watched.values())

    def subscribe(self, key: Key, view: Store | None = None) -> Subscription:
        """Follow ``key`` for one waiter, who reads through ``view`` (a store wrapped around this hub's
        record store; ``None``: the record store itself). Subscribe *before* the waiter's own read, so
        that no change after that read can be missed."""
        view = None if view is self._store else view
        subscription = Subscription(self, key, view)
        with self._lock:
            if self._closed:
                return Subscription(None, key)  # a closed store: the waiter polls (and gets its error)
            watched = self._watched.get(key.digest)
            new = watched is None
            if watched is None:
                watched = self._watched[key.digest] = _Watched(key)
            watched.subscriptions.add(subscription)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"dibs-hub-{type(self._store).__name__}", daemon=True
                )
                self._thread.start()
        if new:
            self._feed.wake()  # a polling feed looks at the keys it was given: give it this one now
        else:
            self._feed.quicken()  # a polling feed's next look comes soon again
        return subscription

    def _unsubscribe(self, subscription: Subscription) -> None:
        with self._lock:
            watched = self._watched.get(subscription.key.digest)
            if watched is not None:
                watched.subscriptions.discard(subscription)
                if not watched.subscriptions:
                    del self._watched[subscription.key.digest]

    def close(self) -> None:
        """Stop following the store; the thread closes the feed within a poll. Waiters still
        subscribed are told to ask for themselves."""
        with self._lock:
            self._closed = True
            everyone = list(self._watched.values())
            self._watched.clear()
        self._stopped.set()
        self._deliver([(watched, None) for watched in everyone])

    # -- the hub's thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        feed = self._feed
        opened = False
        let_go = False  # the feed was closed and the thread handed back under the lock (idle)
        failures = 0
        reread = False  # read every watched key on the next round (after a reconnection or a failed read)
        idle_since: float | None = None
        try:
            while True:
                with self._lock:
                    if self._closed:
                        return
                    idle_since = None if self._watched else (idle_since or time.monotonic())
                    if idle_since is not None and time.monotonic() - idle_since >= feed.idle_seconds:
                        self._let_go(feed)
                        let_go = True
                        return
                    watched = {digest: entry.key for digest, entry in self._watched.items()}
                if not opened:
                    unheard = self._unheard_until - time.monotonic()
                    if unheard > 0:  # deaf a moment ago: waiters poll; look at idleness meanwhile
                        self._stopped.wait(min(POLL_SECONDS, unheard))
                        continue
                    opened = self._open(feed, failures)
                    failures = 0 if opened else failures + 1
                    if opened:
                        try:  # a first look, so that a polling feed knows every key before the reads
                            feed.changes(watched, 0.0)
                        except Exception:
                            log.debug(
                                "the first look of the feed of %s failed", self._store.url, exc_info=True
                            )
                    reread = opened  # whatever happened while nobody listened
                    continue
                if reread:
                    reread = not self._refresh(watched)
                    if reread:
                        self._stopped.wait(REOPEN_FIRST)
                    continue
                try:
                    changed = feed.changes(watched, POLL_SECONDS)
                except Exception as exc:  # the feed broke (a restart, a cut): listen again
                    if self._closed:
                        return  # its store was closed under it: nothing to report
                    log.warning(
                        "lost the change feed of %s (%s); waiters poll until it is back", self._store.url, exc
                    )
                    self._following = opened = False
                    feed.close()
                    continue
                if changed and not self._refresh(changed):
                    reread = True  # the store did not answer: read them all again in a moment
                    self._stopped.wait(REOPEN_FIRST)
        finally:
            if not let_go:
                self._following = False
                feed.close()

    def _let_go(self, feed: ChangeFeed) -> None:
        """End an idle hub's thread (under the lock). The feed is closed before the thread is handed
        back: a later subscription starts a new thread, which opens this same feed, and must find it
        closed, not have it closed under it by this thread on its way out."""
        self._following = False
        feed.close()
        self._thread = None

    def _open(self, feed: ChangeFeed, failures: int) -> bool:
        if failures:
            self._stopped.wait(_REOPENING.delay(failures - 1))
            if self._closed:
                return False
        try:
            feed.open()
        except Exception as exc:
            feed.close()
            if not self._closed:  # a hub closed while its feed opened has nothing to report
                self._not_opened(exc, failures)
            return False
        self._following = True
        if failures:
            log.info("following %s again", self._store.url)
        return True

    def _not_opened(self, exc: Exception, failures: int) -> None:
        """Say why the feed did not open: its first failure as a warning, the next ones quietly; a
        feed that opened and did not hear (:class:`~dibs.stores.feeds.Unheard`) once per hub, and it
        is not tried again for a while."""
        if isinstance(exc, Unheard):
            self._unheard_until = time.monotonic() + exc.retry_after
            (log.debug if self._told_unheard else log.warning)(
                "%s: %s; its waiters poll (each asks about once a second) and the hub tries again in %g s",
                self._store.url,
                exc,
                exc.retry_after,
            )
            self._told_unheard = True
            return
        (log.warning if failures == 0 else log.debug)(
            "cannot follow %s (%s); its waiters poll until the hub can", self._store.url, exc
        )

    def _refresh(self, digests: Collection[str]) -> bool:
        """Read the watched keys among ``digests`` once and hand each changed state to its waiters.

        ``False`` when the store did not answer (the caller reads them again later).
        """
        with self._lock:
            entries = [self._watched[digest] for digest in digests if digest in self._watched]
            for entry in entries:
                entry.reading += 1
        try:
            return self._read_and_offer(entries)
        finally:
            with self._lock:
                for entry in entries:
                    entry.reading -= 1

    def _read_and_offer(self, entries: list[_Watched]) -> bool:
        if not entries:
            return True
        keys = [entry.key for entry in entries]
        try:
            states = self._feed.read_many(self._store, keys)
            if states is None:
                states = self._store.read_many(keys)
        except StoreUnavailable as exc:
            log.debug("the watch hub could not read %d key(s) of %s: %s", len(entries), self._store.url, exc)
            return False
        except Exception as exc:  # a bug or a broken store must not kill the hub: waiters ask themselves
            log.warning("the watch hub could not read keys of %s: %r", self._store.url, exc)
            self._deliver([(entry, None) for entry in entries])
            return True
        by_digest = {state.key.digest: state for state in states}
        offers: list[tuple[Subscription, KeyState | None]] = []
        changed: list[tuple[list[Subscription], KeyState]] = []
        for entry in entries:
            state = by_digest.get(entry.key.digest)
            if state is None:  # unreadable or absent: its waiters ask for themselves
                offers.extend((subscription, None) for subscription in self._subscriptions(entry))
                continue
            seen = fingerprint(state)
            if seen != entry.seen:
                entry.seen = seen
                changed.append((self._subscriptions(entry), state))
        self._through_views(offers, changed)
        return True

    def _through_views(
        self,
        offers: list[tuple[Subscription, KeyState | None]],
        changed: list[tuple[list[Subscription], KeyState]],
    ) -> None:
        """Offer each changed state to each of its waiters as the store that waiter reads through shows
        it: one :meth:`~dibs.stores.Store.view_many` per view for all its waiters' keys (a payload
        loaded once for all of them, or only checked to be there for a record-only view). Offered as
        soon as each is ready: first ``offers`` and the waiters on the record store itself, then each
        view's, those that only read records before those that load payloads
        (:attr:`~dibs.stores.Store.view_loads`), so a slow load never holds back the others."""
        views: dict[int, tuple[Store, list[tuple[Subscription, KeyState]]]] = {}
        for subscriptions, state in changed:
            for subscription in subscriptions:
                if subscription.view is None:
                    offers.append((subscription, state))
                else:
                    views.setdefault(id(subscription.view), (subscription.view, []))[1].append(
                        (subscription, state)
                    )
        self._offer_all(offers)
        for view, waiting in sorted(views.values(), key=lambda each: each[0].view_loads):
            raw = list({state.key.digest: state for _, state in waiting}.values())
            try:
                shown = {state.key.digest: state for state in view.view_many(raw)}
            except Exception as exc:  # a payload store that failed: those waiters ask for themselves
                log.warning(
                    "the watch hub could not read keys of %s through %r: %r", self._store.url, view, exc
                )
                shown = {}
            self._offer_all([(subscription, shown.get(state.key.digest)) for subscription, state in waiting])

    def _subscriptions(self, entry: _Watched) -> list[Subscription]:
        with self._lock:
            return list(entry.subscriptions)

    def _deliver(self, deliveries: list[tuple[_Watched, KeyState | None]]) -> None:
        offers = [(each, state) for entry, state in deliveries for each in self._subscriptions(entry)]
        self._offer_all(offers)

    def _offer_all(self, offers: list[tuple[Subscription, KeyState | None]]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[None], None, None]]] = {}
        for subscription, state in offers:
            waiter = subscription._offer(state)
            if waiter is not None:
                by_loop.setdefault(waiter[0], []).append((waiter[1], None, None))
        for loop, futures in by_loop.items():
            wake_soon(loop, futures)  # in bounded batches: a thousand waiters never stall their loop

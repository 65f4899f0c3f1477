"""The process-wide runtime: what every dibs client of one process shares.

A process may build many clients for one store: an Airflow triggerer builds one per deferred task, a
Prefect worker one per task run, a web service one per request. Each used to open its own engine,
check the schema and listen on a connection of its own, and a few dozen of them filled a PostgreSQL
server. So the runtime keeps, per process:

* **one store object per store URL**, shared by every client built for that URL, with its bounded
  connection pool and its once-only schema check. A client's :meth:`~dibs.Reservations.close` only
  gives its share back; a store nobody uses stays open for the next client (up to
  :attr:`Runtime.MAX_IDLE` of them, least recently used first out);
* **one watch hub per record store** (:mod:`dibs.hub`), which follows the store for every waiter,
  whichever store wrapped around it (a payload-referencing one, loading payloads or not) they wait
  through;
* **one small I/O executor** (:attr:`Runtime.IO_THREADS` threads) in which async callers run the
  store's one-attempt operations, so an event loop never blocks on the store and never ties up the
  loop's default executor, which the host (Airflow's triggerer, say) needs for itself.

It is fork-safe: a forked child starts with an empty runtime and builds its own store objects, pools,
hubs and executor on first use, never touching its parent's connections.
"""

from __future__ import annotations

import atexit
import collections
import functools
import logging
import os
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from dibs import events
from dibs.keys import Key
from dibs.stores import Store, open_store
from dibs.stores.base import CLOSE_HOOKS

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

    from dibs._batches import ReadBatcher
    from dibs.hub import Subscription, WatchHub
    from dibs.records import KeyState

__all__ = ["Runtime", "runtime"]

log = logging.getLogger("dibs.runtime")

P = ParamSpec("P")
T = TypeVar("T")


class _Shared:
    __slots__ = ("clients", "store")

    def __init__(self, store: Store) -> None:
        self.store = store
        self.clients = 0


class Runtime:
    """See the module docstring. There is one per process: :func:`runtime`."""

    #: Stores kept open without any client, for the next client of the same URL.
    MAX_IDLE = 8
    #: Threads of the I/O executor shared by every async caller of the process.
    IO_THREADS = 4
    #: The name prefix of the I/O executor's threads (a callback can tell whether it runs in one).
    IO_THREAD_PREFIX = "dibs-io"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._shared: dict[str, _Shared] = {}
        self._idle: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._hubs: weakref.WeakKeyDictionary[Store, WatchHub | None] = weakref.WeakKeyDictionary()
        self._readers: weakref.WeakKeyDictionary[Store, ReadBatcher] = weakref.WeakKeyDictionary()
        self._executor: ThreadPoolExecutor | None = None

    # -- stores ---------------------------------------------------------------------------------------
    def share_store(self, url: str) -> Store:
        """The store at ``url``, shared with every other client of this process; give it back with
        :meth:`return_store`. Opening one sends nothing to the service (see each store)."""
        with self._lock:
            shared = self._shared.get(url)
            if shared is None:
                shared = self._shared[url] = _Shared(open_store(url))
            shared.clients += 1
            self._idle.pop(url, None)
            return shared.store

    def has_store(self, url: str) -> bool:
        """Whether a store for ``url`` is open in this process (a new client of it costs no I/O)."""
        return url in self._shared

    def return_store(self, store: Store) -> None:
        """A client is done with ``store``: keep it for the next client, or close the least recently
        used store nobody uses if too many are idle."""
        evicted: list[Store] = []
        with self._lock:
            for url, shared in self._shared.items():
                if shared.store is store:
                    shared.clients = max(0, shared.clients - 1)
                    if shared.clients == 0:
                        self._idle[url] = None
                    break
            while len(self._idle) > self.MAX_IDLE:
                url, _ = self._idle.popitem(last=False)
                evicted.append(self._shared.pop(url).store)
        for doomed in evicted:
            self._close_soon(doomed)

    def _close_soon(self, store: Store) -> None:
        """Close ``store`` in the background: the caller may be an event loop, and closing waits for
        connections."""
        self.executor().submit(_close_quietly, store)

    # -- watch hubs -----------------------------------------------------------------------------------
    def hub(self, store: Store) -> WatchHub | None:
        """The watch hub of ``store``'s records in this process (:attr:`Store.record_store
        <dibs.stores.Store.record_store>`: every store wrapped around one record store shares its hub,
        and so its one feed and listening connection), created on first use; ``None`` when the store
        offers no change feed (its waiters poll)."""
        records = store.record_store
        with self._lock:
            if records in self._hubs:
                return self._hubs[records]
        from dibs.hub import WatchHub  # asyncio comes with it: only processes that wait pay for it

        feed = records.change_feed()
        hub = WatchHub(records, feed) if feed is not None else None
        with self._lock:
            return self._hubs.setdefault(records, hub)

    def subscribe(self, store: Store, key: Key) -> Subscription:
        """Follow ``key`` of ``store`` for one waiter, who is handed each state as ``store`` shows it
        (a subscription that only pauses if there is no hub)."""
        from dibs.hub import Subscription

        hub = self.hub(store)
        return hub.subscribe(key, store) if hub is not None else Subscription(None, key)

    def stop_hub(self, store: Store) -> None:
        """Stop the hub of ``store`` (its store is being closed)."""
        with self._lock:
            hub = self._hubs.pop(store, None)
        if hub is not None:
            hub.close()

    # -- the I/O executor -----------------------------------------------------------------------------
    def executor(self) -> ThreadPoolExecutor:
        from concurrent.futures import ThreadPoolExecutor  # only processes that need it pay for it

        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    max_workers=self.IO_THREADS, thread_name_prefix=self.IO_THREAD_PREFIX
                )
            return self._executor

    async def io(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` in the I/O executor, awaited: for store calls from an event loop
        (naming the front end of the call they serve: :func:`dibs.events.for_this_call`)."""
        import asyncio

        loop = asyncio.get_running_loop()
        job = events.for_this_call(functools.partial(fn, *args, **kwargs))
        return await loop.run_in_executor(self.executor(), job)

    async def read(self, store: Store, key: Key) -> KeyState:
        """``store.read(key)`` for an event loop, in the I/O executor, batched with the other reads
        waiting there for a thread (:class:`dibs._batches.ReadBatcher`): a thousand waiters starting
        together cost a few ``read_many`` calls, not a thousand jobs."""
        with self._lock:
            batcher = self._readers.get(store)
        if batcher is None:
            from dibs._batches import ReadBatcher

            fresh = ReadBatcher(store, lambda job: self.executor().submit(job))
            with self._lock:
                batcher = self._readers.setdefault(store, fresh)
        return await batcher.read(key)

    # -- lifecycle ------------------------------------------------------------------------------------
    def close(self) -> None:
        """Close every shared store and hub (for tests and orderly shutdowns); clients built before
        keep working by opening their store again on their next :class:`~dibs.Reservations`."""
        with self._lock:
            stores = [shared.store for shared in self._shared.values()]
            self._shared.clear()
            self._idle.clear()
            hubs = [hub for hub in self._hubs.values() if hub is not None]
            self._hubs.clear()
        for hub in hubs:
            hub.close()
        for store in stores:
            _close_quietly(store)

    def stop_hubs(self) -> None:
        """Stop every hub's thread, leaving the stores open: at interpreter exit, so that no hub is
        still asking a store (and logging about it) while the interpreter tears down."""
        with self._lock:
            hubs = [hub for hub in self._hubs.values() if hub is not None]
            self._hubs.clear()
        for hub in hubs:
            hub.close()

    def _forget_after_fork(self) -> None:
        # The parent's connections, threads and executor are not the child's: start empty, close nothing.
        self._lock = threading.Lock()
        self._shared = {}
        self._idle = collections.OrderedDict()
        self._hubs = weakref.WeakKeyDictionary()
        self._readers = weakref.WeakKeyDictionary()
        self._executor = None


def _close_quietly(store: Store) -> None:
    try:
        store.close()
    except Exception as exc:  # closing an idle store must never fail anybody
        log.debug("closing %s failed: %s", store.url, exc)


_RUNTIME = Runtime()
os.register_at_fork(after_in_child=_RUNTIME._forget_after_fork)
CLOSE_HOOKS.append(_RUNTIME.stop_hub)  # a store closing stops its hub
atexit.register(_RUNTIME.stop_hubs)


def runtime() -> Runtime:
    """This process's runtime."""
    return _RUNTIME

"""Async access to any store, for event loops that must never block (Airflow's triggerer).

Rather than a second, drifting copy of every store written against async clients, each one-attempt
operation of the sync store runs in a worker thread (``asyncio.to_thread``). The operations are short
and bounded by the store's own timeouts, so a thread per in-flight call is cheap, and the event loop
stays free. Waiting (the long part) is written once in :mod:`dibs.waiting` for both worlds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from dibs.keys import Key
from dibs.records import ArtifactRecord, KeyState, LeaseRecord, LeaseToken, StoreOutcome
from dibs.stores.base import Store, Watch

__all__ = ["AsyncStore", "AsyncWatch"]

P = ParamSpec("P")
T = TypeVar("T")


async def _off_loop(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    return await asyncio.to_thread(fn, *args, **kwargs)


class AsyncWatch:
    def __init__(self, watch: Watch) -> None:
        self._watch = watch

    async def wait(self, timeout: float) -> bool:
        return await _off_loop(self._watch.wait, timeout)

    async def close(self) -> None:
        await _off_loop(self._watch.close)


class AsyncStore:
    """The async face of a :class:`~dibs.stores.base.Store`: same operations, awaitable."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @property
    def url(self) -> str:
        return self.store.url

    async def read(self, key: Key) -> KeyState:
        return await _off_loop(self.store.read, key)

    async def acquire(self, key: Key, owner: str, ttl: float, max_lease_age: float | None) -> StoreOutcome:
        return await _off_loop(self.store.acquire, key, owner, ttl, max_lease_age)

    async def heartbeat(self, key: Key, token: LeaseToken, ttl: float) -> LeaseRecord:
        return await _off_loop(self.store.heartbeat, key, token, ttl)

    async def complete(
        self, key: Key, token: LeaseToken, serializer: str, payload: bytes, checksum: str
    ) -> ArtifactRecord:
        return await _off_loop(self.store.complete, key, token, serializer, payload, checksum)

    async def release(self, key: Key, token: LeaseToken, error: str | None = None) -> None:
        await _off_loop(self.store.release, key, token, error)

    async def watch(self, key: Key) -> AsyncWatch:
        return AsyncWatch(await _off_loop(self.store.watch, key))

    async def close(self) -> None:
        await _off_loop(self.store.close)

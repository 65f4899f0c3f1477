"""Turning what a user passes as ``store=`` into a :class:`dibs.Reservations` client, once per process.

``store`` may be a store URL, a :class:`~prefect_dibs.blocks.DibsStore` block, the name of a saved
``DibsStore`` block, a ready :class:`dibs.Reservations` client, or ``None`` (``DIBS_STORE_URL``, then
the embedded SQLite default). Resolution is lazy (at the first task call, not at import or
decoration time) because loading a block needs the Prefect API, and a decorated task is imported by
processes that never run it.

Clients are cached per process (a forked child starts with none) and per (URL, settings); the store
behind them is shared by every client of the process anyway (:mod:`dibs.runtime`: one pool, one
schema check, one watch hub), so the cache only saves building the client object. A client passed
in by the user is used as it is.

``payloads`` (``@reserved(payloads=...)``) replaces the block's payload store: a Prefect filesystem
block or its slug, a payload store URL (see :mod:`prefect_dibs.payloads`).
"""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

from dibs import Backoff, Reservations, Settings
from dibs.errors import ConfigurationError
from dibs.payloads import PayloadStore
from dibs.serializers import Serializer
from prefect_dibs.payloads import PayloadsSpec, identity, resolve_payloads
from prefect_dibs.payloads import clear_cache as clear_loaded_payloads

__all__ = [
    "BLOCK_TYPE_SLUG",
    "ClientSettings",
    "StoreBlock",
    "StoreSpec",
    "is_url",
    "resolve_client",
    "spec_identity",
]

#: The block type of :class:`~prefect_dibs.DibsStore`: a saved block is loaded by its name through
#: Prefect's registry of block types, so this module needs nothing of :mod:`prefect_dibs.blocks`
#: (which builds on the lock manager, which builds on this module).
BLOCK_TYPE_SLUG = "dibs-store"


@runtime_checkable
class StoreBlock(Protocol):
    """What a client is made from: a :class:`~prefect_dibs.DibsStore` block."""

    on_store_unavailable: Literal["fail", "run"]
    wait_timeout: float | None
    payloads_url: str | None
    payloads: Any

    def store_url(self) -> str | None: ...

    def payload_store(self) -> PayloadStore | str | None: ...

    def settings(self, **overrides: Any) -> Settings: ...


#: What ``store=`` accepts: a URL, a ``DibsStore`` block or its saved name, a client, or ``None``.
StoreSpec: TypeAlias = "str | StoreBlock | Reservations | None"

_CACHE: dict[tuple[str | None, Settings, PayloadStore | str | None], Reservations] = {}
_BLOCKS: dict[str, StoreBlock] = {}  # saved blocks by name: loaded once per process
_CACHE_LOCK = threading.Lock()


def _forget_after_fork() -> None:
    # A cached client holds its store object, with the parent's connections: a forked child builds its
    # own clients (on its own runtime, which starts empty too), closing none of the parent's.
    global _CACHE, _BLOCKS, _CACHE_LOCK
    _CACHE, _BLOCKS, _CACHE_LOCK = {}, {}, threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def is_url(value: str) -> bool:
    """A store URL has a scheme; anything else given as a string is a block name."""
    return "://" in value


@dataclasses.dataclass(frozen=True)
class ClientSettings:
    """Client settings that the integration lets a caller override; ``None`` keeps the default.

    For a block, the default is the block's field; for a URL or ``None``, the core's default.
    """

    namespace: str | None = None
    ttl: float | None = None
    heartbeat_interval: float | None = None
    serializer: str | Serializer | None = None
    backoff: Backoff | None = None
    max_age: float | None = None

    def overrides(self) -> dict[str, Any]:
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) is not None
        }


def resolve_client(
    store: StoreSpec, settings: ClientSettings = ClientSettings(), payloads: PayloadsSpec = None
) -> Reservations:
    """The client for ``store`` with ``settings`` applied, its payload store ``payloads`` if given (see
    the module docstring). Blocking: it may load blocks from the Prefect API and open a database;
    async callers run it in a thread."""
    overrides = settings.overrides()
    if isinstance(store, Reservations):
        given = sorted([*overrides, *(["payloads"] if payloads is not None else [])])
        if given:
            raise ConfigurationError(
                f"store= is a ready dibs.Reservations client, so {', '.join(given)} cannot be "
                "applied to it; configure the client itself, or pass a URL or a DibsStore block instead"
            )
        return store
    if isinstance(store, str) and not is_url(store):
        store = load_block(store)
    if isinstance(store, StoreBlock):
        client_settings = store.settings(**overrides)
        url = store.store_url()
        chosen = resolve_payloads(payloads) if payloads is not None else store.payload_store()
    elif store is None or isinstance(store, str):
        client_settings = Settings().replace(**overrides)
        url, chosen = store, resolve_payloads(payloads)
    else:
        raise ConfigurationError(
            f"store= must be a store URL, a DibsStore block or its name, a dibs.Reservations client or "
            f"None, got {type(store).__name__}"
        )
    with _CACHE_LOCK:
        client = _CACHE.get((url, client_settings, chosen))
        if client is None:
            client = _CACHE[url, client_settings, chosen] = Reservations(
                url, settings=client_settings, payloads=chosen
            )
        return client


def load_block(name: str) -> StoreBlock:
    """The saved ``DibsStore`` block ``name``, loaded once per process."""
    from prefect.blocks.core import Block

    with _CACHE_LOCK:
        cached = _BLOCKS.get(name)
    if cached is not None:
        return cached
    # ``load`` dispatches on "am I in async code?", which a worker thread of an async task (where the
    # run context was copied) answers yes: ask for the sync implementation explicitly.
    block = Block.load(f"{BLOCK_TYPE_SLUG}/{name}", _sync=True)  # type: ignore[call-arg]  # async_dispatch's switch
    if not isinstance(block, StoreBlock):  # pragma: no cover - defensive: Prefect changed load()
        raise ConfigurationError(f"could not load the DibsStore block {name!r}")
    with _CACHE_LOCK:
        _BLOCKS[name] = block
    return block


def spec_identity(store: StoreSpec) -> Any:
    """A hashable identity of a store spec, for equality of objects configured with it.

    Two lock managers on the same URL and namespace are interchangeable, so Prefect's cache-policy
    arithmetic (which refuses to combine two *different* lock managers) must see them as equal.
    """
    if isinstance(store, StoreBlock):
        payloads = None if store.payloads is None else identity(store.payloads)
        return ("block", store.store_url(), store.settings(), store.payloads_url, payloads)
    if isinstance(store, Reservations):
        return ("client", id(store))
    return ("spec", store)


def clear_cache() -> None:
    """Close and forget every client this process opened (tests; long-lived processes after a change
    of block documents, which are otherwise read once per process)."""
    with _CACHE_LOCK:
        clients = list(_CACHE.values())
        _CACHE.clear()
        _BLOCKS.clear()
    clear_loaded_payloads()
    for client in clients:
        client.close()

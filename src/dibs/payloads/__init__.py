"""Large artifacts apart from coordination: records in the store, payloads in a folder, Azure Blob
or any fsspec file system.

``Reservations(url, payloads="file:///shared/dibs")`` keeps artifacts up to an inline limit (64 KiB by
default) in the record, as without a payload store, and writes larger ones to the payload store,
content-addressed by SHA-256 (or BLAKE3: ``file:///shared/dibs?digest=blake3``), publishing only
a small reference through the record store's fenced ``complete``. Readers check size and digest; a
missing, truncated or mismatched payload is a miss (the key computes again), never a wrong value.
See docs/payloads.md.

==============================  =============================================================
URL                              payload store
==============================  =============================================================
``file:///shared/dibs``          :class:`~dibs.payloads.files.FilePayloadStore`
``azure://container/prefix``     :class:`~dibs.payloads.azure.AzurePayloadStore` (``azure`` extra)
``s3://…``, ``gs://…``, ``…``    :class:`~dibs.payloads.fsspec.FsspecPayloadStore` (``fsspec`` extra)
==============================  =============================================================
"""

from __future__ import annotations

import importlib
import os
import threading
import urllib.parse
import weakref

from dibs.config import embedded_payloads_url, embedded_store_url
from dibs.errors import ConfigurationError
from dibs.payloads.base import (
    Freed,
    Payload,
    PayloadDamaged,
    PayloadStore,
    PayloadUnavailable,
    PayloadUnwritable,
    PayloadWriter,
    StoredPayload,
)
from dibs.payloads.collect import DEFAULT_GRACE
from dibs.payloads.references import REFERENCE
from dibs.payloads.referencing import (
    DEFAULT_INLINE_LIMIT,
    ReferencedArtifact,
    ReferencingStore,
    UnreadCheck,
)
from dibs.stores import checked_url_text, redact_url
from dibs.stores.base import CLOSE_HOOKS, Store

__all__ = [
    "DEFAULT_GRACE",
    "DEFAULT_INLINE_LIMIT",
    "PAYLOADS_URL_ENV",
    "REFERENCE",
    "Freed",
    "Payload",
    "PayloadDamaged",
    "PayloadStore",
    "PayloadUnavailable",
    "PayloadUnwritable",
    "PayloadWriter",
    "ReferencedArtifact",
    "ReferencingStore",
    "StoredPayload",
    "UnreadCheck",
    "default_payloads_url",
    "is_open",
    "open_payload_store",
    "referencing",
    "unread",
]

PAYLOADS_URL_ENV = "DIBS_PAYLOADS_URL"


class _Opened:
    """The payload stores and referencing stores of this process, shared by its clients."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stores: dict[str, PayloadStore] = {}
        self.referencing: weakref.WeakKeyDictionary[
            Store, dict[tuple[str, int, float, bool, UnreadCheck], ReferencingStore]
        ] = weakref.WeakKeyDictionary()


_OPENED = _Opened()


def _forget_after_fork() -> None:
    # A forked child opens its own (as dibs.runtime does): the parent's clients and locks are not the child's.
    _OPENED.__init__()  # type: ignore[misc]


os.register_at_fork(after_in_child=_forget_after_fork)


def _close_referencing(records: Store) -> None:
    """A record store closed (the runtime evicts idle ones): its referencing stores, which hold it and
    would keep it (and so its watch hub, which they share) alive for the life of the process, close
    with it."""
    with _OPENED.lock:
        made = _OPENED.referencing.pop(records, {})
    for referencing_store in made.values():
        referencing_store.close()


CLOSE_HOOKS.append(_close_referencing)


def default_payloads_url(store_url: str | None = None) -> str | None:
    """The payload store of a client that names none: ``DIBS_PAYLOADS_URL`` if set; else, when its
    record store is the embedded SQLite database (``store_url`` is :func:`~dibs.config.embedded_store_url`,
    whether it was chosen by default or named), the folder ``payloads`` beside the database's file, so
    that the default keeps a large value out of its one database file without any setting, and
    every process that shares that file shares its payloads; else ``None`` (artifacts stay in the
    records)."""
    if url := os.environ.get(PAYLOADS_URL_ENV, "").strip():
        return url
    if store_url is not None and store_url == embedded_store_url():
        return embedded_payloads_url()
    return None


def _open(url: str) -> PayloadStore:
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme and scheme not in _OWN_SCHEMES and (registered := _registered(scheme, url)) is not None:
        return registered
    if scheme == "file":
        from dibs.payloads.files import FilePayloadStore

        return FilePayloadStore.from_url(url)
    if "digest" in urllib.parse.parse_qs(urllib.parse.urlsplit(url).query):
        raise ConfigurationError(
            f"payloads={redact_url(url)!r}: ?digest= is a folder payload store's option "
            "(file:///folder?digest=blake3); this store names payloads by SHA-256",
            setting="payloads",
        )
    if scheme == "azure":
        module = "dibs.payloads.azure"
        extra = "azure"
        name = "AzurePayloadStore"
    elif scheme and scheme not in {"memory", "sqlite", "postgresql", "mysql", "redis"}:
        module, extra, name = "dibs.payloads.fsspec", "fsspec", "FsspecPayloadStore"
    else:
        raise ConfigurationError(
            f"payloads={redact_url(url)!r} is not a payload store URL; use file:///absolute/folder, "
            "azure://container/prefix?account_url=... or an fsspec URL such as s3://bucket/prefix",
            setting="payloads",
        )
    try:
        cls = getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as exc:
        raise ConfigurationError(
            f"payloads={redact_url(url)!r} needs the {extra!r} extra (pip install 'dibs[{extra}]'): "
            f"{exc.name} is not installed",
            setting="payloads",
        ) from None
    store: PayloadStore = cls.from_url(url)
    return store


#: The schemes dibs's own payload stores take (any other scheme is fsspec's, unless a package
#: registers it: :mod:`dibs.stores.plugins`).
_OWN_SCHEMES = frozenset({"file", "azure"})


def _registered(scheme: str, url: str) -> PayloadStore | None:
    """The payload store of a scheme another package registers (entry point group
    ``dibs.payload_stores``), ahead of fsspec's; ``None`` when none does."""
    from dibs.stores import plugins  # reads packages' metadata: only for a scheme dibs does not own

    store_class = plugins.load(plugins.PAYLOAD_STORES, scheme, PayloadStore, "payload store")
    if store_class is None:
        return None
    store = store_class.from_url(url)
    if not isinstance(store, PayloadStore):
        raise ConfigurationError(
            f"payloads={redact_url(url)!r}: {store_class.__qualname__}.from_url returned a "
            f"{type(store).__qualname__}, not a dibs.payloads.PayloadStore",
            setting="payloads",
        )
    return store


def is_open(url: str) -> bool:
    """Whether this process has opened the payload store at ``url`` already: a client built on it then
    imports and connects nothing (the Airflow triggerer builds such clients on its event loop)."""
    with _OPENED.lock:
        return url in _OPENED.stores


def open_payload_store(url: str) -> PayloadStore:
    """The payload store at ``url``, shared by every client of the process. Opening one sends nothing,
    but checks what can be checked without: the scheme, the package it needs, a folder that is a file.
    Every error names the URL as :func:`dibs.stores.redact_url` shows it."""
    if not isinstance(url, str) or not url.strip():
        raise ConfigurationError(
            f"payloads must be a payload store URL or a PayloadStore, got {redact_url(url)!r}",
            setting="payloads",
        )
    checked_url_text(url, "payload store URL")
    with _OPENED.lock:
        store = _OPENED.stores.get(url)
        if store is None:
            store = _OPENED.stores[url] = _open(url)
        return store


def referencing(
    records: Store,
    payloads: PayloadStore | str,
    *,
    inline_limit: int = DEFAULT_INLINE_LIMIT,
    grace: float = DEFAULT_GRACE,
    load: bool = True,
    unread_check: UnreadCheck = "digest",
) -> ReferencingStore:
    """``records`` with its large artifacts in ``payloads``: one such store per combination in the
    process, so that its clients share one watch hub as they share the record store (``load`` and
    ``unread_check``: see :attr:`ReferencingStore.load` and :attr:`ReferencingStore.unread_check`)."""
    if isinstance(inline_limit, bool) or not isinstance(inline_limit, int) or inline_limit < 0:
        raise ConfigurationError(
            f"payload_inline_limit must be a number of bytes (0 or more), got {inline_limit!r}",
            setting="payload_inline_limit",
        )
    store = payloads if isinstance(payloads, PayloadStore) else open_payload_store(payloads)
    combination = (f"{store.url}#{id(store)}", inline_limit, float(grace), load, unread_check)
    with _OPENED.lock:
        made = _OPENED.referencing.setdefault(records, {})
        found = made.get(combination)
        if found is None:
            found = made[combination] = ReferencingStore(
                records, store, inline_limit=inline_limit, grace=grace, load=load, unread_check=unread_check
            )
        return found


def unread(store: Store, check: UnreadCheck = "digest") -> Store:
    """``store`` handing out hits of payloads unread (see :attr:`ReferencingStore.load`), checked as
    ``check`` says (:attr:`ReferencingStore.unread_check`); :func:`dibs.artifacts.unread_hit` turns
    its answers into hits. A store without a payload store is returned as it is."""
    if not isinstance(store, ReferencingStore) or (not store.load and store.unread_check == check):
        return store
    return referencing(
        store.records,
        store.payloads,
        inline_limit=store.inline_limit,
        grace=store.grace,
        load=False,
        unread_check=check,
    )

"""A Prefect storage block as dibs's payload store: large results land where Prefect keeps results.

Prefect users already keep results in a filesystem block (``result_storage=`` names one); dibs can
put the payloads of ``@reserved`` tasks (results over the inline limit, 64 KiB) there too, through
the block's own file system and credentials:

===============================  =================================================================
block                            payload store
===============================  =================================================================
``LocalFileSystem``              :class:`~dibs.payloads.files.FilePayloadStore` in its ``basepath``
                                 (resolved by the process running the task, as Prefect does; empty:
                                 that process's working directory)
``RemoteFileSystem``             :class:`~dibs.payloads.fsspec.FsspecPayloadStore` on the block's own
                                 fsspec file system (its ``basepath`` and ``settings``)
===============================  =================================================================

Payloads are streamed through the file system (written in chunks, read in chunks, checked by digest),
never loaded whole by the store. Any other block type is refused by name: its file system is not an
fsspec one dibs can derive without guessing at its credentials (``S3Bucket``, ``GcsBucket``,
``AzureBlobStorageContainer``: use a ``RemoteFileSystem`` with ``basepath="s3://bucket/folder"``
and the fsspec ``settings`` it needs, or a ``payloads_url``).

A block is given as an object or, as Prefect's ``result_storage=`` takes it, by its document slug
``"<block-type-slug>/<block-name>"`` (loaded once per process). Each process opens one payload store
per block configuration, so every client of the process shares it (and its referencing store); a
forked child opens its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any, TypeAlias

from dibs.errors import ConfigurationError
from dibs.payloads import PayloadStore

__all__ = [
    "PayloadsSpec",
    "identity",
    "is_supported",
    "payload_store",
    "refusal",
    "resolve_payloads",
    "validate_payloads",
]

#: What ``payloads=`` takes: a filesystem block, its document slug, a payload store URL, a
#: :class:`~dibs.payloads.PayloadStore`, or ``None``.
PayloadsSpec: TypeAlias = "Any"

_SUPPORTED = "LocalFileSystem or RemoteFileSystem (prefect.filesystems)"

_STORES: dict[tuple[str, ...], PayloadStore] = {}
_LOADED: dict[str, Any] = {}  # blocks by document slug: loaded once per process
_LOCK = threading.Lock()
# Keys the digest of a block's settings in :func:`identity`: a plain digest of a short secret could be
# reversed by trying candidates; one keyed by this process's random key says only "same or not".
_IDENTITY_KEY = os.urandom(32)


def _forget_after_fork() -> None:
    # A forked child opens its own payload stores (as dibs.runtime and dibs.payloads do): the parent's
    # file systems, their connections and sessions, and a lock another thread may have held at the
    # fork are not the child's. The blocks loaded by slug go too: a block caches its file system.
    global _STORES, _LOADED, _LOCK
    _STORES, _LOADED, _LOCK = {}, {}, threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def is_supported(block: Any) -> bool:
    """Whether ``block`` is a filesystem block dibs can keep payloads in."""
    from prefect.filesystems import LocalFileSystem, RemoteFileSystem

    return isinstance(block, LocalFileSystem | RemoteFileSystem)


def refusal(block: Any) -> str:
    """Why ``block`` cannot be a payload store: its type named, and what can."""
    kind = type(block).__name__
    return (
        f"a {kind} block cannot be dibs's payload store: dibs keeps payloads in a {_SUPPORTED} block, "
        "through its own file system and credentials. For object storage use a RemoteFileSystem "
        "block, e.g. RemoteFileSystem(basepath='s3://bucket/folder', settings={...fsspec options}), "
        "or a payload store URL (payloads_url)"
    )


def identity(block: Any) -> tuple[str, ...]:
    """What makes two blocks the same payload store, found without opening it. ``settings`` may hold
    secrets, so they are in it only as a keyed digest: the identity is kept for the life of the
    process (as the key of its payload stores), and no copy of a secret in plain text should be."""
    from prefect.filesystems import LocalFileSystem

    if isinstance(block, LocalFileSystem):
        return ("local", str(Path(block.basepath or ".").expanduser().resolve()))
    if not is_supported(block):
        return ("unsupported", type(block).__name__)
    settings = json.dumps(block.settings, sort_keys=True, default=_revealed)
    digest = hashlib.blake2b(settings.encode("utf-8", "surrogatepass"), key=_IDENTITY_KEY).hexdigest()
    return ("remote", block.basepath, digest)


def _revealed(value: Any) -> str:
    """A settings value as text for :func:`identity`: a secret by its value (two blocks whose masked
    secrets print alike must not share one file system opened with the first one's credentials)."""
    reveal = getattr(value, "get_secret_value", None)
    return str(reveal() if callable(reveal) else value)


def payload_store(block: Any) -> PayloadStore:
    """The payload store in ``block`` (see the module docstring), one per configuration and process."""
    if not is_supported(block):
        raise ConfigurationError(refusal(block), setting="payloads")
    found = identity(block)
    with _LOCK:
        store = _STORES.get(found)
        if store is None:
            store = _STORES[found] = _open(block, found)
        return store


def _open(block: Any, found: tuple[str, ...]) -> PayloadStore:
    if found[0] == "local":
        from dibs.payloads.files import FilePayloadStore

        return FilePayloadStore(found[1])
    try:
        from dibs.payloads.fsspec import FsspecPayloadStore

        fs = block.filesystem  # the block's own fsspec file system, built from its settings
    except (ImportError, RuntimeError) as exc:
        raise ConfigurationError(
            f"the RemoteFileSystem block's file system ({block.basepath!r}) cannot be opened: {exc}",
            setting="payloads",
        ) from exc
    return FsspecPayloadStore(fs, fs._strip_protocol(block.basepath), block.basepath)


def _load(slug: str) -> Any:
    """The saved block ``"<block-type-slug>/<block-name>"``, loaded once per process."""
    from prefect.blocks.core import Block

    with _LOCK:
        cached = _LOADED.get(slug)
    if cached is not None:
        return cached
    # The sync implementation explicitly (see prefect_dibs._clients.load_block).
    block = Block.load(slug, _sync=True)  # type: ignore[call-arg]  # async_dispatch's switch
    with _LOCK:
        _LOADED[slug] = block
    return block


def validate_payloads(payloads: PayloadsSpec) -> None:
    """Refuse now (at decoration time) what ``payloads=`` can never be: an unsupported block, a string
    that is neither a URL nor a block slug, any other object. Nothing is loaded or opened."""
    from prefect.blocks.core import Block

    if payloads is None or isinstance(payloads, PayloadStore):
        return
    if isinstance(payloads, str):
        if "://" not in payloads and payloads.count("/") != 1:
            raise ConfigurationError(
                f"payloads={payloads!r}: expected a payload store URL or a filesystem block's slug "
                "'<block-type-slug>/<block-name>', e.g. 'local-file-system/results'",
                setting="payloads",
            )
        return
    if not isinstance(payloads, Block):
        raise ConfigurationError(
            f"payloads= must be a filesystem block ({_SUPPORTED}) or its slug, a payload store URL or "
            f"a dibs PayloadStore, got {type(payloads).__name__}",
            setting="payloads",
        )
    if not is_supported(payloads):
        raise ConfigurationError(refusal(payloads), setting="payloads")


def resolve_payloads(payloads: PayloadsSpec) -> PayloadStore | str | None:
    """What :class:`dibs.Reservations` takes as ``payloads=``, from what a user passed: a store URL or
    :class:`~dibs.payloads.PayloadStore` as it is, a block (or its document slug) as its store."""
    validate_payloads(payloads)
    if isinstance(payloads, str) and "://" not in payloads:
        payloads = _load(payloads)
    if payloads is None or isinstance(payloads, PayloadStore | str):
        return payloads
    return payload_store(payloads)


def clear_cache() -> None:
    """Forget the blocks loaded by slug (tests; a process that must see a changed block document)."""
    with _LOCK:
        _LOADED.clear()

"""Stores from other packages: URL schemes registered through entry points.

A package that brings a record store (or a payload store) registers its URL scheme in its own
metadata, and ``dibs.open_store("SCHEME://...")`` (or ``payloads="SCHEME://..."``) opens it, as a
database URL finds its SQLAlchemy dialect::

    [project.entry-points."dibs.stores"]
    s3lock = "dibs_s3lock:S3LockStore"            # a Store subclass with from_url(url)

    [project.entry-points."dibs.payload_stores"]
    blobs = "company_blobs.dibs:BlobPayloadStore"  # a PayloadStore subclass with from_url(url)

dibs's own schemes come first, so a package cannot take ``sqlite`` or ``file`` over, and they are
found without reading any metadata: the entry points are read once per process, and only for a
scheme dibs does not know (reading every installed package's metadata costs milliseconds a fresh
process's first reservation should not pay). A registered class that cannot be loaded, or that is
not a store, is a :class:`~dibs.errors.ConfigurationError` naming the package and the entry point.
"""

from __future__ import annotations

import functools
import importlib.metadata
from typing import Any

from dibs.errors import ConfigurationError

__all__ = ["PAYLOAD_STORES", "STORES", "known", "load", "registered"]

#: The entry point group of record stores' URL schemes.
STORES = "dibs.stores"
#: The entry point group of payload stores' URL schemes.
PAYLOAD_STORES = "dibs.payload_stores"


@functools.cache
def registered(group: str) -> dict[str, importlib.metadata.EntryPoint]:
    """The schemes other packages register in ``group`` (lower case), read once per process."""
    return {entry.name.lower(): entry for entry in importlib.metadata.entry_points(group=group)}


def load(group: str, scheme: str, base: type, what: str) -> Any | None:
    """The class registered for ``scheme`` in ``group``, checked to be a ``base`` with ``from_url``;
    ``None`` when no package registers it."""
    entry = registered(group).get(scheme.lower())
    if entry is None:
        return None
    where = f"{entry.value!r} (entry point {entry.name!r} in group {group!r}{_package(entry)})"
    try:
        found = entry.load()
    except Exception as exc:  # the plugin's own import: any error is the plugin's, named as such
        raise ConfigurationError(
            f"the {what} scheme {scheme!r} is registered by {where}, which could not be loaded: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if not (
        isinstance(found, type) and issubclass(found, base) and callable(getattr(found, "from_url", None))
    ):
        raise ConfigurationError(
            f"the {what} scheme {scheme!r} is registered by {where}, which is {found!r}: expected a "
            f"subclass of {base.__module__}.{base.__qualname__} with a from_url(url) class method"
        )
    return found


def _package(entry: importlib.metadata.EntryPoint) -> str:
    dist = getattr(entry, "dist", None)
    return f", package {dist.name} {dist.version}" if dist is not None else ""


def known(group: str, builtin: list[str]) -> str:
    """The schemes to name in an error: dibs's own, then the other packages'."""
    others = sorted(set(registered(group)) - set(builtin))
    return ", ".join(sorted(builtin)) + ("; from installed packages: " + ", ".join(others) if others else "")

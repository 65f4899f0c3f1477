"""An index made of names, for a store whose only secondary index is a listing by prefix in name order
(Azure blobs; a directory's entries): which keys hold a lease, which artifacts and failures are
newest (issue 30). The rules that keep it true are each store's (:mod:`dibs.stores.azure.index`,
:mod:`dibs.stores.file_index`); the names and what a write changes are shared, here::

    index/live/<ns>/<key digest>                      the key's record holds a lease (held or expired)
    index/made/a/<ns>/<inverted time>-<key digest>    the key's artifact was made at that time
    index/made/f/<ns>/<inverted time>-<key digest>    the key's last failure was recorded then
    index/ready                                       every record is in the index

``<ns>`` is a digest of the namespace, so one namespace is one prefix; ``<inverted time>`` is
``10**17`` minus the time in microseconds, zero-padded, so name order is newest first. A name is all
a reader needs to find the record, and the record decides.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass

from dibs.keys import Key
from dibs.records import KeyState
from dibs.stores import pages

__all__ = [
    "KINDS",
    "MADE_NAME",
    "VERSION",
    "Changes",
    "Layout",
    "Made",
    "changes",
    "is_digest",
    "made_names",
    "micros",
    "namespace_digest",
]

#: What ``index/ready`` holds; another value (or none) asks for a rebuild.
VERSION = "1"
#: The index's two time orders, by what :func:`dibs.stores.pages.made_at` reads.
KINDS: tuple[pages.Kind, ...] = ("artifact", "failure")
_KIND_LETTER = {"artifact": "a", "failure": "f"}
_DIGEST = re.compile(r"[0-9a-f]{64}")
#: The last part of a ``made`` name: the inverted time and the key's digest.
MADE_NAME = re.compile(r"\d{17}-[0-9a-f]{64}")
#: Times up to 10**11 s (the year 5138) fit the inverted time's 17 digits.
_INVERT = 10**17


def namespace_digest(namespace: str) -> str:
    """The part of an index blob's name that says its namespace (a digest: any text is a namespace)."""
    return hashlib.sha256(namespace.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def micros(at: float) -> int:
    """A record's time as the index names it: whole microseconds, the same for the same float."""
    return math.floor(at * 1_000_000)


@dataclass(frozen=True)
class Made:
    """One ``made`` index blob, parsed from its name."""

    name: str
    at: int  # microseconds (see :func:`micros`)
    digest: str  # the key's digest: its record is ``records/<digest>``


class Layout:
    """The index blobs' names under a store's prefix."""

    def __init__(self, prefix: str) -> None:
        self.root = f"{prefix}index/"
        self.ready = f"{self.root}ready"

    def live(self, key: Key) -> str:
        return f"{self.live_prefix(key.namespace)}{key.digest}"

    def live_prefix(self, namespace: str | None) -> str:
        """Where the ``live`` blobs of ``namespace`` are (of every namespace: ``None``)."""
        every = f"{self.root}live/"
        return every if namespace is None else f"{every}{namespace_digest(namespace)}/"

    def made(self, kind: pages.Kind, key: Key, at: float) -> str:
        return f"{self.made_prefix(kind, key.namespace)}{_INVERT - micros(at):017d}-{key.digest}"

    def made_prefix(self, kind: pages.Kind, namespace: str | None) -> str:
        """Where the ``made`` blobs of ``kind`` of ``namespace`` are (of every namespace: ``None``)."""
        every = f"{self.root}made/{_KIND_LETTER[kind]}/"
        return every if namespace is None else f"{every}{namespace_digest(namespace)}/"

    def parse_live(self, name: str) -> str | None:
        """The key digest a ``live`` blob names; ``None`` for a name that is not one."""
        digest = name.rpartition("/")[2]
        return digest if name.startswith(self.live_prefix(None)) and is_digest(digest) else None

    def parse_made(self, name: str) -> Made | None:
        """A ``made`` blob's time and key digest; ``None`` for a name that is not one."""
        inverted, _, digest = name.rpartition("/")[2].partition("-")
        if not (len(inverted) == 17 and inverted.isdigit() and is_digest(digest)):
            return None
        return Made(name, _INVERT - int(inverted), digest)


def is_digest(text: str) -> bool:
    """Whether ``text`` is a key digest as index names hold it (64 lowercase hex digits)."""
    return _DIGEST.fullmatch(text) is not None


@dataclass(frozen=True)
class Changes:
    """What one record write does to the index: the blobs to write before it, whether it takes or
    ends a lease, and the ``made`` blobs it makes stale (removed once the write has landed)."""

    takes_lease: bool
    ends_lease: bool
    made_before: tuple[str, ...]
    stale_after: tuple[str, ...]


def changes(layout: Layout, old: KeyState, new: KeyState) -> Changes:
    """The index blobs a write from ``old`` to ``new`` needs (see the module's rules). A heartbeat
    (the same lease, a later expiry) needs none."""
    takes = new.lease is not None and (old.lease is None or old.lease.token != new.lease.token)
    ends = old.lease is not None and new.lease is None
    before: list[str] = []
    after: list[str] = []
    for kind in KINDS:
        made = pages.made_at(kind)
        was, now = made(old), made(new)
        was_name = None if was is None else layout.made(kind, old.key, was)
        now_name = None if now is None else layout.made(kind, new.key, now)
        if now_name is not None and now_name != was_name:
            before.append(now_name)
        if was_name is not None and was_name != now_name:
            after.append(was_name)
    return Changes(takes, ends, tuple(before), tuple(after))


def made_names(layout: Layout, state: KeyState) -> set[str]:
    """The ``made`` blobs ``state`` needs."""
    names = set()
    for kind in KINDS:
        at = pages.made_at(kind)(state)
        if at is not None:
            names.add(layout.made(kind, state.key, at))
    return names

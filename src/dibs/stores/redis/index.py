"""The Redis store's per-namespace indexes: what the scripts keep beside the records so that the reads a
person makes (:mod:`dibs.stores.pages`) and removal cost what they show or remove (issue 30).

Without them every one of those reads SCANned every record under the prefix: ``dibs top`` on a
namespace of a million finished keys read a million records to print twenty lines. The indexes are
sorted sets, kept by the same Lua scripts that write the records, in the same atomic step (the
prelude's ``sync_index``), so they never disagree with a record that this dibs wrote.

Keys, for a namespace ``NS`` (a validated namespace: words of ``[A-Za-z0-9_-]`` and dots, so no
``:`` and no ``{``; the text itself is the key part, readable by an operator):

* ``{prefix}idx:NS:cls``: every record of the namespace that is listed (not a tombstone), score 0,
  member ``CLASS + name``: one letter for what the record holds that does not change with time,
  so that one class is one range in key order (``ZRANGEBYLEX``). :func:`class_of` says which;
* ``{prefix}idx:NS:lease:h`` and ``{prefix}idx:NS:lease:r``: the lease expiry of each record of
  class ``h`` (a lease alone: held, or expired) and ``r`` (a lease beside an artifact: held, or
  done once it expires), so the held and expired leases, and their counts, are ranges of scores
  around the server's clock;
* ``{prefix}idx:NS:art`` and ``{prefix}idx:NS:fail``: the artifact's creation time and the last
  failure's time, for the latest artifacts and failures and for prune's candidates;
* ``{prefix}idx:namespaces``: a set of every namespace that ever had a listed record, so a read of
  every namespace needs no SCAN;
* ``{prefix}idx:ready``: the marker that the indexes hold every record (:data:`VERSION`).

On a Redis Cluster a script may only touch keys of its record's slot, so the indexes exist only when
the prefix has a hash tag (``prefix={dibs}:``: every key of the store is then in one slot, as BullMQ
documents); on a cluster without one, the reads and removals scan as before (:attr:`Indexes.enabled`).

Records written before the indexes (or by an older dibs, which writes records the indexes do not see)
are placed by a backfill: the first admin read that finds no marker scans the records once, runs the
``reindex`` script on each (atomic against the writers, who keep the indexes meanwhile), then sets
the marker. Deleting the marker (:meth:`~dibs.stores.redis.RedisStore.rebuild_index`) asks for
another.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from dibs.records import KeyState

__all__ = ["CLASSES", "VERSION", "Indexes", "class_of", "has_hash_tag", "merged"]

#: What the marker holds once the indexes hold every record; another value (or none) asks for a backfill.
VERSION = "1"
#: The classes (members' first letter in ``cls``) a page of each status walks; ``None``: every one.
CLASSES: dict[str | None, str] = {
    None: "hrdfn",
    "held": "hr",
    "expired": "h",
    "done": "dr",
    "failed": "f",
    "free": "n",
}
#: An index entry as the reads merge them: what orders it (a score, or the name and its class), its
#: namespace and its name.
Entry = tuple[Any, str, str]
#: Names read from an index per command, and records read per pipeline.
CHUNK = 1000


def class_of(state: KeyState) -> str | None:
    """The class the scripts file ``state`` under (the prelude's ``placement``); ``None``: a tombstone."""
    if state.lease is not None:
        return "r" if state.artifact is not None else "h"
    if state.artifact is not None:
        return "d"
    if state.failure is not None:
        return "f"
    if state.attempts != 0:
        return "n"
    return None


def has_hash_tag(prefix: str) -> bool:
    """Whether every key starting with ``prefix`` hashes to one cluster slot: a ``{`` followed by a
    ``}`` with something between (Redis hashes the first such tag of a key, and only that)."""
    opening = prefix.find("{")
    if opening < 0:
        return False
    closing = prefix.find("}", opening + 1)
    return closing > opening + 1


@dataclass(frozen=True)
class NamespaceKeys:
    """One namespace's index keys, in the order the scripts take them (KEYS[2..7])."""

    cls: str
    lease_h: str
    lease_r: str
    art: str
    fail: str
    registry: str

    @property
    def all(self) -> tuple[str, ...]:
        return (self.cls, self.lease_h, self.lease_r, self.art, self.fail, self.registry)


class Indexes:
    """The index key names of one store (``prefix``), and whether it keeps indexes at all."""

    def __init__(self, prefix: str, topology: str) -> None:
        self.prefix = prefix
        #: A cluster keeps indexes only with a hash tag in the prefix (see the module docstring).
        self.enabled = topology != "cluster" or has_hash_tag(prefix)
        self.registry = f"{prefix}idx:namespaces"
        self.marker = f"{prefix}idx:ready"
        self._names: dict[str, NamespaceKeys] = {}
        self._more: dict[str, tuple[str, ...]] = {}

    def of(self, namespace: str) -> NamespaceKeys:
        found = self._names.get(namespace)
        if found is None:
            base = f"{self.prefix}idx:{namespace}:"
            found = NamespaceKeys(
                f"{base}cls", f"{base}lease:h", f"{base}lease:r", f"{base}art", f"{base}fail", self.registry
            )
            if len(self._names) < 10_000:  # a process's namespaces are few; a bound all the same
                self._names[namespace] = found
        return found

    def more(self, namespace: str) -> tuple[str, ...]:
        """The keys a writing script takes after the record's: the namespace's indexes, or none."""
        found = self._more.get(namespace)
        if found is None:
            found = self.of(namespace).all if self.enabled else ()
            if len(self._more) < 10_000:
                self._more[namespace] = found
        return found


def merged(streams: Iterable[Iterator[Entry]], *, reverse: bool = False) -> Iterator[Entry]:
    """Several sorted streams of ``(order, namespace, name)`` as one, in that order (``reverse``:
    highest first); each stream is read only as far as the merge needs."""
    return heapq.merge(*streams, key=lambda item: item[0], reverse=reverse)


def chunks(items: Iterator[Entry], size: int) -> Iterator[list[Entry]]:
    """``items`` in lists of ``size``."""
    while True:
        batch = list(itertools.islice(items, size))
        if not batch:
            return
        yield batch


def paged(fetch: Callable[[int], Sequence[Entry]], size: int) -> Iterator[Entry]:
    """Every item ``fetch(offset)`` gives, ``size`` at a time, until a shorter answer."""
    offset = 0
    while True:
        got = fetch(offset)
        yield from got
        if len(got) < size:
            return
        offset += len(got)

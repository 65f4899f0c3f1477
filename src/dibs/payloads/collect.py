"""Removing payloads no record refers to, without ever removing one that a record refers to or a writer
is about to publish, whatever the interleaving of writers and (paused) collectors.

A writer puts its payload first and publishes the reference after (the record store's fenced
``complete``), so between the two the payload is referenced by nothing. A collection:

1. notes the time it started, and lists the records (once, for all of them): the payloads they refer
   to, and the oldest lease any of them holds;
2. lists the payloads' copies (:meth:`~dibs.payloads.PayloadStore.list`);
3. removes, copy by copy (:meth:`~dibs.payloads.PayloadStore.remove`):

   * every copy of a payload no record refers to that was last written (or linked, or put again)
     more than ``grace`` seconds before both the collection started and the oldest lease was acquired;
   * the older copies of a payload records refer to, once its latest copy is that old too (a folder's
     copies are hard links of each other: names, not bytes; an object store's are real copies).

Why nothing published is lost:

* every writer holds a lease from before its payload is put until its reference is published (or
  refused), and a lease is a record: the listing saw either the lease, which makes every copy put
  since too young to go, or the reference, or neither, and then the lease was acquired after the
  listing, and its copies are younger than the collection;
* the store keeps its half (see :mod:`dibs.payloads.base`): a put never gives back a copy that a
  remove decided before may take. A folder's writer makes a copy of its own under a name never used
  before, even when the payload is there (a hard link); Azure's changes the blob's ETag, and the
  delete is conditional on the one listed. So a collector paused for any time between its listing
  and its removal, while another key publishes the same bytes, removes at worst the copies it
  listed, never the one that writer made: the reference it publishes names a payload that is there;
* of a payload records refer to, the latest copy of the listing is kept. A copy is removed only when
  a later one was listed, so of all the copies ever listed, the latest is never removed by this rule,
  whatever several collectors do at once.

``grace`` covers the clocks involved (the record store's, the payload store's, this machine's) and
defaults to a minute. A listing that skipped unreadable records removes nothing: one of them may
refer to any payload.

Only ``candidates`` (a ``forget``'s payload, a fenced-out writer's): each is looked at first (its
copies), and one whose copies are all gone, or were written within ``grace`` of now, is left for a
later collection without listing the records, since the rule would keep it whatever they say. A
fenced-out writer's payload was just written, so its collection lists nothing; the record store is
listed (once for all of them) only for a candidate old enough to go.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from collections.abc import Iterable

from dibs.payloads.base import Freed, PayloadStore, StoredPayload, address, is_address
from dibs.payloads.references import REFERENCE
from dibs.stores.base import Store

__all__ = ["DEFAULT_GRACE", "collect", "doomed", "referenced_digest"]

log = logging.getLogger("dibs.payloads")

#: Seconds by which a payload must predate the collection and every lease before it may go.
DEFAULT_GRACE = 60.0


def referenced_digest(serializer: str, checksum: str) -> str | None:
    """The payload a record refers to (its address, from the record's serializer and checksum:
    ``sha256:<hex>`` or ``blake3:<hex>``), or ``None``."""
    if serializer != REFERENCE:
        return None
    digest, colon, hexdigest = checksum.partition(":")
    found = address(digest, hexdigest) if colon else ""
    return found if is_address(found) else None


def collect(
    records: Store,
    payloads: PayloadStore,
    *,
    grace: float = DEFAULT_GRACE,
    candidates: Iterable[str] | None = None,
) -> Freed:
    """Remove the copies (of every payload, or of ``candidates`` only) the rule above lets go."""
    started = time.time()
    found: dict[str, list[StoredPayload]] = defaultdict(list)
    if candidates is not None:
        for sha256 in dict.fromkeys(candidates):
            copies = payloads.copies(sha256)
            # Kept whatever the records say (no copy is old enough): not worth a listing.
            if any(copy.modified < started - grace for copy in copies):
                found[sha256] = copies
        if not found:
            return Freed()
    listing = records.list(None)
    referenced: set[str] = set()
    oldest_lease = math.inf
    for state in listing:
        if state.artifact is not None:
            digest = referenced_digest(state.artifact.serializer, state.artifact.checksum)
            if digest is not None:
                referenced.add(digest)
        if state.lease is not None:
            oldest_lease = min(oldest_lease, state.lease.acquired_at)
    skipped = getattr(listing, "skipped", ())
    if skipped:
        log.warning(
            "no payload removed from %s: %d record(s) of %s could not be read, and may refer to any of them",
            payloads.url,
            len(skipped),
            records.url,
        )
        return Freed()
    cutoff = min(started, oldest_lease) - grace
    if candidates is None:
        for copy in payloads.list():
            found[copy.sha256].append(copy)
    freed = Freed()
    for copy in doomed(found, referenced, cutoff):
        freed = freed + payloads.remove(copy)
    if candidates is None:
        freed = freed + payloads.discard_partial(unchanged_since=cutoff)
    if freed.copies:
        log.info(
            "removed %d payload(s) (%d copies), %d bytes, from %s",
            freed.payloads,
            freed.copies,
            freed.bytes,
            payloads.url,
        )
    return freed


def doomed(found: dict[str, list[StoredPayload]], referenced: set[str], cutoff: float) -> list[StoredPayload]:
    """The copies the rule removes: of a payload nothing refers to, each one older than ``cutoff``; of
    one that records refer to, each one but the latest listed, once that one is older than ``cutoff``."""
    going: list[StoredPayload] = []
    for sha256, copies in found.items():
        ordered = sorted(copies, key=lambda copy: copy.copy)
        if sha256 not in referenced:
            going.extend(copy for copy in ordered if copy.modified < cutoff)
        elif len(ordered) > 1 and ordered[-1].modified < cutoff:
            going.extend(ordered[:-1])
    return going

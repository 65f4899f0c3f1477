"""Removing payloads no record refers to, without removing one a writer is about to publish.

A writer puts its payload first and publishes the reference after (the record store's fenced
``complete``), so between the two the payload is referenced by nothing. The rule that keeps it:

    a payload is removed only if no record refers to it, **and** it was last written (or put again:
    an identical payload's writer refreshes its time) before both the collection started and the
    oldest lease any record holds was acquired, by more than ``grace`` seconds.

Every writer holds a lease from before its payload is written until its reference is published (or
refused), and a lease is a record: the listing sees either the lease, which protects every payload
written since it was acquired, or the reference. A writer that took its lease after the listing read
its key writes after the collection started. ``grace`` covers the clocks involved (the record
store's, the payload store's, this machine's) and defaults to a minute. What remains is an identical
payload put again in the instant between the collector's last check and its delete: its reference
is then published to nothing, and the readers' check turns it into a miss (the key computes again),
never a wrong value.

A listing that skipped unreadable records removes nothing: one of them may refer to any payload.

Only ``candidates`` (a ``forget``'s payload, a fenced-out writer's): each is looked at first (one
``stat``), and one that is gone, or was written within ``grace`` of now, is left for a later
collection without listing the records, since the rule would keep it whatever they say. A fenced-out
writer's payload was just written, so its collection lists nothing; the record store is listed (once
for all of them) only for a candidate old enough to go.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable

from dibs.payloads.base import Freed, PayloadStore
from dibs.payloads.references import REFERENCE
from dibs.stores.base import Store

__all__ = ["DEFAULT_GRACE", "collect", "referenced_digest"]

log = logging.getLogger("dibs.payloads")

#: Seconds by which a payload must predate the collection and every lease before it may go.
DEFAULT_GRACE = 60.0


def referenced_digest(serializer: str, checksum: str) -> str | None:
    """The payload a record refers to (from its serializer and checksum), or ``None``."""
    if serializer == REFERENCE and checksum.startswith("sha256:"):
        return checksum.removeprefix("sha256:")
    return None


def collect(
    records: Store,
    payloads: PayloadStore,
    *,
    grace: float = DEFAULT_GRACE,
    candidates: Iterable[str] | None = None,
) -> Freed:
    """Remove the payloads (all of them, or only ``candidates``) that the rule above lets go."""
    started = time.time()
    if candidates is not None:
        # Kept whatever the records say (the delete below would refuse it): not worth a listing.
        candidates = [sha256 for sha256 in candidates if _old_enough(payloads, sha256, started - grace)]
        if not candidates:
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
    freed = Freed()
    targets = candidates if candidates is not None else (found.sha256 for found in payloads.list())
    for sha256 in list(targets):
        if sha256 not in referenced:
            size = payloads.delete(sha256, unchanged_since=cutoff)
            if size:
                freed = freed + Freed(1, size)
    if candidates is None:
        freed = freed + payloads.discard_partial(unchanged_since=cutoff)
    if freed.payloads:
        log.info("removed %d payload(s), %d bytes, from %s", freed.payloads, freed.bytes, payloads.url)
    return freed


def _old_enough(payloads: PayloadStore, sha256: str, before: float) -> bool:
    """Whether the payload is there and was last written before ``before``: it may then be removed."""
    found = payloads.stat(sha256)
    return found is not None and found.modified < before

"""The admin reads of :mod:`dibs.stores.pages`, answered from one listing of the record blobs.

The listing (``listed``, called once the arguments are checked, so a bad one costs no request) gives
every record of the namespace as an :class:`Entry`: the record itself when it had to be downloaded
(its blob carries no summary), else the skeleton its summary makes (see
:mod:`dibs.stores.azure.summary`), enough to judge its status and to order it. Each read here picks
its candidates from the entries and downloads, through ``fetch``, only as many as it shows: a page of
100 costs at most 100 GETs besides the listing, a count none.

A record may change between the listing and its download. What is returned is always the
downloaded record, checked again against what was asked (status, artifact or failure): one that no
longer fits is dropped and the next candidate taken, as the default reads would have seen it had they
read it a moment later.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence

from dibs.records import KeyState
from dibs.stores import pages, transitions

__all__ = ["Entry", "Fetch", "Listed", "count", "latest", "leases", "page"]


@dataclasses.dataclass(frozen=True)
class Entry:
    """One record blob of a listing: its name, and its state, which is the record as downloaded when
    ``downloaded``, else a summary's skeleton (to choose by, never to show)."""

    name: str
    state: KeyState
    downloaded: bool


#: The listing's entries, in key order, tombstones left out.
Listed = Callable[[], Sequence[Entry]]
#: Downloads the records of these blobs (by name), in order; ``None`` for one that is gone or unreadable
#: (the store logs and counts it).
Fetch = Callable[[Sequence[str]], list[KeyState | None]]


def _shown(
    candidates: Iterable[Entry], fetch: Fetch, wanted: Callable[[KeyState], bool], limit: int
) -> tuple[list[KeyState], bool]:
    """Up to ``limit`` downloaded records of ``candidates`` (in their order) that are still ``wanted``,
    and whether any candidate is left over. Downloads a batch of as many as are still missing at a
    time, so nothing beyond the limit is downloaded unless a record changed since the listing."""
    found: list[KeyState] = []
    queue: Iterator[Entry] = iter(candidates)
    pending: Entry | None = next(queue, None)
    while pending is not None and len(found) < limit:
        batch = [pending]
        while len(batch) < limit - len(found) and (following := next(queue, None)) is not None:
            batch.append(following)
        pending = next(queue, None)
        ready = {i: entry.state for i, entry in enumerate(batch) if entry.downloaded}
        fetched = iter(fetch([entry.name for entry in batch if not entry.downloaded]))
        for i in range(len(batch)):
            state = ready[i] if i in ready else next(fetched)
            if state is not None and not transitions.is_tombstone(state) and wanted(state):
                found.append(state)
    return found, pending is not None


def page(listed: Listed, fetch: Fetch, query: pages.Query) -> tuple[list[KeyState], str | None]:
    """A page in key order (the entries are sorted by key) and the cursor after it, or ``None`` when
    no further record was listed that the query keeps (with its ``older_than``: the records a prune
    would clear, for ``dibs prune --dry-run``, chosen by their summaries as prune chooses)."""
    start = query.start
    candidates = (
        entry
        for entry in listed()
        if (start is None or (entry.state.key.namespace, entry.state.key.name) > start)
        and query.keeps(entry.state)
    )
    found, more = _shown(candidates, fetch, query.keeps, query.limit)
    return found, (pages.cursor_of(found[-1].key) if more and len(found) == query.limit else None)


def latest(listed: Listed, fetch: Fetch, kind: pages.Kind, limit: int) -> list[KeyState]:
    """The ``limit`` records whose artifact (or failure) is newest, newest first."""
    pages.check_limit(limit)
    made = pages.made_at(kind)
    dated = [(at, entry) for entry in listed() if (at := made(entry.state)) is not None]
    dated.sort(key=lambda pair: -pair[0])  # stable: ties stay in key order, as pages.latest_of has them
    found, _ = _shown((entry for _, entry in dated), fetch, lambda s: made(s) is not None, limit)
    found.sort(key=lambda s: -(made(s) or 0.0))
    return found


def leases(listed: Listed, fetch: Fetch, *, expired: bool, limit: int) -> list[KeyState]:
    """The keys held now, soonest expiry first, or (``expired``) those whose lease expired with nobody
    taking over, latest expiry first."""
    pages.check_limit(limit)
    wanted = "expired" if expired else "held"
    sign = -1.0 if expired else 1.0

    def expiry(s: KeyState) -> float:
        return sign * (s.lease.expires_at if s.lease is not None else 0.0)

    candidates = sorted((e for e in listed() if e.state.status == wanted), key=lambda e: expiry(e.state))
    found, _ = _shown(candidates, fetch, lambda s: s.status == wanted and s.lease is not None, limit)
    found.sort(key=expiry)
    return found


def count(listed: Listed, up_to: int) -> dict[str, int]:
    """How many records are in each counted status, from the listing alone."""
    pages.check_limit(up_to)
    return pages.count_of((entry.state for entry in listed()), up_to)

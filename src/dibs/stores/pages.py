"""The reads a person makes of a namespace, bounded by what they show (issue 30).

``dibs ls``, ``dibs top`` and the Airflow Reservations page used to read every key of a namespace
through :meth:`Store.list <dibs.stores.base.Store.list>` and filter in Python: their cost grew with the
namespace's history (every daily partition ever computed), not with what they print. These reads ask
the store for what is shown, each bounded by a limit:

* :meth:`Store.list_page <dibs.stores.base.Store.list_page>`: records in key order, optionally of one
  status, a page at a time, with a :class:`Page` cursor for the next one;
* :meth:`Store.latest <dibs.stores.base.Store.latest>`: the newest artifacts or failures;
* :meth:`Store.leases <dibs.stores.base.Store.leases>`: the held leases (soonest expiry first) or the
  expired ones nobody took over (latest first);
* :meth:`Store.count_states <dibs.stores.base.Store.count_states>`: how many keys are in each status;
* :meth:`Store.overview <dibs.stores.base.Store.overview>`: all of the last three at once, what
  ``dibs top`` shows;
* :meth:`Store.prunable_page <dibs.stores.base.Store.prunable_page>`: the records a prune would clear,
  in key order, a page at a time (``dibs prune --dry-run``).

A store that keeps indexes answers them without a scan (SQL, Redis). The functions here are the
default every other store gets: they stream its :meth:`~dibs.stores.base.Store.list` and filter, so the
answer is the same and only the cost differs (docs/scaling.md, "Reading a large namespace", says
which stores scan). A store that scans (:attr:`Store.scans <dibs.stores.base.Store.scans>`) answers
an overview from one listing, not five.
"""

from __future__ import annotations

import base64
import binascii
import heapq
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Literal

from dibs.errors import ConfigurationError
from dibs.keys import Key
from dibs.records import KeyState
from dibs.stores import transitions

__all__ = [
    "COUNTED",
    "COUNT_CAP",
    "PAGE",
    "STATES",
    "Overview",
    "Page",
    "Query",
    "check_limit",
    "check_state",
    "count_of",
    "cursor_after",
    "cursor_of",
    "latest_of",
    "leases_of",
    "made_at",
    "overview_of",
    "page_of",
    "pages_of",
    "parse_cursor",
    "successive",
]

#: The statuses a listing can be filtered by (:attr:`KeyState.status <dibs.records.KeyState.status>`).
STATES = ("held", "expired", "done", "failed", "free")
#: The statuses :meth:`~dibs.stores.base.Store.count_states` counts (``free`` records are not shown).
COUNTED = ("held", "expired", "done", "failed")
#: The records a page holds when the caller does not say.
PAGE = 1000
#: How far :meth:`~dibs.stores.base.Store.count_states` counts each status when the caller does not
#: say: a count of this many means at least this many (counting further would cost what it counts).
COUNT_CAP = 100_000
#: What :meth:`~dibs.stores.base.Store.latest` reads: the artifacts or the failures.
Kind = Literal["artifact", "failure"]


@dataclass(frozen=True)
class Page:
    """One page of a listing: its records in key order, the cursor that continues after its last
    (``None`` on the last page), and how many records it skipped as unreadable (see
    :class:`~dibs.stores.base.Listing`)."""

    states: tuple[KeyState, ...]
    after: str | None
    skipped: int = 0


@dataclass(frozen=True)
class Overview:
    """A namespace at a glance (``dibs top``): how many keys are in each status (each counted up to a
    cap), the held leases (soonest expiry first) and the expired ones (latest first), and the newest
    artifacts and failures (newest first)."""

    counts: dict[str, int]
    held: list[KeyState]
    expired: list[KeyState]
    artifacts: list[KeyState]
    failures: list[KeyState]
    #: The statuses whose count is a lower bound short of the cap: a store whose listing cannot count
    #: every key in the time ``top`` has (Azure: done and failed, past its first listing page).
    at_least: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Query:
    """A page of a listing as asked for: of ``namespace`` (or of all), only the records whose status is
    ``state`` (when given) and, with ``older_than``, only those a prune ``older_than`` seconds would
    clear now (:func:`~dibs.stores.transitions.prunable`), in key order after the cursor ``after``, at
    most ``limit`` of them.

    :meth:`Store.list_page <dibs.stores.base.Store.list_page>` and :meth:`Store.prunable_page
    <dibs.stores.base.Store.prunable_page>` keep the public signatures, in one place, and build it;
    every store answers both in one hook, :meth:`Store.page <dibs.stores.base.Store.page>`. It is
    checked once, here: a bad status, limit or cursor is refused before any store reads anything."""

    namespace: str | None
    state: str | None = None
    after: str | None = None
    limit: int = PAGE
    older_than: float | None = None

    def __post_init__(self) -> None:
        check_state(self.state)
        check_limit(self.limit)
        if self.state is not None and self.older_than is not None:  # prune chooses by age, not status
            raise ConfigurationError(
                f"a page of the records a prune would clear (older_than={self.older_than!r}) takes no "
                f"state (got state={self.state!r}): prune chooses by age and what a record holds"
            )
        self.start  # noqa: B018  # a bad cursor is refused here, not at the first page's end

    @property
    def start(self) -> tuple[str, str] | None:
        """The (namespace, name) the page starts after, ``None`` from the first key."""
        return None if self.after is None else parse_cursor(self.after)

    def keeps(self, record: KeyState) -> bool:
        """Whether ``record`` belongs on the page (wherever it stands in key order)."""
        if self.state is not None and record.status != self.state:
            return False
        return self.older_than is None or transitions.prunable(record, self.older_than)

    def then(self, after: str | None, limit: int) -> Query:
        """The same query for the page that starts after ``after``, of ``limit`` records."""
        return replace(self, after=after, limit=limit)


def cursor_of(key: Key) -> str:
    """An opaque cursor that continues a listing after ``key``: URL-safe text, for a command line."""
    return cursor_after(key.namespace, key.name)


def cursor_after(namespace: str, name: str) -> str:
    """:func:`cursor_of` a namespace and name that need not be a key's (the start of a name, which a
    lookup by prefix begins just before: see :func:`dibs._cli.names.start`)."""
    document = json.dumps([namespace, name], ensure_ascii=False).encode()
    return base64.urlsafe_b64encode(document).decode().rstrip("=")


def parse_cursor(cursor: str) -> tuple[str, str]:
    """The (namespace, name) a cursor of :func:`cursor_of` continues after."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        namespace, name = json.loads(base64.urlsafe_b64decode(padded.encode()))
        if isinstance(namespace, str) and isinstance(name, str):
            return namespace, name
    except (ValueError, TypeError, binascii.Error):
        pass
    raise ConfigurationError(
        f"after={cursor!r} is not a listing cursor; give the one a previous page returned "
        "('dibs ls --limit' prints it), or none to start at the first key"
    )


def check_state(state: str | None) -> None:
    """Refuse a status filter that is not one of :data:`STATES`."""
    if state is not None and state not in STATES:
        raise ConfigurationError(f"state={state!r} is not a key status; give one of {', '.join(STATES)}")


def check_limit(limit: int) -> None:
    """Refuse a limit that is not a positive whole number."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigurationError(f"limit={limit!r} must be a whole number of records, at least 1")


def page_of(listing: Iterable[KeyState], query: Query | None = None, **parts: Any) -> Page:
    """A page out of a whole listing in key order (the default :meth:`Store.page
    <dibs.stores.base.Store.page>`): the first of :func:`pages_of`, which reads the listing to the
    page's end, and one record further to know whether another page follows. ``parts``: the
    keywords of :func:`pages_of` (a query's parts, and ``keep``)."""
    return next(pages_of(listing, query, **parts))


def pages_of(
    listing: Iterable[KeyState],
    query: Query | None = None,
    *,
    state: str | None = None,
    after: str | None = None,
    limit: int = PAGE,
    keep: Callable[[KeyState], bool] | None = None,
) -> Iterator[Page]:
    """Every page the query asks for from its cursor on, out of one pass over ``listing``: what a
    store that scans streams for ``dibs ls`` and ``prune --dry-run`` (:meth:`Store.list_pages
    <dibs.stores.base.Store.list_pages>`), where a page at a time would read the whole listing for each
    page. A page is given once one record more is found (or the listing ends), so the next page's
    cursor is known. The records skipped as unreadable are counted on the first page.

    Without a ``query``, its parts as keywords (``state``, ``after``, ``limit``), as a store written
    before :class:`Query` calls it; ``keep``, with or without one, is a further filter."""
    if query is None:
        query = Query(None, state=state, after=after, limit=limit)
    start = query.start
    found: list[KeyState] = []
    given = 0
    for record in listing:
        if start is not None and (record.key.namespace, record.key.name) <= start:
            continue
        if not query.keeps(record) or (keep is not None and not keep(record)):
            continue
        if len(found) == query.limit:
            yield Page(tuple(found), cursor_of(found[-1].key), 0 if given else _skipped(listing))
            found, given = [], given + 1
        found.append(record)
    yield Page(tuple(found), None, 0 if given else _skipped(listing))


def successive(read: Callable[[Query], Page], query: Query, first: int | None = None) -> Iterator[Page]:
    """The pages ``read`` gives, each asked for from the cursor the one before returned, starting with
    ``query`` and ending with the one that has no cursor (the default :meth:`Store.list_pages
    <dibs.stores.base.Store.list_pages>` of a store that finds each page without a scan). Each holds
    the query's limit of records, or from ``first`` doubling up to it: a lookup that may end soon reads
    little before it does."""
    limit = query.limit
    size = limit if first is None else min(first, limit)
    after = query.after
    while True:
        page = read(query.then(after, size))
        yield page
        if page.after is None:
            return
        after, size = page.after, min(2 * size, limit)


def _skipped(listing: Iterable[KeyState]) -> int:
    return len(getattr(listing, "skipped", ()))


def made_at(kind: Kind) -> Callable[[KeyState], float | None]:
    """When a record's artifact (``kind="artifact"``) or last failure was made, ``None`` without one:
    what :meth:`Store.latest <dibs.stores.base.Store.latest>` orders by. Refuses another ``kind``."""
    if kind == "artifact":
        return lambda s: None if s.artifact is None else s.artifact.created_at
    if kind == "failure":
        return lambda s: None if s.failure is None else s.failure.at
    raise ConfigurationError(f"kind={kind!r}: give 'artifact' or 'failure'")


def latest_of(listing: Iterable[KeyState], kind: Kind, limit: int) -> list[KeyState]:
    """The ``limit`` records whose artifact (or failure) is newest, newest first (the default
    :meth:`Store.latest`)."""
    check_limit(limit)
    made = made_at(kind)
    dated = ((at, s) for s in listing if (at := made(s)) is not None)
    return [s for _, s in heapq.nlargest(limit, dated, key=lambda pair: pair[0])]


def leases_of(listing: Iterable[KeyState], *, expired: bool, limit: int) -> list[KeyState]:
    """The keys held now, soonest expiry first, or (``expired``) those whose lease expired without a
    taker, latest expiry first: ``limit`` of them (the default :meth:`Store.leases`)."""
    check_limit(limit)
    wanted = "expired" if expired else "held"
    found = (s for s in listing if s.status == wanted and s.lease is not None)
    if expired:
        return heapq.nlargest(limit, found, key=lambda s: s.lease.expires_at if s.lease else 0.0)
    return heapq.nsmallest(limit, found, key=lambda s: s.lease.expires_at if s.lease else 0.0)


def count_of(listing: Iterable[KeyState], up_to: int = COUNT_CAP) -> dict[str, int]:
    """How many records are in each of :data:`COUNTED`, each up to ``up_to`` (the default
    :meth:`Store.count_states`)."""
    check_limit(up_to)
    counts = dict.fromkeys(COUNTED, 0)
    for state in listing:
        if state.status in counts:
            counts[state.status] += 1
    return {state: min(count, up_to) for state, count in counts.items()}


def overview_of(listing: Iterable[KeyState], *, leases: int, recent: int, up_to: int = COUNT_CAP) -> Overview:
    """An :class:`Overview` out of one pass over a whole listing (the default
    :meth:`Store.overview <dibs.stores.base.Store.overview>` of a store that scans): a store whose every
    read is a scan pays for one, not for one per part."""
    records = list(listing)
    return Overview(
        counts=count_of(records, up_to),
        held=leases_of(records, expired=False, limit=leases),
        expired=leases_of(records, expired=True, limit=leases),
        artifacts=latest_of(records, "artifact", recent),
        failures=latest_of(records, "failure", recent),
    )

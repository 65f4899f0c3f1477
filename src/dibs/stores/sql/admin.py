"""The SQL store's reads a person makes (:mod:`dibs.stores.pages`), each found through an index.

Every statement here reads at most what it returns (plus, for a page of one status, the rows of other
statuses between two of its keys, or the rows of its own index), whatever the size of the namespace:

* a page walks the keys' index (``namespace, name``) from the cursor (keyset pagination: no
  ``OFFSET``, so the hundredth page costs what the first does), ``LIMIT`` its size plus one; a page of
  held, expired or failed keys sorts the namespace's rows of the leases' or failures' index instead;
* the held and expired leases walk the leases' index (``namespace, expires_at``, partial on the rows
  that have a lease) up or down from the database's clock;
* the latest artifacts and failures walk their indexes (``namespace, created_at`` and ``namespace,
  failure_at``) from the newest down;
* the counts count each status through the same indexes, each up to a cap.

The database's clock is read once per statement, in a scalar subquery: compared with a column, it is a
value the planner can use as an index bound (PostgreSQL's ``clock_timestamp()`` is volatile, and a
volatile function compared with a column is never an index condition).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect
from sqlalchemy.sql.elements import ColumnElement

from dibs.stores import pages
from dibs.stores.sql.schema import ADDED_COLUMNS, LEASE_COLUMNS
from dibs.stores.sql.statements import Prepared

__all__ = ["AdminReads"]

#: Written into the statements' SQL, not bound (as in :mod:`dibs.stores.sql.statements`).
_ZERO = sa.literal_column("0", sa.Integer)
#: The statuses whose page is read through their own partial index (the leases', the failures'), not
#: by walking the keys' index: few rows have them, however many keys the namespace holds.
_ON_THEIR_INDEX = ("held", "expired", "failed")


class AdminReads:
    """The admin reads of one table ``t`` (every column but the payload), compiled once per variant:
    bind parameters ``p_namespace``, ``p_after_namespace``, ``p_after_name`` and ``p_limit``."""

    def __init__(self, t: sa.Table, now: ColumnElement[float], dialect: Dialect) -> None:
        self.t, self.dialect = t, dialect
        #: The database's clock, read once per statement (see the module).
        self.clock = sa.select(now.label("now")).scalar_subquery()
        self._columns = [c for c in t.c if c.name != "payload"]
        self.names = ("now", *(c.name for c in self._columns))
        self._cache: dict[tuple[Any, ...], Prepared] = {}

    # -- conditions -------------------------------------------------------------------------------
    def _has_lease(self) -> ColumnElement[bool]:
        return self.t.c.lease_id.is_not(None)

    def _held(self) -> ColumnElement[bool]:
        return sa.and_(self._has_lease(), self.t.c.expires_at > self.clock)

    def _no_failure(self) -> ColumnElement[bool]:
        return sa.and_(self.t.c.failure_count == _ZERO, self.t.c.failure_at.is_(None))

    def status(self, state: str | None) -> ColumnElement[bool]:
        """The rows whose :attr:`~dibs.records.KeyState.status` is ``state`` (any listed one when
        ``None``: every row but a tombstone). Mirrors :attr:`KeyState.status` and
        :func:`dibs.stores.transitions.is_tombstone` on the columns."""
        c = self.t.c
        no_lease, no_artifact = c.lease_id.is_(None), c.serializer.is_(None)
        if state is None:
            return sa.not_(sa.and_(no_lease, no_artifact, self._no_failure(), c.attempts == _ZERO))
        if state == "held":
            return self._held()
        if state == "done":
            return sa.and_(c.serializer.is_not(None), sa.not_(self._held()))
        if state == "expired":
            return sa.and_(self._has_lease(), c.expires_at <= self.clock, no_artifact)
        if state == "failed":
            return sa.and_(no_lease, no_artifact, sa.not_(self._no_failure()))
        pages.check_state(state)  # free
        return sa.and_(no_lease, no_artifact, self._no_failure(), c.attempts > _ZERO)

    def _in(self, namespace: bool) -> list[ColumnElement[bool]]:
        return [self.t.c.namespace == sa.bindparam("p_namespace")] if namespace else []

    def _keyed(self) -> tuple[ColumnElement[Any], ColumnElement[Any]]:
        """The namespace and name in key order: the code points' (Python's, so a page lists what a
        listing lists in the same order). PostgreSQL compares text by the database's collation
        (``en_US``: ``a`` before ``B``), so there they are compared ``COLLATE "C"``, as the keys'
        index holds them; MySQL's ``utf8mb4_bin`` and SQLite's ``BINARY`` already are that order."""
        c = self.t.c
        if self.dialect.name == "postgresql":
            return c.namespace.collate("C"), c.name.collate("C")
        return c.namespace, c.name

    def from_cursor(self, namespace: bool) -> tuple[list[ColumnElement[bool]], list[ColumnElement[Any]]]:
        """The conditions of a page in key order (within ``p_namespace`` when ``namespace``) after
        ``p_after_namespace, p_after_name``, and its ordering."""
        in_order, by_name = self._keyed()
        if namespace:  # within one namespace: the name alone (the index's second column)
            where = [in_order == sa.bindparam("p_namespace"), by_name > sa.bindparam("p_after_name")]
        else:
            # A row value: the planner walks the keys' index from it (an OR of the two columns'
            # conditions was planned as a scan).
            cursor = sa.tuple_(sa.bindparam("p_after_namespace"), sa.bindparam("p_after_name"))
            where = [sa.tuple_(in_order, by_name) > cursor]
        return where, [in_order, by_name]

    def _limited(self, query: sa.Select[Any]) -> sa.Select[Any]:
        return query.limit(sa.bindparam("p_limit", type_=sa.Integer))

    def _select(self, *where: ColumnElement[bool]) -> sa.Select[Any]:
        return sa.select(self.clock.label("now"), *self._columns).where(*where)

    def _prepared(self, variant: tuple[Any, ...], build: Any) -> Prepared:
        statement = self._cache.get(variant)
        if statement is None:
            query = build()
            columns = {"counts": pages.COUNTED, "batch": ()}.get(variant[0], self.names)
            statement = self._cache[variant] = Prepared(query, self.dialect, columns)
        return statement

    # -- the reads --------------------------------------------------------------------------------
    def walks(self, state: str | None) -> bool:
        """Whether a page of one namespace of ``state`` walks the keys' index as a range from the cursor
        ``(p_namespace, p_after_name)`` up to the namespace's end (see :meth:`_walk`): on PostgreSQL,
        for the statuses found by walking the keys' index (every key, ``done``, ``free``).

        On a table never analysed (autovacuum off, or new), the planner guessed that a namespace holds
        0.5 % of the rows and read them all through a bitmap, then sorted them: 216 ms for a page of
        501 at 200,000 keys, 1 s at 1,000,000, though the index gives them in order. The statuses that
        have an index of their own (:data:`_ON_THEIR_INDEX`) are read through it instead."""
        return self.dialect.name == "postgresql" and state not in _ON_THEIR_INDEX

    def page(self, *, namespace: bool, state: str | None, after: bool) -> Prepared:
        """Keys in order (``namespace, name``) after ``p_after_namespace, p_after_name`` when
        ``after``; ``p_limit`` rows (the caller asks one more than a page, to know if another follows).
        A page of one namespace that :meth:`walks` takes ``p_after_name`` always (``""`` for the first)."""

        def build() -> sa.Select[Any]:
            if state in _ON_THEIR_INDEX and namespace:
                return self._on_their_index(state, after)
            if namespace and self.walks(state):
                return self._walk(state)
            return self._in_key_order(namespace, after, self.status(state))

        return self._prepared(("page", namespace, state, after), build)

    def _walk(self, state: str | None) -> sa.Select[Any]:
        """The rows of ``state`` in one namespace after ``p_after_name``, as a range of the keys' index
        (the row value after the cursor, the namespace up to this one) with a limit the planner cannot
        see (a subquery): a third of the table guessed from the cursor, and an unknown limit, make the
        walk in order the plan taken whatever the statistics, stopped where the page fills or the
        namespace ends (as ``prune --dry-run``'s pages: :meth:`removable`). Run unprepared, so that no
        plan made while the table was nearly empty (a scan) is kept for it grown."""
        in_order, by_name = self._keyed()
        start = sa.tuple_(sa.bindparam("p_namespace"), sa.bindparam("p_after_name"))
        where = [sa.tuple_(in_order, by_name) > start, in_order <= sa.bindparam("p_namespace")]
        limit = sa.select(sa.bindparam("p_limit", type_=sa.Integer)).scalar_subquery()
        return self._select(*where, self.status(state)).order_by(in_order, by_name).limit(limit)

    def _on_their_index(self, state: str, after: bool) -> sa.Select[Any]:
        """A page of a status that a partial index holds apart (leases; failures) in one namespace: the
        rows of that index in the namespace, sorted by name. They are live work (held and expired
        leases) or the failures, never the whole history: walking the keys' index instead reads every
        key of the namespace when none has that status. The namespace is compared without ``COLLATE``,
        as that index holds it (equality is the same in every collation dibs uses)."""
        c = self.t.c
        narrowing = self._has_lease() if state in ("held", "expired") else c.failure_at.is_not(None)
        where = [c.namespace == sa.bindparam("p_namespace"), narrowing, self.status(state)]
        _, by_name = self._keyed()
        if after:
            where.append(by_name > sa.bindparam("p_after_name"))
        return self._limited(self._select(*where).order_by(by_name))

    def _in_key_order(self, namespace: bool, after: bool, status: ColumnElement[bool]) -> sa.Select[Any]:
        """The rows of ``status`` in key order, ``p_limit`` of them (after the cursor when ``after``)."""
        where, order = self.from_cursor(namespace)
        in_order = [*where[: 1 if namespace else 0]]
        if after:
            in_order = where
        return self._limited(self._select(*in_order, status).order_by(*order))

    def leases(self, *, namespace: bool, expired: bool) -> Prepared:
        """Held leases, soonest expiry first, or expired ones nobody took over, latest first."""

        def build() -> sa.Select[Any]:
            c = self.t.c
            where = [*self._in(namespace), self.status("expired" if expired else "held")]
            order = c.expires_at.desc() if expired else c.expires_at.asc()
            return self._limited(self._select(*where).order_by(order))

        return self._prepared(("leases", namespace, expired), build)

    def latest(self, *, namespace: bool, kind: str) -> Prepared:
        """The newest artifacts (``kind="artifact"``) or failures, newest first: their index
        (``namespace, created_at`` or ``namespace, failure_at``) walked backwards from the newest."""

        def build() -> sa.Select[Any]:
            c = self.t.c
            if kind == "artifact":
                present, made = c.serializer.is_not(None), c.created_at
            else:
                present, made = c.failure_at.is_not(None), c.failure_at
            if namespace and self.dialect.name == "postgresql":
                return self._newest_first(present, made)
            return self._limited(self._select(*self._in(namespace), present).order_by(made.desc()))

        return self._prepared(("latest", namespace, kind), build)

    def _newest_first(self, present: ColumnElement[bool], made: ColumnElement[Any]) -> sa.Select[Any]:
        """PostgreSQL's newest rows of one namespace, as a range of their index and a limit the planner
        cannot see (as :meth:`_walk`). On a table never analysed it guessed 89 finished rows in the
        namespace from an equality, gathered every one of them through a bitmap and sorted them: 58 ms
        at 100,000 keys for 16 rows, growing with the history. The range (the row value up to this
        namespace's end, the namespace from this one on) is guessed a large part of the table, so the
        walk that stops at the limit is the plan taken whatever the statistics. The namespace is
        compared without ``COLLATE``, as the index holds it; the two bounds are equality in it."""
        c = self.t.c
        end = sa.tuple_(sa.bindparam("p_namespace"), sa.literal_column("'Infinity'", sa.Double))
        where = [sa.tuple_(c.namespace, made) <= end, c.namespace >= sa.bindparam("p_namespace"), present]
        limit = sa.select(sa.bindparam("p_limit", type_=sa.Integer)).scalar_subquery()
        return self._select(*where).order_by(c.namespace.desc(), made.desc()).limit(limit)

    def counts(self, *, namespace: bool) -> Prepared:
        """How many rows are in each of :data:`~dibs.stores.pages.COUNTED`, each counted up to
        ``p_limit``: a subquery ``LIMIT``-ed to it, found through the status's index."""

        def build() -> sa.Select[Any]:
            c = self.t.c
            narrowing = {  # what puts each count on its index (each implied by the status itself)
                "held": self._has_lease(),
                "expired": self._has_lease(),
                "done": c.serializer.is_not(None),
                "failed": c.failure_at.is_not(None),
            }
            counted = []
            for state in pages.COUNTED:
                rows = self._limited(
                    sa.select(sa.literal_column("1").label("one")).where(
                        *self._in(namespace), narrowing[state], self.status(state)
                    )
                ).subquery(f"{state}_rows")
                counted.append(sa.select(sa.func.count()).select_from(rows).scalar_subquery().label(state))
            return sa.select(*counted)

        return self._prepared(("counts", namespace), build)

    # -- removal in batches (prune, reap): dibs.stores.sql.store.SQLStore._remove ----------------------
    def prunable(self, older: float | None = None) -> ColumnElement[bool]:
        """:func:`dibs.stores.transitions.prunable` on the columns (``older`` seconds, else the
        parameter ``p_older``), tombstones left out: nobody holds it (or the lease ended that long
        ago) and what it keeps is that old."""
        c = self.t.c
        limit = self.clock - sa.bindparam("p_older", older, type_=sa.Double)
        return sa.and_(
            self.status(None),
            sa.or_(c.lease_id.is_(None), c.expires_at < limit),
            sa.or_(c.serializer.is_(None), c.created_at < limit),
            sa.or_(c.serializer.is_not(None), c.failure_at.is_(None), c.failure_at < limit),
        )

    def reapable(self) -> ColumnElement[bool]:
        """What reap changes: an expired lease, or a record that holds nothing (not a tombstone)."""
        c = self.t.c
        expired = sa.and_(self._has_lease(), c.expires_at <= self.clock)
        return sa.or_(expired, self.status("free"))

    def removable(self, *, namespace: bool, kind: str, after: bool) -> Prepared:
        """The rows ``kind`` (``"prune"``, ``"reap"``) may change, in key order, ``p_limit`` of them
        after the cursor, with their versions: the remover decides on each (decoded: an unreadable row
        is skipped) and changes it only at that version."""

        def build() -> sa.Select[Any]:
            condition = self.prunable() if kind == "prune" else self.reapable()
            if self.dialect.name != "postgresql":
                return self._in_key_order(namespace, after, condition)
            # PostgreSQL (``dibs prune --dry-run``: SQLStore.prunable_page). On a table never analysed
            # the planner guessed a namespace at 0.5 % of the rows, fewer still with the conditions,
            # and gathered and sorted the whole namespace for every page. As ranges (the name after
            # the cursor, the namespace up to this one) and with a limit it cannot see (a subquery),
            # it walks the keys' index in order from the cursor, whatever the statistics.
            in_order, by_name = self._keyed()
            where: list[ColumnElement[bool]] = []
            if namespace:
                start = sa.tuple_(sa.bindparam("p_namespace"), sa.bindparam("p_after_name"))
                where = [sa.tuple_(in_order, by_name) > start, in_order <= sa.bindparam("p_namespace")]
            elif after:
                where = self.from_cursor(False)[0]
            limit = sa.select(sa.bindparam("p_limit", type_=sa.Integer)).scalar_subquery()
            return self._select(*where, condition).order_by(in_order, by_name).limit(limit)

        return self._prepared(("removable", namespace, kind, after), build)

    def at_versions(self, size: int) -> ColumnElement[bool]:
        """The ``size`` rows of a batch, each only at the version its remover read (``p_h{i}`` and
        ``p_v{i}``: key hash and version): a row written since (a new holder, a renewal, another
        remover) is left as it is. The hashes alone put the statement on the primary key. (SQLite and
        MySQL/MariaDB: PostgreSQL decides and changes a batch in one statement,
        :mod:`dibs.stores.sql.removal`.)"""
        c = self.t.c
        hashes: list[Any] = [sa.bindparam(f"p_h{i}") for i in range(size)]
        pairs: list[tuple[Any, Any]] = [(hashes[i], sa.bindparam(f"p_v{i}")) for i in range(size)]
        versions: Any = [sa.tuple_(*pair) for pair in pairs]
        return sa.and_(c.key_hash.in_(hashes), sa.tuple_(c.key_hash, c.version).in_(versions))

    def batch(self, change: str, size: int) -> Prepared:
        """The statement that changes a batch of ``size`` rows (see :meth:`at_versions`): ``"prune"``
        and ``"reap"`` turn them into tombstones (re-checking :meth:`prunable`, with ``p_older``, or
        that no lease is live), ``"leases"`` clears expired leases. Compiled once per size: a batch of
        1,000 takes SQLAlchemy ~150 ms to compile, more than the statement takes to run."""

        def build() -> sa.Update:
            if change == "leases":
                return self.clear_leases(size)
            return self.tombstone(size, recheck=self.prunable() if change == "prune" else self.reap_recheck())

        return self._prepared(("batch", change, size), build)

    def tombstone(self, size: int, *, recheck: ColumnElement[bool]) -> sa.Update:
        """A batch of rows turned into tombstones (as ``clear_row``: the fence is kept, the version
        counted up), each only at its version and while ``recheck`` still holds, atomically."""
        return sa.update(self.t).where(self.at_versions(size), recheck).values(**self.tombstone_values())

    def tombstone_values(self) -> dict[str, Any]:
        """What a row becomes as a tombstone: every column of its lease, artifact and failure NULL,
        its counters 0, its version counted up; its fence kept."""
        c = self.t.c
        cleared = (
            *LEASE_COLUMNS,
            *("serializer", "payload", "size", "checksum", "producer", "artifact_fence", "created_at"),
            *(name for name in ADDED_COLUMNS if name in c),
            *("failure_error", "failure_owner", "failure_at"),
        )
        return {
            "version": c.version + sa.literal_column("1", sa.Integer),
            "attempts": _ZERO,
            "failure_count": _ZERO,
            **dict.fromkeys(cleared, sa.null()),
        }

    def clear_leases(self, size: int) -> sa.Update:
        """A batch of expired leases cleared (the artifact or failure kept), each at its version and
        only while the lease is still expired by the database's clock."""
        c = self.t.c
        return (
            sa.update(self.t)
            .where(self.at_versions(size), c.expires_at <= self.clock)
            .values(**self.cleared_lease_values())
        )

    def cleared_lease_values(self) -> dict[str, Any]:
        """What a row whose expired lease is cleared becomes: its lease's columns NULL, its version
        counted up (its artifact or failure kept)."""
        c = self.t.c
        return {
            "version": c.version + sa.literal_column("1", sa.Integer),
            **dict.fromkeys(LEASE_COLUMNS, sa.null()),
        }

    def reap_recheck(self) -> ColumnElement[bool]:
        """A reaped row becomes a tombstone only if it holds no live lease by now."""
        c = self.t.c
        return sa.or_(c.lease_id.is_(None), c.expires_at <= self.clock)

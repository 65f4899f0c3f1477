"""PostgreSQL's prune and reap, decided by the database: one statement per batch, no row read.

Removal used to read each batch of candidate rows, decode them in Python (so that an unreadable row
is skipped as a listing skips it) and change the chosen ones at the versions read. On PostgreSQL the
reading and decoding were two thirds of a batch's time (issue 30: ~25 ms and ~45 ms a batch of 1,000,
against ~40 ms for the ``UPDATE``). Here a batch is one statement::

    WITH ahead AS (                 -- the next keys from the cursor, whatever they hold
        SELECT ctid, namespace, name FROM t
        WHERE <in the namespace, after the cursor>
        ORDER BY namespace COLLATE "C", name COLLATE "C" LIMIT (SELECT :limit)
    ), changed AS (                 -- those removable now become tombstones
        UPDATE t SET <a tombstone>
        WHERE ctid = ANY(CAST((SELECT array_agg(ctid) FROM ahead) AS tid[]))
          AND <removable> AND <well formed>
        RETURNING key_hash
    )
    SELECT <rows changed>, <rows ahead>, <the last one's namespace and name>

The remover walks the keys' index from a cursor (the last key of the previous batch), and stops after a
window shorter than its limit: what a prune costs grows with the keys it walks (tombstones included,
as before), never with a batch's number. The statement is shaped for its plan, whatever the table's
statistics (``tests/test_sql_plans.py``): the window holds no condition but the cursor, and its limit
is a subquery, so that the planner never guesses "a few hundred rows" and reads and sorts the whole
namespace instead of walking the index; the rows are changed by their place in the table, a TID scan
where a join on the key was planned as a scan of the table. It is never prepared on the server (see
:meth:`SQLStore._removal_batch <dibs.stores.sql.store.SQLStore._removal_batch>`).

Why it is as safe as the read-then-write it replaces:

* *removable* is :func:`dibs.stores.transitions.prunable` (or reap's rules) written on the columns,
  checked by the ``UPDATE`` on the row it changes. A row written after the statement's snapshot (a
  new holder, a renewal, another remover) is waited for and followed to its newest version, on which
  the conditions are checked again (PostgreSQL's re-check of a concurrently updated row in READ
  COMMITTED): a live lease or a tombstone there matches nothing, and the row is left as the writer
  left it. That re-check on the newest version is what the version compare-and-swap gave before.
* *well formed* stands for the decoder's refusal of a damaged row (:mod:`dibs.stores.decoder`), on
  what a typed row can get wrong: the row is at its key's address (the SHA-256 of namespace and
  name, :func:`dibs.keys.address`), its version, fence and counters are in range, its lease,
  artifact and failure are each wholly there or wholly absent (a failure count with its failure),
  their fences agree with the row's, and the times removal compares are dates. A row
  failing one is left as it is, as before (but not named in a warning: nothing is read to name it).
* a tombstone keeps the fence (see :func:`dibs.stores.transitions.tombstone`): the next holder gets
  fence + 1.

Reap is one statement too, with two ``UPDATE`` s on the batch: records that then hold nothing become
tombstones, and the expired leases of records that keep an artifact or a failure are cleared. Each row
matches at most one of the two. Payload collection is unchanged: a payload-referencing store collects
after the records' removal (:meth:`dibs.payloads.ReferencingStore.prune`), from the records as they
are then.

SQLite and MySQL/MariaDB keep the read-decide-write batches (:meth:`SQLStore._remove
<dibs.stores.sql.store.SQLStore._remove>`): SQLite's are fast in-process, and MariaDB has neither
``UPDATE ... RETURNING`` nor data-modifying ``WITH``.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql.elements import ColumnElement

from dibs.records import MAX_FENCE, MAX_TIMESTAMP
from dibs.stores.sql.admin import AdminReads
from dibs.stores.sql.schema import LEASE_COLUMNS
from dibs.stores.sql.statements import Prepared

__all__ = ["COLUMNS", "SetRemoval"]

#: What a batch's statement returns: the rows it changed, the rows it chose, and the last one's key.
COLUMNS = ("changed", "selected", "last_namespace", "last_name")

#: A lease, an artifact, a failure: each is wholly there or wholly absent in a row dibs wrote
#: (``max_expires_at`` and ``compute_seconds`` may be absent from a present lease or artifact, and
#: ``failure_count`` is 0 without a failure: see :func:`dibs.stores.sql.schema.row_fields`).
_GROUPS = (
    tuple(name for name in LEASE_COLUMNS if name != "max_expires_at"),
    ("serializer", "size", "checksum", "producer", "artifact_fence", "created_at"),
    ("failure_error", "failure_owner", "failure_at"),
)
#: The times the removal conditions compare.
_TIMES = ("expires_at", "created_at", "failure_at")


class SetRemoval:
    """The batch statements of :mod:`this module <dibs.stores.sql.removal>` for one table, compiled
    once per variant: bind parameters ``p_namespace``, ``p_after_namespace``, ``p_after_name``,
    ``p_limit`` and, for prune, ``p_older``."""

    def __init__(self, admin: AdminReads) -> None:
        self.admin, self.t = admin, admin.t
        self._cache: dict[tuple[Any, ...], Prepared] = {}

    # -- conditions -------------------------------------------------------------------------------
    def well_formed(self) -> ColumnElement[bool]:
        """A row the decoder would read (on what a typed PostgreSQL row can get wrong): see the module."""
        c = self.t.c
        utf8: Any = sa.literal_column("'UTF8'")
        separator: Any = sa.literal_column("'\\x00'::bytea")  # text cannot hold a NUL: bytes can
        address = sa.func.encode(
            sa.func.sha256(
                sa.func.convert_to(c.namespace, utf8)
                .op("||")(separator)
                .op("||")(sa.func.convert_to(c.name, utf8))
            ),
            sa.literal_column("'hex'"),
        )
        whole = [
            sa.or_(
                sa.and_(*(c[name].is_(None) for name in group)),
                sa.and_(*(c[name].is_not(None) for name in group)),
            )
            for group in _GROUPS
        ]
        dates = [
            sa.or_(c[name].is_(None), c[name].between(_literal(0.0), _literal(MAX_TIMESTAMP)))
            for name in _TIMES
        ]
        return sa.and_(
            c.key_hash == address,
            c.version.between(_literal(1), _literal(MAX_FENCE - 1)),
            c.fence.between(_literal(0), _literal(MAX_FENCE)),
            c.attempts >= _literal(0),
            c.failure_count >= _literal(0),
            *whole,
            sa.or_(c.failure_count == _literal(0), c.failure_at.is_not(None)),  # a count needs its failure
            sa.or_(c.lease_id.is_(None), c.fence >= _literal(1)),  # a lease's fence is the row's, >= 1
            sa.or_(c.artifact_fence.is_(None), c.artifact_fence.between(_literal(1), c.fence)),
            *dates,
        )

    def _no_live_lease(self) -> ColumnElement[bool]:
        c = self.t.c
        return sa.or_(c.lease_id.is_(None), c.expires_at <= self.admin.clock)

    def _expired(self) -> ColumnElement[bool]:
        c = self.t.c
        return sa.and_(c.lease_id.is_not(None), c.expires_at <= self.admin.clock)

    def _keeps_nothing(self) -> ColumnElement[bool]:
        """No artifact and no failure (a lease may be there)."""
        c = self.t.c
        return sa.and_(c.serializer.is_(None), c.failure_count == _literal(0), c.failure_at.is_(None))

    def emptied(self) -> ColumnElement[bool]:
        """Reap's tombstones: nothing live, nothing kept, and not a tombstone already."""
        return sa.and_(self._no_live_lease(), self._keeps_nothing(), self.admin.status(None))

    def lapsed(self) -> ColumnElement[bool]:
        """Reap's cleared leases: an expired lease on a record that keeps an artifact or a failure."""
        return sa.and_(self._expired(), sa.not_(self._keeps_nothing()))

    # -- the statement ----------------------------------------------------------------------------
    def batch(self, kind: str, *, namespace: bool, after: bool) -> Prepared:
        """One batch of ``kind`` (``"prune"``, ``"reap"``) in key order, within ``p_namespace`` when
        ``namespace``, after the cursor when ``after``: see the module. Returns :data:`COLUMNS`."""
        variant = (kind, namespace, after)
        statement = self._cache.get(variant)
        if statement is None:
            statement = self._cache[variant] = Prepared(
                self._build(kind, namespace, after), self.admin.dialect, COLUMNS
            )
        return statement

    def _build(self, kind: str, namespace: bool, after: bool) -> sa.Select[Any]:
        admin, t = self.admin, self.t
        if kind == "prune":
            changes = [(admin.prunable(), admin.tombstone_values())]
        else:
            changes = [
                (self.emptied(), admin.tombstone_values()),
                (self.lapsed(), admin.cleared_lease_values()),
            ]
        where, order = admin.from_cursor(namespace)
        if not after:
            where = where[: 1 if namespace else 0]
        # The next keys in order, whatever they hold: a walk of the keys' index from the cursor. Its
        # limit is a subquery, unknown when the statement is planned: told "1,000" on a table never
        # analysed (whose namespace it then guesses at a few hundred rows), the planner read the whole
        # namespace and sorted it, for each batch, and joined the batch to the table by a scan. (So
        # were the removal's conditions here: they made it guess fewer rows still.)
        limit = sa.select(sa.bindparam("p_limit", type_=sa.Integer)).scalar_subquery()
        ctid = sa.column("ctid", _Tid(), _selectable=t)
        ahead = sa.select(ctid.label("ctid"), t.c.namespace, t.c.name).where(*where).order_by(*order)
        window = ahead.limit(limit).cte("ahead")
        # The window's rows by their place in the table (``ctid = ANY(...)``: a TID scan, whatever the
        # statistics; a join on the key was planned as a scan of the table when it looked small). A
        # row written since the statement's snapshot is followed to its newest version, on which the
        # conditions are checked again. (Cast: ``= ANY ((SELECT ...))`` would compare with each row.)
        aggregated = sa.select(sa.func.array_agg(window.c.ctid)).scalar_subquery()
        places = sa.cast(aggregated, postgresql.ARRAY(_Tid()))
        changed = []
        for i, (condition, values) in enumerate(changes):
            update = (
                sa.update(t)
                .where(ctid == sa.func.any(places), condition, self.well_formed())
                .values(**values)
                .returning(t.c.key_hash)
            )
            changed.append(update.cte(f"changed_{i}"))
        counted = [sa.select(sa.func.count()).select_from(cte).scalar_subquery() for cte in changed]
        total = counted[0] if len(counted) == 1 else counted[0] + counted[1]
        in_order = [window.c.namespace.collate("C").desc(), window.c.name.collate("C").desc()]
        last = [
            sa.select(window.c[name]).order_by(*in_order).limit(_literal(1)).scalar_subquery()
            for name in ("namespace", "name")
        ]
        selected = sa.select(sa.func.count()).select_from(window).scalar_subquery()
        return sa.select(
            total.label("changed"),
            selected.label("selected"),
            last[0].label("last_namespace"),
            last[1].label("last_name"),
        )


class _Tid(sa.types.UserDefinedType[Any]):
    """PostgreSQL's ``tid``: where a row version is in its table (the system column ``ctid``)."""

    cache_ok = True

    def get_col_spec(self, **kw: Any) -> str:
        return "tid"


def _literal(value: float | int) -> Any:
    """A constant written into the SQL (not bound: the statements bind only ``p_*`` values)."""
    return sa.literal_column(repr(value), sa.Double if isinstance(value, float) else sa.BigInteger)

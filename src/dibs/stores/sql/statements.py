"""The SQL store's statements, built with SQLAlchemy Core and compiled once per store.

The hot operations and the repairs run :class:`Prepared` statements: compiled once for the database's
dialect, then run as plain SQL on a pooled DBAPI cursor (why: :mod:`dibs.stores.sql`).
:class:`Statements` are those of one table; :func:`server_now` is the database's clock they judge by.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Dialect
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ColumnElement

from dibs.errors import ConfigurationError
from dibs.records import MAX_COUNT, MAX_FENCE
from dibs.stores.large import READ_INLINE
from dibs.stores.sql.schema import ADDED_COLUMNS, LEASE_COLUMNS

#: Keys per ``IN (...)`` list of the watch hub's queries.
IN_LIST = 500

# The constants of the statements, written into their SQL rather than bound: a bound constant is one
# more parameter for the driver to send (or SQLite to bind) on every call, and one more value merged
# into every call's parameters (``Prepared._fixed``). Hot statements have none (issue 20).
_ONE = sa.literal_column("1", sa.Integer)
_ZERO = sa.literal_column("0", sa.Integer)
_NULL = sa.null()
_MAX_FENCE = sa.literal_column(str(MAX_FENCE), sa.BigInteger)
_MAX_COUNT = sa.literal_column(str(MAX_COUNT), sa.Integer)
_READ_INLINE = sa.literal_column(str(READ_INLINE), sa.BigInteger)


def read_columns(t: sa.Table) -> list[ColumnElement[Any]]:
    """The columns a read of a key returns: every column of ``t``, the payload only when it is at most
    :data:`~dibs.stores.large.READ_INLINE` bytes (``NULL`` otherwise: a large value is read apart, in
    chunks, see :meth:`Statements.payload_chunk`). The database never reads a large value for a read
    that does not need it (a heartbeat, a busy key's holder, a lost lease explained)."""
    inline = sa.case((t.c.size <= _READ_INLINE, t.c.payload), else_=_NULL).label("payload")
    return [inline if column.name == "payload" else column for column in t.c]


def chunks(items: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    """``items`` in lists of at most ``size``, one query each."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def server_now(dialect: str) -> ColumnElement[float]:
    """The database's clock as Unix seconds: the only clock that judges expiry."""
    if dialect == "sqlite":
        return sa.literal_column("((julianday('now') - 2440587.5) * 86400.0)", sa.Double)
    if dialect == "postgresql":
        return sa.literal_column("(extract(epoch from clock_timestamp())::double precision)", sa.Double)
    if dialect in ("mysql", "mariadb"):
        return sa.literal_column("(UNIX_TIMESTAMP(NOW(6)) + 0.0)", sa.Double)
    raise ConfigurationError(f"the SQL store supports sqlite, postgresql and mysql/mariadb, not {dialect!r}")


class Prepared:
    """One statement compiled once for a dialect, then run as plain SQL on a DBAPI cursor.

    Bind parameters named ``p_*`` take the values given at each call; every other bind parameter
    (the literals inside the statement, such as ``version + 1``) keeps the value compiled in. Values
    are handed to the driver as they are: every ``p_*`` value is a ``str``, ``int``, ``float``,
    ``bytes`` or ``None``, which every supported driver takes natively. ``columns`` names the
    returned columns, in order.
    """

    def __init__(self, statement: sa.ClauseElement, dialect: Dialect, columns: Sequence[str] = ()) -> None:
        compiled = cast(SQLCompiler, statement.compile(dialect=dialect))
        self.sql = compiled.string
        self.columns = tuple(columns)
        binds = compiled.bind_names.items()
        self._fixed = {name: bind.effective_value for bind, name in binds if not name.startswith("p_")}
        self._positions = tuple(compiled.positiontup or ()) if compiled.positional else None
        #: The driver's parameters out of a call's values (see :meth:`parameters`), chosen once here:
        #: it runs for every statement of every call.
        self.parameters: Callable[[Mapping[str, Any]], Any] = self._chosen_parameters()

    def _chosen_parameters(self) -> Callable[[Mapping[str, Any]], Any]:
        """The function that turns a call's ``p_*`` values into the driver's parameters: the mapping
        itself (a named paramstyle), or a tuple in the statement's order (a positional one), taken
        out by :func:`operator.itemgetter` in one C call. Bound constants (none in the statements of
        :class:`Statements`, whose constants are in their SQL) are merged in first."""
        fixed, positions = self._fixed, self._positions
        if positions is None:
            return (lambda values: {**fixed, **values}) if fixed else (lambda values: values)
        if not positions:
            return lambda _values: ()
        getter = operator.itemgetter(*positions)
        # An itemgetter of one name returns the value itself, not a one-value tuple.
        ordered: Callable[[Mapping[str, Any]], Any] = (
            (lambda values: (getter(values),)) if len(positions) == 1 else getter
        )
        if fixed:
            return lambda values: ordered({**fixed, **values})
        return ordered

    def execute(self, cursor: Any, values: Mapping[str, Any]) -> int:
        """Run the statement; the number of rows it matched."""
        cursor.execute(self.sql, self.parameters(values))
        return int(cursor.rowcount)

    def fetch_all(self, cursor: Any, values: Mapping[str, Any]) -> list[dict[str, Any]]:
        cursor.execute(self.sql, self.parameters(values))
        return [dict(zip(self.columns, row, strict=True)) for row in cursor.fetchall()]

    def fetch_rows(self, cursor: Any, values: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """The rows as the driver returns them, their values in the order of ``columns``: for a
        caller that reads a few of them by position rather than by name."""
        cursor.execute(self.sql, self.parameters(values))
        return list(cursor.fetchall())

    def fetch_one(self, cursor: Any, values: Mapping[str, Any]) -> dict[str, Any]:
        """The one row the statement returns (a read of a key always returns exactly one)."""
        return self.named(self.fetch_tuple(cursor, values))

    def fetch_tuple(self, cursor: Any, values: Mapping[str, Any]) -> tuple[Any, ...]:
        """:meth:`fetch_one` as the driver returns it: for a caller that needs a few of its values
        (read by position, see :meth:`position`) before it needs them all (:meth:`named`)."""
        cursor.execute(self.sql, self.parameters(values))
        rows = cursor.fetchall()
        if len(rows) != 1:
            raise sa_exc.MultipleResultsFound(f"expected one row, got {len(rows)}: {self.sql}")
        return tuple(rows[0])

    def named(self, row: Sequence[Any]) -> dict[str, Any]:
        """A row of this statement under its column names."""
        return dict(zip(self.columns, row, strict=True))

    def position(self, column: str) -> int:
        """Where ``column`` is in this statement's rows."""
        return self.columns.index(column)


class Statements:
    """The statements of read/acquire/heartbeat/complete/release and the repairs, for one table ``t``
    on one database: ``now`` is its clock (:func:`server_now`), ``backend`` its name (SQLAlchemy's
    ``get_backend_name()``).

    Every value that changes between calls is a ``p_*`` bind parameter; see :class:`Prepared`.
    """

    def __init__(self, t: sa.Table, now: ColumnElement[float], dialect: Dialect, backend: str) -> None:
        p = sa.bindparam
        # A one-row "clock" subquery left-joined to the key's row: the state and the database's
        # clock in one round trip, even when the key has no row yet.
        clock = sa.select(now.label("now")).subquery("clock")
        columns = read_columns(t)
        read = sa.select(clock.c.now, *columns).select_from(
            clock.outerjoin(t, t.c.key_hash == p("p_key_hash"))
        )
        self.read_state = Prepared(read, dialect, ("now", *(c.name for c in t.c)))
        self.payload_chunk, self.payload_row = large_value_reads(t, dialect, backend)

        swapped: dict[str, Any] = {name: p(f"p_{name}") for name in (*LEASE_COLUMNS, "fence", "attempts")}
        new_row: dict[str, Any] = {name: p(f"p_{name}") for name in ("key_hash", "namespace", "name")}
        insert = insert_if_absent(t, backend, {**new_row, "version": _ONE, "failure_count": _ZERO, **swapped})
        self.insert_new = Prepared(insert, dialect)
        swap = (
            sa.update(t)
            .where(t.c.key_hash == p("p_key_hash"), t.c.version == p("p_version"))
            .values(version=t.c.version + _ONE, **swapped)
        )
        self.swap_row = Prepared(swap, dialect)
        #: PostgreSQL only (``None`` elsewhere): the read of ``read_state`` and, when the key has no row,
        #: its first lease inserted, in one statement (see :func:`read_or_insert`).
        self.read_or_insert = (
            Prepared(read_or_insert(t, now, columns), dialect, ("inserted", "now", *(c.name for c in t.c)))
            if backend == "postgresql"
            else None
        )

        # Besides the token: the row must still be this key's (a write never lands in a row that
        # claims another key), and it must have the owner that complete and release copy into the
        # artifact or the failure (else the write would turn a damaged lease into a damaged
        # artifact). A refused write is explained by a read, which reports the row as corrupt. So is a
        # row whose version cannot be incremented (BIGINT overflow: a raw DataError, or on SQLite a REAL).
        # The namespace is compared through COALESCE (the column is NOT NULL: the same test), so that no
        # planner can choose its index for a statement the primary key answers: on a table never
        # analysed (autovacuum off, a new table) PostgreSQL planned heartbeats and completes through
        # the namespace index, each reading every row of the namespace (issue 30).
        holding = sa.and_(
            t.c.key_hash == p("p_key_hash"),
            t.c.fence == p("p_fence"),
            t.c.lease_id == p("p_lease_id"),
            sa.func.coalesce(t.c.namespace, sa.literal_column("''")) == p("p_namespace"),
            t.c.name == p("p_name"),
            t.c.owner.is_not(None),
            t.c.version < _MAX_FENCE,
        )
        extended = now + p("p_ttl", type_=sa.Double)
        capped = sa.case(
            (sa.and_(t.c.max_expires_at.is_not(None), t.c.max_expires_at < extended), t.c.max_expires_at),
            else_=extended,
        )
        heartbeat = (
            sa.update(t)
            .where(holding, sa.or_(t.c.max_expires_at.is_(None), t.c.max_expires_at > now))
            .values(expires_at=capped, ttl=p("p_ttl", type_=sa.Double), version=t.c.version + _ONE)
        )
        self.heartbeat = Prepared(heartbeat, dialect)

        cleared = tuple((t.c[name], _NULL) for name in LEASE_COLUMNS)
        producer: Any = t.c.owner
        created_at: Any = now
        if not dialect.update_returning:
            # MySQL/MariaDB have no UPDATE ... RETURNING: the statement also keeps the two values the
            # caller cannot know in session variables, read back by stored_variables (see complete).
            server_now = now.compile(dialect=dialect)
            producer = sa.literal_column(f"(@dibs_producer := {dialect.identifier_preparer.quote('owner')})")
            created_at = sa.literal_column(f"(@dibs_created_at := CAST({server_now} AS DOUBLE))")
        self.stored_variables = "SELECT @dibs_producer, @dibs_created_at"
        # Of the columns added since version 1, those the table has (see ADDED_COLUMNS).
        added = tuple(name for name in ADDED_COLUMNS if name in t.c)
        kept = tuple((t.c[name], p(f"p_{name}", type_=sa.Double)) for name in added)
        # MySQL applies SET assignments left to right: read ``owner`` before the lease columns clear it.
        complete = (
            sa.update(t)
            .where(holding)
            .ordered_values(
                (t.c.producer, producer),
                (t.c.artifact_fence, t.c.fence),
                (t.c.version, t.c.version + _ONE),
                (t.c.serializer, p("p_serializer")),
                (t.c.payload, p("p_payload")),
                (t.c.size, p("p_size")),
                (t.c.checksum, p("p_checksum")),
                (t.c.created_at, created_at),
                *kept,
                *cleared,
            )
        )
        if dialect.update_returning:
            # Only what the caller cannot know: the rest of the stored artifact is what it sent, and
            # its fence the token's (the statement matched ``fence``). Five more columns cost every
            # complete their transfer and decoding (issue 20).
            complete = complete.returning(t.c.producer, t.c.created_at)
            self.complete = Prepared(complete, dialect, ("producer", "created_at"))
        else:
            self.complete = Prepared(complete, dialect)

        at_version = sa.and_(t.c.key_hash == p("p_key_hash"), t.c.version == p("p_version"))
        no_lease = dict.fromkeys(LEASE_COLUMNS, _NULL)
        self.drop_lease = Prepared(
            sa.update(t).where(at_version).values(version=t.c.version + _ONE, **no_lease), dialect
        )
        no_result = dict.fromkeys(
            (
                *("serializer", "payload", "size", "checksum", "producer", "artifact_fence", "created_at"),
                *added,
                *("failure_error", "failure_owner", "failure_at"),
            ),
            _NULL,
        )
        self.drop_result = Prepared(
            sa.update(t)
            .where(at_version)
            .values(version=t.c.version + _ONE, failure_count=_ZERO, **no_result),
            dialect,
        )
        # Removal (discard, prune, the second step of reap) never deletes the row: it leaves a
        # tombstone that keeps the fence and counts the version up, guarded by the version read. A
        # deleted row would come back at version 1 and fence 1, so a delayed statement guarded by an
        # old version could match the new row and remove a live lease (issue 16).
        self.clear_row = Prepared(
            sa.update(t)
            .where(at_version)
            .values(version=t.c.version + _ONE, attempts=_ZERO, failure_count=_ZERO, **no_lease, **no_result),
            dialect,
        )

        released = (t.c.version, t.c.version + _ONE)
        self.release = Prepared(sa.update(t).where(holding).ordered_values(released, *cleared), dialect)
        # The failure is recorded before the lease columns are cleared (MySQL assigns left to right).
        # Saturating, like transitions.release: a 32-bit INTEGER column must never overflow.
        counted = sa.case((t.c.failure_count < _MAX_COUNT, t.c.failure_count + _ONE), else_=_MAX_COUNT)
        failure: tuple[tuple[Any, Any], ...] = (
            (t.c.failure_count, counted),
            (t.c.failure_error, p("p_error")),
            (t.c.failure_owner, t.c.owner),
            (t.c.failure_at, now),
        )
        self.release_failed = Prepared(
            sa.update(t).where(holding).ordered_values(*failure, released, *cleared), dialect
        )
        # A stop: recorded like a failure, but its count stays as it is.
        stopped = ((t.c.failure_count, t.c.failure_count), *failure[1:])
        self.release_stopped = Prepared(
            sa.update(t).where(holding).ordered_values(*stopped, released, *cleared), dialect
        )


def large_value_reads(t: sa.Table, dialect: Dialect, backend: str) -> tuple[Prepared, Prepared]:
    """A large artifact's bytes a chunk at a time (PostgreSQL, MySQL: ``p_start``, from 1, and
    ``p_length``), and its row's ``rowid`` (SQLite, which reads the blob incrementally), each from the
    row only while it still holds that artifact (``p_fence``, ``p_checksum``): no row means that it
    changed, and the key is read again."""
    p = sa.bindparam
    this_artifact = sa.and_(
        t.c.key_hash == p("p_key_hash"), t.c.artifact_fence == p("p_fence"), t.c.checksum == p("p_checksum")
    )
    start, length = sa.cast(p("p_start"), sa.Integer), sa.cast(p("p_length"), sa.Integer)
    chunk = sa.select(sa.func.substring(t.c.payload, start, length)).where(this_artifact)
    rowid = sa.literal_column("rowid") if backend == "sqlite" else t.c.key_hash
    return Prepared(chunk, dialect, ("chunk",)), Prepared(
        sa.select(rowid).where(this_artifact), dialect, ("rowid",)
    )


def read_or_insert(
    t: sa.Table, now: ColumnElement[float], columns: Sequence[ColumnElement[Any]]
) -> sa.ClauseElement:
    """PostgreSQL: a key's first lease in the round trip that reads the key.

    A key without a row is free whatever the request (no artifact, no lease, fence 0), so
    :func:`dibs.stores.transitions.acquire` would grant it fence 1 and attempt 1, from the database's
    ``now``: the statement inserts that row (``ON CONFLICT DO NOTHING``), its lease lasting
    ``p_span`` seconds (the ttl, or the maximum lease age when that is shorter, as
    ``transitions.acquire`` caps it) and capped ``p_max_lease_age`` seconds after ``now`` (``NULL``:
    never). When the key has a row, nothing is written (no row lock, no WAL: a hit or a waiter costs
    what the plain read did) and the row is returned as ``read_state`` returns it (its ``columns``:
    :func:`read_columns`), with ``inserted`` false; the caller decides and swaps as before. The
    ``clock`` CTE, being volatile, is evaluated once, so the inserted row and the returned ``now``
    agree.

    The insert is attempted only when the statement's snapshot shows no row for the key (``NOT
    EXISTS``): ``ON CONFLICT`` checks the unique index even when a row is there, and that check waits
    for any write to the row still in flight (a ``complete`` storing a large payload, a heartbeat on
    a server slow to flush), so a hit or a waiter would wait on the writer, up to ``lock_timeout``,
    where the plain read never waited. With the guard, a key that has a row is only read.

    A row committed by another session after this statement's snapshot still meets the insert's
    conflict check: the insert does nothing and the read finds no row, so the caller's
    compare-and-swap insert fails and it reads again. Only then can the statement wait (for a
    first insert of the key still being committed), and never in a deadlock: it holds nothing that
    the writer needs.
    """
    from sqlalchemy.dialects.postgresql import insert as pg_insert

    p = sa.bindparam
    clock = sa.select(now.label("now")).cte("clock")
    first = {
        "key_hash": p("p_key_hash"),
        "namespace": p("p_namespace"),
        "name": p("p_name"),
        "version": sa.literal_column("1", sa.Integer),
        "failure_count": sa.literal_column("0", sa.Integer),
        "fence": sa.literal_column("1", sa.Integer),
        "attempts": sa.literal_column("1", sa.Integer),
        "owner": p("p_owner"),
        "lease_id": p("p_lease_id"),
        "acquired_at": clock.c.now,
        "expires_at": clock.c.now + p("p_span", type_=sa.Double),
        "max_expires_at": clock.c.now + p("p_max_lease_age", type_=sa.Double),
        "ttl": p("p_ttl", type_=sa.Double),
        "attempt": sa.literal_column("1", sa.Integer),
    }
    values = (
        sa.select(*(value.label(name) for name, value in first.items()))
        .select_from(clock)
        .where(~sa.exists(sa.select(sa.literal_column("1")).where(t.c.key_hash == p("p_key_hash"))))
    )
    inserted = (
        pg_insert(t)
        .from_select(list(first), values)
        .on_conflict_do_nothing(index_elements=["key_hash"])
        .returning(*t.c)
        .cte("inserted")
    )
    won = sa.select(sa.true().label("inserted"), clock.c.now, *inserted.c).select_from(
        clock.join(inserted, sa.true())
    )
    found = (
        sa.select(sa.false().label("inserted"), clock.c.now, *columns)
        .select_from(clock.outerjoin(t, t.c.key_hash == p("p_key_hash")))
        .where(~sa.exists(sa.select(inserted.c.key_hash)))
    )
    return sa.union_all(won, found)


def insert_if_absent(t: sa.Table, backend: str, row: dict[str, Any]) -> sa.ClauseElement:
    """``row``, unless the key has one already (a new key's compare-and-swap)."""
    if backend == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(t).values(row).on_conflict_do_nothing(index_elements=["key_hash"])
    if backend == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(t).values(row).on_conflict_do_nothing(index_elements=["key_hash"])
    return sa.insert(t).values(row).prefix_with("IGNORE")

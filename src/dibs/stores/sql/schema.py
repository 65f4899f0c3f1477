"""dibs's tables in a SQL database: their columns, how a row reads as dibs's records, and the check
(once per process and table) that the tables are there and current.

Two tables: one row per key (``dibs_reservations`` by default, ``?table=``), and ``<table>_meta``,
which records the schema version and how many of :data:`ADDED_COLUMNS` the table has. On PostgreSQL,
a trigger on the table notifies :data:`NOTIFY_CHANNEL` when a lease ends or an artifact appears (the
watch hub's ``LISTEN``, :mod:`dibs.stores.sql.feed`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection

from dibs.errors import ConfigurationError, StoreUnavailable
from dibs.records import LeaseRecord

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
#: Nullable columns added to the version 1 table since its release, in order. Old dibs ignores them
#: (so the version stays 1: a mixed fleet keeps working); a table that lacks them gets them with
#: ``ALTER TABLE ... ADD COLUMN`` on the first use, keeping every row. The ``_meta`` row ``columns``
#: records how many are in place, so a process checks with the one read it makes anyway. A user who
#: may not alter the table (an administrator's role owns it) works without them: one warning names
#: the statement to run, and what they would hold is not kept (read as unknown) until it has run.
ADDED_COLUMNS = ("compute_seconds",)
#: Indexes added to the version 1 table since its release, by the suffix of their names, in order: the
#: reads a person makes (:mod:`dibs.stores.pages`) find what they show through them, not by a scan of the
#: namespace (issue 30). Leases by expiry, artifacts and failures by time, keys in order (a listing's
#: pages). A table that lacks them gets them on first use (``CREATE INDEX``), recorded by the ``_meta``
#: row ``indexes`` as the columns are; a user who may not create them works without (those reads scan).
ADDED_INDEXES = ("leases", "artifacts", "failures", "keys")
NOTIFY_CHANNEL = "dibs_changes"


def tables(
    name: str, schema: str | None, dialect: str, added: Collection[str] = ADDED_COLUMNS
) -> tuple[sa.MetaData, sa.Table, sa.Table]:
    """The tables' definitions; of :data:`ADDED_COLUMNS`, only those in ``added`` (the ones the
    database's table has, when it cannot be given the others)."""
    metadata = sa.MetaData(schema=schema)
    # MySQL/MariaDB: the tables' own character set, whatever the database's default. Under a latin1
    # database, keys and owners outside latin1 were stored as '?', and the key then read as corrupt
    # (its row named another key). utf8mb4_bin also compares exactly (no case folding, no padding).
    # Given to MySQL's tables only: SQLAlchemy checks a ``mysql_*`` option by importing the MySQL
    # dialect, ~10 ms of every other store's first use too (issue 30).
    charset: dict[str, Any] = {}
    payload_type: Any = sa.LargeBinary()
    if dialect in ("mysql", "mariadb"):  # imported only here: the MySQL dialect takes ~50 ms to import
        from sqlalchemy.dialects import mysql

        payload_type = payload_type.with_variant(mysql.LONGBLOB(), "mysql", "mariadb")
        charset = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}
    reservations = sa.Table(
        name,
        metadata,
        sa.Column("key_hash", sa.String(64), primary_key=True),
        # Indexed by the keys' index (``namespace, name``, see admin_indexes), which replaced the
        # namespace's own index: one way in, so no plan can prefer the one that leaves a sort to do.
        sa.Column("namespace", sa.String(200), nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("version", sa.BigInteger, nullable=False),
        sa.Column("fence", sa.BigInteger, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        # the lease, when there is one
        sa.Column("owner", sa.Text),
        sa.Column("lease_id", sa.String(64)),
        sa.Column("acquired_at", sa.Double),
        sa.Column("expires_at", sa.Double),
        sa.Column("max_expires_at", sa.Double),
        sa.Column("ttl", sa.Double),
        sa.Column("attempt", sa.Integer),
        # the last failure
        sa.Column("failure_count", sa.Integer, nullable=False),
        sa.Column("failure_error", sa.Text),
        sa.Column("failure_owner", sa.Text),
        sa.Column("failure_at", sa.Double),
        # the artifact, once completed
        sa.Column("serializer", sa.String(64)),
        sa.Column("payload", payload_type),
        sa.Column("size", sa.BigInteger),
        sa.Column("checksum", sa.String(100)),
        sa.Column("producer", sa.Text),
        sa.Column("artifact_fence", sa.BigInteger),
        sa.Column("created_at", sa.Double),
        # added after schema version 1 was released: see ADDED_COLUMNS
        *([sa.Column("compute_seconds", sa.Double)] if "compute_seconds" in added else []),
        **charset,
    )
    admin_indexes(reservations, dialect)  # attached to the table: created with it
    meta = sa.Table(
        f"{name}_meta",
        metadata,
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("value", sa.String(200), nullable=False),
        **charset,
    )
    return metadata, reservations, meta


def admin_indexes(t: sa.Table, dialect: str) -> tuple[sa.Index, ...]:
    """The :data:`ADDED_INDEXES` of ``t`` (each attaches itself to it). Partial where the database has
    partial indexes (PostgreSQL, SQLite: only the rows with a lease, an artifact, a failure); MySQL and
    MariaDB index every row, the NULLs first, which a range on the time skips just as well. The keys'
    index takes the first 500 characters of a name on MySQL (an index cannot hold a whole TEXT)."""
    c = t.c

    def partial(condition: Any) -> dict[str, Any]:
        return {"postgresql_where": condition, "sqlite_where": condition}

    keys: dict[str, Any] = {"mysql_length": {"name": 500}, "mariadb_length": {"name": 500}}
    if dialect not in ("mysql", "mariadb"):
        keys = {}
    return (
        sa.Index(f"{t.name}_leases", c.namespace, c.expires_at, **partial(c.lease_id.is_not(None))),
        sa.Index(f"{t.name}_artifacts", c.namespace, c.created_at, **partial(c.serializer.is_not(None))),
        sa.Index(f"{t.name}_failures", c.namespace, c.failure_at, **partial(c.failure_at.is_not(None))),
        # Key order is the code points' (dibs.stores.sql.admin.AdminReads._keyed): PostgreSQL's keys
        # are indexed COLLATE "C", whatever the database's collation.
        sa.Index(f"{t.name}_keys", *_in_code_points(c.namespace, c.name, dialect), **keys),
    )


def _in_code_points(namespace: sa.Column[Any], name: sa.Column[Any], dialect: str) -> tuple[Any, Any]:
    if dialect == "postgresql":
        return namespace.collate("C"), name.collate("C")
    return namespace, name


#: The columns of a row's lease: all NULL when the key has none.
LEASE_COLUMNS = ("owner", "lease_id", "acquired_at", "expires_at", "max_expires_at", "ttl", "attempt")


def lease_columns(lease: LeaseRecord | None) -> dict[str, Any]:
    """The lease columns' values for ``lease`` (what acquire's compare-and-swap writes)."""
    if lease is None:
        return dict.fromkeys(LEASE_COLUMNS)
    return {
        "owner": lease.owner,
        "lease_id": lease.token.lease_id,
        "acquired_at": lease.acquired_at,
        "expires_at": lease.expires_at,
        "max_expires_at": lease.max_expires_at,
        "ttl": lease.ttl,
        "attempt": lease.attempt,
    }


# Columns of the row under the shared decoder's field names (dibs.stores.decoder.FIELDS). The lease's
# fence is the row's fence; a failure count of 0 means "no failure" (the column is NOT NULL).
_ROW_FIELDS = {
    "namespace": "namespace",
    "name": "name",
    "fence": "fence",
    "attempts": "attempts",
    "lease_owner": "owner",
    "lease_id": "lease_id",
    "lease_acquired_at": "acquired_at",
    "lease_expires_at": "expires_at",
    "lease_ttl": "ttl",
    "lease_attempt": "attempt",
    "lease_max_expires_at": "max_expires_at",
    "failure_count": "failure_count",
    "failure_error": "failure_error",
    "failure_owner": "failure_owner",
    "failure_at": "failure_at",
    "artifact_serializer": "serializer",
    "artifact_size": "size",
    "artifact_checksum": "checksum",
    "artifact_producer": "producer",
    "artifact_fence": "artifact_fence",
    "artifact_created_at": "created_at",
    "artifact_compute_seconds": "compute_seconds",
}


def row_fields(row: Mapping[str, Any]) -> dict[str, Any]:
    """The row under the shared decoder's field names (see :data:`_ROW_FIELDS`)."""
    # .get: a column added since version 1 is absent from a table that cannot be given it (unknown).
    fields = {name: row.get(column) for name, column in _ROW_FIELDS.items()}
    has_lease = any(row[column] is not None for column in LEASE_COLUMNS)
    fields["lease_fence"] = row["fence"] if has_lease else None
    if row["failure_count"] == 0 and row["failure_at"] is None:  # 0 with a failure: only stops
        fields["failure_count"] = None
    return fields


#: (URL, table, schema) whose schema this process has checked, never twice (see :func:`check_once`):
#: the :data:`ADDED_COLUMNS` its table has.
_VERIFIED_SCHEMAS: dict[tuple[str, str, str | None], tuple[str, ...]] = {}
#: (URL as shown, table, schema) whose columns this process tried to add: never twice, even when the
#: check failed afterwards and is run again (see :meth:`SchemaCheck._add_columns`).
_ALTER_TRIED: set[tuple[str, str, str | None]] = set()


def check_once(
    verified: tuple[str, str, str | None], check: Callable[[], tuple[str, ...]]
) -> tuple[str, ...]:
    """What ``check`` (a :meth:`SchemaCheck.run`) says of the table ``verified`` (URL, table, schema), asked
    once per process: a process opening many clients of one store checks once."""
    added = _VERIFIED_SCHEMAS.get(verified)
    if added is None:
        added = _VERIFIED_SCHEMAS[verified] = check()
    return added


class SchemaCheck:
    """Check (and if needed create or extend) one database's tables, before the store's first operation.

    ``connect`` gives the store's pooled connection without the check (which would wait for itself),
    ``url`` is the store's URL as shown in messages, and ``first_line`` the store's way of quoting a
    driver's message without the URL's secrets.
    """

    def __init__(
        self,
        table_name: str,
        schema: str | None,
        dialect: str,
        url: str,
        *,
        connect: Callable[[], contextlib.AbstractContextManager[Connection]],
        first_line: Callable[[BaseException, int], str],
    ) -> None:
        self.table_name, self.schema, self.dialect, self.url = table_name, schema, dialect, url
        self.metadata, self.t, self.meta = tables(table_name, schema, dialect)
        self._connect = connect
        self._first_line = first_line
        self._columns_in_place = 0  # how many of ADDED_COLUMNS the table has (read with its version)
        self._indexes_in_place = 0  # how many of ADDED_INDEXES (read with its version)

    def run(self) -> tuple[str, ...]:
        """One read of the schema version when the tables exist (the usual case: nothing is locked or
        re-created); otherwise create them, with racing processes serialized or retrying. A version 1
        table without the ``columns`` marker only gets its columns added (see :meth:`_add_columns`).
        The :data:`ADDED_COLUMNS` the table has."""
        with self._connect() as conn:
            version = self._schema_version(conn)
            if (
                version == SCHEMA_VERSION
                and self._columns_in_place >= len(ADDED_COLUMNS)
                and self._indexes_in_place >= len(ADDED_INDEXES)
            ):
                return ADDED_COLUMNS
        for attempt in range(5):
            try:
                with self._connect() as conn:
                    if version != SCHEMA_VERSION:
                        if self.dialect == "postgresql":
                            self._create_postgres(conn)
                        else:
                            self.metadata.create_all(conn, checkfirst=True)
                        self._check_schema_version(conn)
                        self._check_is_ours(conn)
                    added = self._add_columns(conn)
                    if not conn.invalidated:  # lost while adding a column: the indexes wait too
                        self._add_indexes(conn)
                    return added
            except (StoreUnavailable, sa_exc.ProgrammingError, sa_exc.IntegrityError):
                # Another process created the table between our check and our CREATE (SQLite, MySQL).
                if attempt == 4:
                    raise
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _schema_version(self, conn: Connection) -> int | None:
        """The schema version recorded in the database; ``None`` when there is none (no tables yet).

        A version newer than this dibs understands is a :class:`ConfigurationError`.
        """
        meta = self.meta.c
        try:
            wanted = ("schema_version", "columns", "indexes")
            query = sa.select(meta.name, meta.value).where(meta.name.in_(wanted))
            rows = {name: value for name, value in conn.execute(query)}
        except (sa_exc.ProgrammingError, sa_exc.OperationalError) as exc:
            if exc.connection_invalidated:
                raise
            return None  # no such table: created below
        columns = rows.get("columns")
        self._columns_in_place = int(columns) if columns is not None and columns.isdigit() else 0
        indexes = rows.get("indexes")
        self._indexes_in_place = int(indexes) if indexes is not None and indexes.isdigit() else 0
        found = rows.get("schema_version")
        if found is None:
            return None
        if not found.isdigit() or int(found) > SCHEMA_VERSION:
            raise ConfigurationError(
                f"table {self.table_name} in {self.url} has schema version {found!r}, newer than this dibs "
                f"understands ({SCHEMA_VERSION}); upgrade dibs, or use another table with ?table=NAME"
            )
        return int(found)

    def _added_columns(self, conn: Connection) -> int:
        """How many of :data:`ADDED_COLUMNS` the ``_meta`` table says are in place."""
        found = conn.execute(sa.select(self.meta.c.value).where(self.meta.c.name == "columns")).scalar()
        return int(found) if found is not None and found.isdigit() else 0

    def _add_columns(self, conn: Connection) -> tuple[str, ...]:
        """Add the nullable :data:`ADDED_COLUMNS` a version 1 table lacks (its rows are kept; old
        records read the new columns as NULL: unknown), record that they are there, and return those
        the table has. An ALTER that fails because a racing process added the column first is fine.

        Any other failure never fails the store: this process works without the column (every
        operation works, without what the column would keep), with one warning that says why. A
        refusal (this user may not alter the table, or may not write) names the statement an
        administrator should run; a transient failure (a lock wait or statement that timed out, a
        deadlock: a long report holding the table, say) says the next process to open the store tries
        again; anything else (an event trigger or a proxy refusing DDL) names the statement and the
        error. A lost connection (the server gone, or the call's bound shutting it) is transient too.
        One attempt per process, whatever its outcome: the ALTER queues an exclusive lock on the table
        that stalls every other session's queries on it while it waits, so it is not repeated, not by
        :meth:`run`'s retries nor by a later operation after an error of the check (the outcome is
        cached by :func:`check_once`, the attempt by :data:`_ALTER_TRIED`)."""
        if self._added_columns(conn) >= len(ADDED_COLUMNS):
            return ADDED_COLUMNS
        present = self._present_columns(conn)
        tried = (self.url, self.table_name, self.schema)
        if tried in _ALTER_TRIED:  # failed before in this process (and said so)
            return tuple(name for name in ADDED_COLUMNS if name in present)
        _, full, _ = tables(self.table_name, self.schema, self.dialect)
        preparer = conn.dialect.identifier_preparer
        table = preparer.format_table(full)
        kinds = {name: full.c[name].type.compile(dialect=conn.dialect) for name in ADDED_COLUMNS}
        statements = {
            name: f"ALTER TABLE {table} ADD COLUMN {preparer.quote(name)} {kinds[name]}"
            for name in ADDED_COLUMNS
        }
        for name in ADDED_COLUMNS:
            if name in present:
                continue
            statement = statements[name]
            _ALTER_TRIED.add(tried)
            try:
                with self._metadata_lock_bounded(conn):
                    conn.execute(sa.text(statement))
            except sa_exc.DBAPIError as exc:
                orig = exc.orig or exc
                lost = exc.connection_invalidated or conn.invalidated
                if not lost:
                    with contextlib.suppress(sa_exc.DBAPIError):
                        present = self._present_columns(conn)
                    if name in present:  # a racing process added it first
                        continue
                self._warn_without_columns(
                    "transient" if lost else alter_failure(self.dialect, orig),
                    f"{'the connection was lost: ' if lost else ''}{type(orig).__name__}: "
                    f"{self._first_line(orig, 200)}",
                    [name for name in ADDED_COLUMNS if name not in present],
                    [statements[name] for name in ADDED_COLUMNS if name not in present],
                )
                return tuple(name for name in ADDED_COLUMNS if name in present)
        done = str(len(ADDED_COLUMNS))
        updated = conn.execute(sa.update(self.meta).where(self.meta.c.name == "columns").values(value=done))
        if updated.rowcount == 0:
            with contextlib.suppress(sa_exc.IntegrityError):
                conn.execute(sa.insert(self.meta).values(name="columns", value=done))
        return ADDED_COLUMNS

    def _add_indexes(self, conn: Connection) -> None:
        """Create the :data:`ADDED_INDEXES` a table made before them lacks (``checkfirst``: one that a
        racing process created first is left as it is), and record that they are there. As for the
        columns, one attempt per process, and a failure never fails the store: one warning names the
        statements to run, and until they have run the reads of :mod:`dibs.stores.pages` scan the
        namespace (slower, same answers). On a large PostgreSQL table the ``CREATE INDEX`` holds back
        writes while it builds: an administrator may rather run them ``CONCURRENTLY`` first."""
        found = conn.execute(sa.select(self.meta.c.value).where(self.meta.c.name == "indexes")).scalar()
        if found is not None and found.isdigit() and int(found) >= len(ADDED_INDEXES):
            return
        tried = (self.url, self.table_name, f"{self.schema}:indexes")
        if tried in _ALTER_TRIED:
            return
        _ALTER_TRIED.add(tried)
        _, full, _ = tables(self.table_name, self.schema, self.dialect)
        indexes = [index for index in full.indexes if index.name in _admin_index_names(self.table_name)]
        for index in sorted(indexes, key=lambda index: str(index.name)):
            try:
                with self._metadata_lock_bounded(conn):
                    index.create(conn, checkfirst=True)
            except sa_exc.DBAPIError as exc:
                orig = exc.orig or exc
                lost = exc.connection_invalidated or conn.invalidated
                statement = str(sa.schema.CreateIndex(index).compile(dialect=conn.dialect))
                log.warning(
                    "%s: table %s lacks the index %s and it could not be created (%s%s: %s); dibs works "
                    "without it (ls, top and prune scan the namespace) until it is created: %s",
                    self.url,
                    self.table_name,
                    index.name,
                    "the connection was lost: " if lost else "",
                    type(orig).__name__,
                    self._first_line(orig, 200),
                    statement,
                )
                return
        self._drop_namespace_index(conn)
        done = str(len(ADDED_INDEXES))
        updated = conn.execute(sa.update(self.meta).where(self.meta.c.name == "indexes").values(value=done))
        if updated.rowcount == 0:
            with contextlib.suppress(sa_exc.IntegrityError):
                conn.execute(sa.insert(self.meta).values(name="indexes", value=done))

    def _drop_namespace_index(self, conn: Connection) -> None:
        """Drop the namespace's own index of a table made before the keys' index (which begins with the
        namespace, and so answers whatever it did). Left in place if that fails: it only costs writes."""
        old = sa.Table(
            self.table_name, sa.MetaData(schema=self.schema), sa.Column("namespace", sa.String(200))
        )
        index = sa.Index(None, old.c.namespace)
        index.name = sa.schema.conv(_old_namespace_index(self.table_name, self.schema))
        try:
            with self._metadata_lock_bounded(conn):
                index.drop(conn, checkfirst=True)
        except sa_exc.DBAPIError as exc:
            log.info(
                "%s: the namespace index of %s was kept (%s)", self.url, self.table_name, exc.orig or exc
            )

    @contextlib.contextmanager
    def _metadata_lock_bounded(self, conn: Connection) -> Iterator[None]:
        """MySQL/MariaDB: an ALTER waits for the table's metadata lock up to ``lock_wait_timeout``
        (a year by default), not the store's ``innodb_lock_wait_timeout``; so for the ALTER it is the
        latter (0.8 of ``?timeout=``), and the wait ends with a lock wait timeout (transient) rather
        than the store's bound shutting the connection. PostgreSQL's ``lock_timeout`` already covers
        it. The session's own value is put back afterwards (not the server's default: the session may
        have set one of its own); a connection whose value cannot be put back is invalidated rather than
        returned to the pool changed."""
        if self.dialect not in ("mysql", "mariadb"):
            yield
            return
        saved = int(conn.execute(sa.text("SELECT @@SESSION.lock_wait_timeout")).scalar_one())
        conn.execute(sa.text("SET SESSION lock_wait_timeout = @@SESSION.innodb_lock_wait_timeout"))
        try:
            yield
        finally:
            if not conn.invalidated:  # never in place of the ALTER's own error
                try:
                    conn.execute(sa.text(f"SET SESSION lock_wait_timeout = {saved}"))
                except sa_exc.DBAPIError:
                    if not conn.invalidated:
                        conn.invalidate()

    def _present_columns(self, conn: Connection) -> set[str]:
        return {column["name"] for column in sa.inspect(conn).get_columns(self.table_name, self.schema)}

    def _warn_without_columns(
        self, failure: str, error: str, missing: list[str], statements: list[str]
    ) -> None:
        """The one warning of a process that works without the ``missing`` columns, saying why
        (``failure``, see :func:`alter_failure`) and what to do."""
        columns, statement = ", ".join(missing), "; ".join(statements)
        if failure == "refused":
            log.warning(
                "%s: table %s lacks the column(s) %s and this user may not add them (%s); dibs works "
                "without them (artifacts' compute times are not kept) until an administrator runs: %s",
                self.url,
                self.table_name,
                columns,
                error,
                statement,
            )
        elif failure == "transient":
            log.warning(
                "%s: table %s lacks the column(s) %s and they could not be added now (%s; another "
                "session may be holding the table); this process works without them (artifacts' compute "
                "times are not kept), and the next process to open the store tries again: %s",
                self.url,
                self.table_name,
                columns,
                error,
                statement,
            )
        else:
            log.warning(
                "%s: table %s lacks the column(s) %s and adding them failed (%s); this process works "
                "without them (artifacts' compute times are not kept); the statement was: %s",
                self.url,
                self.table_name,
                columns,
                error,
                statement,
            )

    def _create_postgres(self, conn: Connection) -> None:
        """Create the tables and the trigger in one transaction, serialized by a transaction-level
        advisory lock: racing creators wait for the first (``CREATE OR REPLACE FUNCTION`` would fail
        with "tuple concurrently updated"), then find the schema complete and create nothing.

        A transaction, not a session lock around autocommit statements: behind a transaction pooler
        (PgBouncer) each autocommit statement may reach another server session, so a session lock
        taken on one was "unlocked" on another and stayed held for as long as the pooler kept that
        server connection, and every later creation waited on it (issue 29). A transaction keeps its
        server connection to its end, and its lock ends with it; DDL is transactional in PostgreSQL,
        so a creation that fails half-way leaves nothing behind either."""
        conn.exec_driver_sql("BEGIN")  # the engine autocommits: this begins the server's transaction
        try:
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext(:name))"), {"name": self.table_name})
            # Looked up first: a failed read of a missing table would abort the transaction.
            exists = sa.inspect(conn).has_table(self.meta.name, self.schema)
            if not (exists and self._schema_version(conn) == SCHEMA_VERSION):
                if self.schema:
                    conn.execute(sa.text(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"'))
                self.metadata.create_all(conn, checkfirst=True)
                self._create_notify_trigger(conn)
        except BaseException:
            # A dropped connection took the transaction with it: a ROLLBACK would only replace the
            # real error (a StoreUnavailable). One that cannot be rolled back is never pooled again.
            if not conn.invalidated:
                try:
                    conn.exec_driver_sql("ROLLBACK")
                except sa_exc.DBAPIError:
                    if not conn.invalidated:
                        conn.invalidate()
            raise
        conn.exec_driver_sql("COMMIT")

    def _check_is_ours(self, conn: Connection) -> None:
        """Refuse a ``?table=`` that names a table dibs did not create (``CREATE ... IF NOT EXISTS``
        keeps it as it is): every operation would otherwise fail with the driver's raw error."""
        try:
            columns = {
                column["name"] for column in sa.inspect(conn).get_columns(self.table_name, self.schema)
            }
        except sa_exc.NoSuchTableError:
            columns = set()  # e.g. a system catalog found first on PostgreSQL's search path
        missing = sorted(set(self.t.c.keys()) - columns - set(ADDED_COLUMNS))
        if missing:
            raise ConfigurationError(
                f"table={self.table_name!r} in {self.url} is not a dibs table (it lacks the column(s) "
                f"{', '.join(missing)}); give dibs a table of its own, e.g. ?table=dibs_reservations",
                store=self.url,
            )

    def _check_schema_version(self, conn: Connection) -> None:
        found = conn.execute(
            sa.select(self.meta.c.value).where(self.meta.c.name == "schema_version")
        ).scalar()
        if found is None:
            with contextlib.suppress(sa_exc.IntegrityError):
                conn.execute(sa.insert(self.meta).values(name="schema_version", value=str(SCHEMA_VERSION)))
            return
        if not found.isdigit() or int(found) > SCHEMA_VERSION:
            raise ConfigurationError(
                f"table {self.table_name} in {self.url} has schema version {found!r}, newer than this dibs "
                f"understands ({SCHEMA_VERSION}); upgrade dibs, or use another table with ?table=NAME"
            )

    def _create_notify_trigger(self, conn: Connection) -> None:
        qualified = f'"{self.schema}"."{self.table_name}"' if self.schema else f'"{self.table_name}"'
        function = f'"{self.schema}".dibs_notify' if self.schema else "dibs_notify"
        conn.execute(
            sa.text(
                f"""
                CREATE OR REPLACE FUNCTION {function}() RETURNS trigger AS $$
                BEGIN
                    IF (OLD.lease_id IS NOT NULL AND NEW.lease_id IS NULL)
                       OR (NEW.serializer IS DISTINCT FROM OLD.serializer) THEN
                        PERFORM pg_notify('{NOTIFY_CHANNEL}', NEW.key_hash);
                    END IF;
                    RETURN NEW;
                END $$ LANGUAGE plpgsql
                """
            )
        )
        trigger = f"{self.table_name}_notify"
        exists = conn.execute(
            sa.text("SELECT 1 FROM pg_trigger WHERE tgname = :name AND tgrelid = CAST(:rel AS regclass)"),
            {"name": trigger, "rel": qualified},
        ).scalar()
        if not exists:
            conn.execute(
                sa.text(
                    f'CREATE TRIGGER "{trigger}" AFTER UPDATE ON {qualified} '
                    f"FOR EACH ROW EXECUTE FUNCTION {function}()"
                )
            )


def _old_namespace_index(table: str, schema: str | None) -> str:
    """The name SQLAlchemy gave the namespace column's own index (``index=True``) before issue 30."""
    return f"ix_{schema}_{table}_namespace" if schema else f"ix_{table}_namespace"


def _admin_index_names(table: str) -> set[str]:
    return {f"{table}_{suffix}" for suffix in ADDED_INDEXES}


#: The errors that say this user may not change the table, as opposed to a failure of the statement:
#: PostgreSQL's SQLSTATEs insufficient_privilege and read_only_sql_transaction (a standby, or
#: default_transaction_read_only); MySQL's table, column, database and privilege access denied, the
#: server or transaction in read-only mode, InnoDB read-only (innodb_read_only), a read-only table, and
#: a table Group Replication refuses.
_PG_REFUSED = frozenset({"42501", "25006"})
_MYSQL_REFUSED = frozenset({1142, 1143, 1044, 1227, 1290, 1792, 1836, 1874, 1036, 3098})
#: The errors that say the statement could not run now but may later: PostgreSQL's lock_not_available
#: (lock_timeout), query_canceled (statement_timeout), deadlock_detected and serialization_failure;
#: MySQL's lock wait timeout and deadlock, MariaDB's max_statement_time.
_PG_TRANSIENT = frozenset({"55P03", "57014", "40P01", "40001"})
_MYSQL_TRANSIENT = frozenset({1205, 1213, 1969})


#: The errors that say the server takes no writes at all, whoever asks: PostgreSQL's
#: read_only_sql_transaction (a hot standby, ``default_transaction_read_only``); MySQL's server in
#: ``--read-only`` / ``super_read_only`` mode, a read-only transaction, InnoDB read-only.
_PG_READ_ONLY = frozenset({"25006"})
_MYSQL_READ_ONLY = frozenset({1290, 1792, 1836, 1874})


def refuses_writes(dialect: str, error: BaseException) -> bool:
    """Whether the driver's ``error`` says the server is read-only (see :data:`_PG_READ_ONLY`).

    A lease is a write, so such a server cannot serve ``acquire`` or ``complete`` until it is a primary
    again (a failover in progress) or the URL names the primary: the store reports it as
    :class:`~dibs.errors.StoreUnavailable`, which the callers' ``on_unavailable`` policy handles,
    rather than as a bare driver error."""
    if dialect == "postgresql":
        return (getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)) in _PG_READ_ONLY
    if dialect in ("mysql", "mariadb"):
        code = error.args[0] if error.args else None
        return isinstance(code, int) and code in _MYSQL_READ_ONLY
    return False


def alter_failure(dialect: str, error: BaseException) -> str:
    """What the driver's ``error`` from an ``ALTER TABLE`` says: ``"refused"`` (this user may not
    alter the table, see :func:`may_not_alter`), ``"transient"`` (a lock or statement timeout, a
    deadlock: it may work later) or ``"other"``."""
    if may_not_alter(dialect, error):
        return "refused"
    if dialect == "postgresql":
        code = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
        transient = code in _PG_TRANSIENT
    elif dialect in ("mysql", "mariadb"):
        number = error.args[0] if error.args else None
        transient = isinstance(number, int) and number in _MYSQL_TRANSIENT
    elif dialect == "sqlite":
        name = getattr(error, "sqlite_errorname", None)
        if isinstance(name, str):
            transient = name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED"))
        else:
            transient = "is locked" in str(error).lower()
    else:
        transient = False
    return "transient" if transient else "other"


def may_not_alter(dialect: str, error: BaseException) -> bool:
    """Whether the driver's ``error`` says this user may not alter the table (see :data:`_PG_REFUSED`);
    SQLite: the file (or the connection) is read-only, or an authorizer refused."""
    if dialect == "postgresql":
        return (getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)) in _PG_REFUSED
    if dialect in ("mysql", "mariadb"):
        code = error.args[0] if error.args else None
        return isinstance(code, int) and code in _MYSQL_REFUSED
    if dialect == "sqlite":
        name = getattr(error, "sqlite_errorname", None)
        if isinstance(name, str):
            return name.startswith("SQLITE_READONLY") or name == "SQLITE_AUTH"
        return "readonly" in str(error).lower()
    return False

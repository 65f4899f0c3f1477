"""The SQL store (SQLAlchemy 2 Core): SQLite as the embedded default, PostgreSQL for deployments,
MySQL/MariaDB as well.

One row per key. How each operation stays atomic and cheap:

* ``acquire`` *reads first* (one ``SELECT`` that also returns the database's clock), decides with the
  shared state machine (:mod:`dibs.stores.transitions`) and writes only when it can win: a waiter that
  finds a live lease writes nothing, because in PostgreSQL even a losing conditional upsert locks the
  row, writes WAL and flushes. The write is a single compare-and-swap statement on the row's
  ``version`` (``INSERT ... ON CONFLICT DO NOTHING`` for a new key), so taking over an expired lease
  or re-entering one's own is one atomic statement; a lost swap re-reads and decides again.
  On PostgreSQL the first read is also the write when the key has no row yet: a key without a row
  is free whatever is asked, so one statement (a ``WITH ... INSERT ... ON CONFLICT DO NOTHING
  RETURNING`` beside the read) inserts its first lease or, when a row exists, writes nothing and
  returns it. A new key's reservation is then one round trip, like the raw conditional upsert,
  instead of a read and a write; hits and waiters still write nothing. The insert is attempted only
  when the statement's snapshot shows no row (``WHERE NOT EXISTS``): the conflict check would
  otherwise wait for any write to the row in flight, so a hit or a waiter never waits for a writer.
* ``heartbeat``, ``complete`` and ``release`` are one token-checked ``UPDATE`` each (fence and random
  lease id in the ``WHERE``); only when it matches no row is the row read again, to explain who has
  the key now.
* A row is never deleted: ``discard``, ``prune`` and ``reap`` clear it to a tombstone (fence and
  version kept, a few hundred bytes) with an ``UPDATE`` guarded by the version they read, so a row's
  version never repeats and no delayed statement can match a newer state of the row.
* Every statement runs in autocommit mode: SQLAlchemy's default transaction would add ``BEGIN`` and
  ``COMMIT`` round trips to statements that are atomic on their own (and, with PyMySQL, a
  ``ROLLBACK`` when the connection goes back to the pool, so the pool does not reset connections).
* The hot operations (``read``, ``acquire``, ``heartbeat``, ``complete``, ``release``) build and
  compile their SQLAlchemy statements once per store and then run the compiled SQL on a pooled
  DBAPI cursor: building, caching and executing a Core statement costs 40 to 150 microseconds of
  Python per call, several times an SQLite statement or a PostgreSQL round trip (measured in
  ``benchmarks/``). The connection itself is kept checked out between calls (the store's shelf: up
  to two on SQLite, one on a server) rather than given back to the pool and taken again: that costs
  10-13 µs a call on SQLite, more on PostgreSQL with the pool's checkin event (issue 20). A server's
  pool is bounded, so its shelved connection is lent back to any checkout that finds no idle one
  (:class:`~dibs.stores.sql.bounds.PatientPool`). Where the database has ``UPDATE ... RETURNING``
  (PostgreSQL, SQLite 3.35+), ``complete`` returns what it stored that the caller cannot know (the
  producer and the database's time) in the same statement instead of reading it back; MySQL keeps
  the two in session variables. The statements' constants (``version + 1``, ``owner = NULL``) are
  written into their SQL, so each call sends and binds only its own values, and a read's row is
  taken as the driver's tuple, named only when it has a row to decode (issue 20).
* Expiry is judged by the database's clock (``clock_timestamp()``, ``julianday('now')``,
  ``NOW(6)``), never the client's. Times are stored as Unix seconds (double precision). SQLite is
  the exception that proves the rule: it runs inside each calling process, so ``julianday('now')``
  is that process's clock. All processes of one machine share it, but a process whose clock is
  shifted (as the reliability suite does with libfaketime) judges expiry wrongly, exactly like the
  file store; ``RELIABILITY.md`` shows it.
* PostgreSQL wakes waiters with ``LISTEN``/``NOTIFY``: a trigger notifies when a lease ends or an
  artifact appears, so no extra round trip is spent by writers; the process's one listening
  connection hears every key, after proving that it hears (behind a transaction pooler it cannot:
  ``?listen_url=`` gives it the server itself, see :class:`~dibs.stores.sql.feed.ListenFeed`).
* Behind PgBouncer (either pool mode, stock settings) nothing session-level is asked of a connection:
  no startup options, no server-side prepared statements behind transaction pooling, schema creation
  in one transaction (:mod:`~dibs.stores.sql.pooler`, docs/deploy.md).

SQLite is opened in WAL mode, PostgreSQL and MySQL get a bounded pool; the URL's options (``table``,
``schema``, ``synchronous``, ``busy_timeout``, ``pool_size``, ``timeout``, ``max_artifact_size``,
``watch_interval``, ``pooler``, ``listen_url``) are described in :mod:`dibs.stores.sql.engine`.

One store object serves every client of a process (:mod:`dibs.runtime`): one bounded pool, one
schema check (a single read when the tables exist; nothing is sent before the first operation),
and one watch hub, whose feed is a ``LISTEN`` connection on PostgreSQL, a ``data_version`` probe on
SQLite and a versions query on MySQL (:mod:`dibs.stores.feeds`).

Hostile and careless input, and a server that goes away:

* Rows are read by the shared decoder (:mod:`dibs.stores.decoder`), so a damaged row is the same
  :class:`~dibs.errors.CorruptRecord` as on every store; ``force_release``, ``forget`` and ``reap``
  read and decode the row before changing it (compare-and-swap on its version), so they never
  rewrite a damaged one, and ``list``/``reap`` skip (and count) rows they cannot read.
* MySQL/MariaDB tables are created ``utf8mb4`` with a binary collation, whatever the database's
  default (under latin1, keys were stored as ``?``). A statement longer than the server's
  ``max_allowed_packet`` is refused before it is sent (:class:`~dibs.errors.ArtifactTooLarge`): the
  server would drop the connection, which looks like a network failure.
* When the server has ended a pooled connection (a restart, ``pg_terminate_backend``), the whole
  pool is dropped, and the operations that are safe to repeat (``read``, ``list``, ``acquire``,
  ``heartbeat``) run once more on a fresh connection; ``complete`` and ``release`` are not repeated.
* A MySQL/MariaDB deadlock (1213) or lock wait timeout (1205) is an answer, not a lost reply: the
  server rolled the statement back, so every operation (``complete`` and ``release`` too) runs again,
  a few times, before it is reported.

Limits, checked or enforced by the client, so that no call outlives what the lease can wait:

* **Value size.** Each database's limit on one write is known before anything is sent: SQLite's
  ``SQLITE_LIMIT_LENGTH`` of the connection (a row, 1,000,000,000 bytes by default), PostgreSQL's
  1 GB for a ``bytea`` value, MySQL's ``max_allowed_packet`` for the whole statement, or a lower
  ``?max_artifact_size=``. A larger artifact is :class:`~dibs.errors.ArtifactTooLarge`; the client
  then releases the lease and returns the value to its own caller.
* **Time.** Every call on a pooled PostgreSQL/MySQL connection is bounded on the client
  (:mod:`dibs.stores.sql.bounds`) by ``timeout`` seconds, plus a second per
  :data:`~dibs.stores.sql.store.BYTES_PER_SECOND` of an artifact being stored; past it the connection
  is shut and the call is :class:`~dibs.errors.StoreUnavailable`. The server ends lock waits at 0.8
  ``timeout`` (PostgreSQL's ``lock_timeout``, MySQL's ``innodb_lock_wait_timeout``), so they end
  there cleanly first (a clean error, retried where safe), and new connections give up after
  ``timeout`` (``connect_timeout``). Keep the ttl several times ``timeout``: a heartbeat that times
  out is retried until the lease would expire.
* **Connections.** Pooled connections beyond one are closed after two idle seconds, so a process
  that only waits holds one pooled connection, plus PostgreSQL's listener: two. A server that
  refuses more clients gets an error that says what to change.

The package, one idea a module (none imports one listed after it):

* :mod:`~dibs.stores.sql.fork`: the gate that keeps ``os.fork`` out while a dibs thread is inside SQLite;
* :mod:`~dibs.stores.sql.bounds`: how long one call on a server connection may take, how many stay open;
* :mod:`~dibs.stores.sql.pooler`: what a PostgreSQL URL reaches, the server or a pooler (PgBouncer), and
  what that allows at connect (startup options) and per statement (server-side prepared statements);
* :mod:`~dibs.stores.sql.engine`: the URL and its options, the engine, its pool and each driver's bounds;
* :mod:`~dibs.stores.sql.schema`: the tables, how a row reads as records, the schema check;
* :mod:`~dibs.stores.sql.statements`: the statements, built with SQLAlchemy Core and compiled once;
* :mod:`~dibs.stores.sql.feed`: the change feeds (``LISTEN``/``NOTIFY``, ``data_version``, a poll);
* :mod:`~dibs.stores.sql.store`: :class:`SQLStore`, the operations.
"""

from dibs.stores.sql.schema import SCHEMA_VERSION
from dibs.stores.sql.store import SQLStore

__all__ = ["SCHEMA_VERSION", "SQLStore"]

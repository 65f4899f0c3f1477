"""The baselines: each store's raw primitive, written by hand against the same driver dibs uses.

A raw primitive does the least any lease needs, with no library around it:

* ``claim``: one conditional write that takes a key if nobody holds it (SQL: a conditional upsert on
  a table of the same shape as dibs's; Redis: ``SET NX PX``; Azure: a create-only PUT; files: an
  ``O_EXCL`` create);
* ``finish``: one conditional write that stores the result only while the claim is still ours (SQL:
  a token-checked ``UPDATE``; Redis: a compare-and-set script; Azure: an ``If-Match`` PUT; files: a
  token check, then a temporary file renamed into place).

Durability matches the store's: the SQLite baseline uses the store's ``synchronous`` mode, the file
baseline fsyncs what it renames, like the file store.
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import json
import os
import secrets
import sqlite3
import urllib.parse
from pathlib import Path
from typing import Any

__all__ = ["RawPrimitive", "claim_parameters", "open_raw", "postgres_claim", "prepare_raw"]


def _digest(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


class RawPrimitive(abc.ABC):
    """One conditional write to claim a key, one to finish it."""

    @abc.abstractmethod
    def claim(self, name: str, owner: str, ttl: float) -> str | None:
        """Take ``name`` if it is free: the claim's token, or ``None`` if somebody else has it."""

    @abc.abstractmethod
    def finish(self, name: str, token: str, payload: bytes) -> bool:
        """Store ``payload`` for ``name`` only if ``token`` is still the claim; ``True`` if stored."""

    def close(self) -> None:  # noqa: B027 - most baselines hold something to close, not all
        """Release connections."""


# -- SQL ---------------------------------------------------------------------------------------------

_SQL_COLUMNS = (
    "key_hash, namespace, name, version, fence, attempts, owner, lease_id, acquired_at, expires_at, "
    "ttl, attempt, failure_count"
)


class _SQLRaw(RawPrimitive):
    """A conditional upsert and a token-checked update on a table shaped like the store's."""

    paramstyle = "%s"
    now = ""
    claim_sql = ""
    finish_sql = ""

    def __init__(self, connection: Any, table: str) -> None:
        self.conn = connection
        self.table = table
        self.claim_sql = self.claim_sql.format(t=table, now=self.now, p=self.paramstyle, columns=_SQL_COLUMNS)
        self.finish_sql = self.finish_sql.format(t=table, now=self.now, p=self.paramstyle)

    def claim(self, name: str, owner: str, ttl: float) -> str | None:
        parameters = claim_parameters(name, owner, ttl)
        cursor = self.conn.cursor()
        try:
            cursor.execute(self.claim_sql, parameters)
            return str(parameters[4]) if cursor.rowcount > 0 else None
        finally:
            cursor.close()

    def finish(self, name: str, token: str, payload: bytes) -> bool:
        cursor = self.conn.cursor()
        try:
            checksum = "sha256:" + hashlib.sha256(payload).hexdigest()
            cursor.execute(self.finish_sql, ("json", payload, len(payload), checksum, _digest(name), token))
            return bool(cursor.rowcount == 1)
        finally:
            cursor.close()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()


_FINISH_SQL = (
    "UPDATE {t} SET producer = owner, artifact_fence = fence, version = version + 1, serializer = {p}, "
    "payload = {p}, size = {p}, checksum = {p}, created_at = {now}, owner = NULL, lease_id = NULL, "
    "acquired_at = NULL, expires_at = NULL, max_expires_at = NULL, ttl = NULL, attempt = NULL "
    "WHERE key_hash = {p} AND lease_id = {p} AND serializer IS NULL"
)

_UPSERT_SQL = (
    "INSERT INTO {t} ({columns}) VALUES ({p}, {p}, {p}, 1, 1, 1, {p}, {p}, {now}, {now} + {p}, {p}, 1, 0) "
    "ON CONFLICT (key_hash) DO UPDATE SET version = {t}.version + 1, fence = {t}.fence + 1, "
    "attempts = {t}.attempts + 1, owner = excluded.owner, lease_id = excluded.lease_id, "
    "acquired_at = excluded.acquired_at, expires_at = excluded.expires_at, ttl = excluded.ttl, "
    "attempt = {t}.attempts + 1 "
    "WHERE {t}.serializer IS NULL AND ({t}.lease_id IS NULL OR {t}.expires_at <= excluded.acquired_at)"
)


class _PostgresRaw(_SQLRaw):
    now = "(extract(epoch from clock_timestamp())::double precision)"
    claim_sql = _UPSERT_SQL
    finish_sql = _FINISH_SQL


class _SQLiteRaw(_SQLRaw):
    paramstyle = "?"
    now = "((julianday('now') - 2440587.5) * 86400.0)"
    claim_sql = _UPSERT_SQL
    finish_sql = _FINISH_SQL


class _MySQLRaw(_SQLRaw):
    # MySQL/MariaDB assign left to right, so the decision is taken once, into @won, before any column
    # changes; an unchanged row reports 0 affected rows (the driver does not ask for FOUND_ROWS).
    now = "(UNIX_TIMESTAMP(NOW(6)) + 0.0)"
    claim_sql = (
        "INSERT INTO {t} ({columns}) "
        "VALUES ({p}, {p}, {p}, 1, 1, 1, {p}, {p}, {now}, {now} + {p}, {p}, 1, 0) "
        "ON DUPLICATE KEY UPDATE owner = IF(@won := "
        "(serializer IS NULL AND (lease_id IS NULL OR expires_at <= VALUES(acquired_at))), "
        "VALUES(owner), owner), "
        "version = IF(@won, version + 1, version), fence = IF(@won, fence + 1, fence), "
        "attempt = IF(@won, attempts + 1, attempt), attempts = IF(@won, attempts + 1, attempts), "
        "lease_id = IF(@won, VALUES(lease_id), lease_id), "
        "acquired_at = IF(@won, VALUES(acquired_at), acquired_at), "
        "expires_at = IF(@won, VALUES(expires_at), expires_at), ttl = IF(@won, VALUES(ttl), ttl)"
    )
    finish_sql = _FINISH_SQL


def _sql_parts(url: str) -> tuple[Any, dict[str, str]]:
    try:
        from dibs.stores.sql.engine import split_options
    except ImportError:  # dibs before the SQL store became a package (measuring an older commit)
        from dibs.stores.sql import _split_options as split_options  # type: ignore[attr-defined,no-redef]

    return split_options(url)  # type: ignore[no-any-return,unused-ignore]


def claim_parameters(name: str, owner: str, ttl: float) -> tuple[str | float, ...]:
    """The SQL claim's parameters for key ``name``; the fifth is the claim's token."""
    return (_digest(name), "bench.raw", name, owner, secrets.token_hex(16), ttl, ttl)


def _postgres_parts(url: str) -> tuple[str, str]:
    """libpq's conninfo for the dibs ``url``, and the raw table's qualified name."""
    sa_url, options = _sql_parts(url)
    table = options.get("table", "dibs_reservations") + "_raw"
    schema = options.get("schema")
    conninfo = sa_url.set(drivername="postgresql").render_as_string(hide_password=False)
    return conninfo, f'"{schema}"."{table}"' if schema else f'"{table}"'


def postgres_claim(url: str) -> tuple[str, str]:
    """The PostgreSQL raw claim for a process that imports nothing but psycopg: (conninfo, SQL)."""
    conninfo, qualified = _postgres_parts(url)
    sql = _PostgresRaw.claim_sql.format(
        t=qualified, now=_PostgresRaw.now, p=_PostgresRaw.paramstyle, columns=_SQL_COLUMNS
    )
    return conninfo, sql


def _open_sql(url: str) -> RawPrimitive:
    sa_url, options = _sql_parts(url)
    table = options.get("table", "dibs_reservations") + "_raw"
    backend = sa_url.get_backend_name()
    if backend == "sqlite":
        conn = sqlite3.connect(sa_url.database, timeout=30, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA busy_timeout = 30000")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {options['synchronous']}")
        return _SQLiteRaw(conn, f'"{table}"')
    if backend == "postgresql":
        import psycopg

        conninfo, qualified = _postgres_parts(url)
        return _PostgresRaw(psycopg.connect(conninfo, autocommit=True), qualified)
    if backend in ("mysql", "mariadb"):
        import pymysql  # type: ignore[import-untyped]

        conn = pymysql.connect(
            host=sa_url.host or "127.0.0.1",
            port=sa_url.port or 3306,
            user=sa_url.username or "root",
            password=sa_url.password or "",
            database=sa_url.database,
            autocommit=True,
        )
        return _MySQLRaw(conn, f"`{table}`")
    raise ValueError(f"no raw SQL baseline for {backend!r}")


def _prepare_sql(url: str) -> None:
    import sqlalchemy as sa

    try:
        from dibs.stores.sql.schema import tables
    except ImportError:  # dibs before the SQL store became a package (measuring an older commit)
        from dibs.stores.sql import _tables as tables  # type: ignore[attr-defined,no-redef]

    sa_url, options = _sql_parts(url)
    table = options.get("table", "dibs_reservations") + "_raw"
    try:
        metadata, _, _ = tables(table, options.get("schema"), sa_url.get_backend_name())
    except TypeError:  # dibs before 0.1's lazy MySQL import (lets the benchmarks measure older commits)
        metadata, _, _ = tables(table, options.get("schema"))  # type: ignore[call-arg]
    engine = sa.create_engine(sa_url)
    try:
        with engine.begin() as conn:
            metadata.create_all(conn)
    finally:
        engine.dispose()


# -- Redis -------------------------------------------------------------------------------------------

_REDIS_CAS = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2])
  return 1
end
return 0
"""


class _RedisRaw(RawPrimitive):
    """``SET NX PX`` to claim, a compare-and-set script to finish."""

    def __init__(self, url: str) -> None:
        import redis

        parts = urllib.parse.urlsplit(url)
        query = urllib.parse.parse_qs(parts.query)
        self.prefix = query.get("prefix", ["dibs:"])[0] + "raw:"
        self.client = redis.Redis.from_url(urllib.parse.urlunsplit(parts._replace(query="")))
        self.cas = self.client.register_script(_REDIS_CAS)

    def claim(self, name: str, owner: str, ttl: float) -> str | None:
        token = secrets.token_hex(16)
        won = self.client.set(self.prefix + _digest(name), token, nx=True, px=int(ttl * 1000))
        return token if won else None

    def finish(self, name: str, token: str, payload: bytes) -> bool:
        return bool(self.cas(keys=[self.prefix + _digest(name)], args=[token, payload]))

    def close(self) -> None:
        self.client.close()


# -- Azure blobs -------------------------------------------------------------------------------------


class _AzureRaw(RawPrimitive):
    """A create-only PUT (``If-None-Match: *``) to claim, an ``If-Match`` PUT to finish."""

    def __init__(self, url: str) -> None:
        from azure.storage.blob import BlobServiceClient

        from dibs.stores.azure.settings import parse_url

        settings = parse_url(url)
        assert settings.connection_string is not None, "the benchmarks reach Azurite by connection string"
        self.service = BlobServiceClient.from_connection_string(settings.connection_string)
        self.container = self.service.get_container_client(settings.container)
        self.prefix = settings.prefix + "raw/"
        self.etags: dict[str, str] = {}

    def claim(self, name: str, owner: str, ttl: float) -> str | None:
        from azure.core.exceptions import ResourceExistsError

        token = secrets.token_hex(16)
        blob = self.container.get_blob_client(self.prefix + _digest(name))
        record = json.dumps({"owner": owner, "token": token, "ttl": ttl}).encode()
        try:
            reply = blob.upload_blob(record, overwrite=False)
        except ResourceExistsError:
            return None
        self.etags[token] = reply["etag"]
        return token

    def finish(self, name: str, token: str, payload: bytes) -> bool:
        from azure.core import MatchConditions
        from azure.core.exceptions import HttpResponseError

        blob = self.container.get_blob_client(self.prefix + _digest(name))
        record = json.dumps({"token": token, "payload": payload.decode()}).encode()
        try:
            blob.upload_blob(
                record,
                overwrite=True,
                etag=self.etags.pop(token),
                match_condition=MatchConditions.IfNotModified,
            )
        except HttpResponseError:
            return False
        return True

    def close(self) -> None:
        self.service.close()


# -- Files -------------------------------------------------------------------------------------------


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _FileRaw(RawPrimitive):
    """An ``O_EXCL`` create (fsynced) to claim; a token check, then a fsynced file renamed into place."""

    def __init__(self, url: str) -> None:
        self.root = Path(urllib.parse.unquote(urllib.parse.urlsplit(url).path)) / "raw"

    def _paths(self, name: str) -> tuple[Path, Path]:
        digest = _digest(name)
        folder = self.root / digest[:2]
        return folder / f"{digest}.lease", folder / f"{digest}.done"

    def claim(self, name: str, owner: str, ttl: float) -> str | None:
        lease, _ = self._paths(name)
        lease.parent.mkdir(parents=True, exist_ok=True)
        token = secrets.token_hex(16)
        try:
            fd = os.open(lease, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return None
        try:
            os.write(fd, token.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return token

    def finish(self, name: str, token: str, payload: bytes) -> bool:
        lease, done = self._paths(name)
        if lease.read_bytes() != token.encode():
            return False
        temporary = done.with_suffix(f".{token}.tmp")
        fd = os.open(temporary, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        try:
            os.write(fd, payload)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temporary, done)
        _fsync_dir(done.parent)
        return True


# -- by store ----------------------------------------------------------------------------------------


def open_raw(store: str, url: str) -> RawPrimitive:
    """The raw primitive for the store family ``store`` on the space a dibs ``url`` names."""
    if store.startswith(("sqlite", "postgres", "mysql")):
        return _open_sql(url)
    if store == "redis":
        return _RedisRaw(url)
    if store == "azure":
        return _AzureRaw(url)
    if store == "file":
        return _FileRaw(url)
    raise ValueError(f"no raw baseline for the {store!r} store")


def prepare_raw(store: str, url: str) -> None:
    """Create what the raw primitive writes to (the SQL table), once, before any process uses it."""
    if store.startswith(("sqlite", "postgres", "mysql")):
        _prepare_sql(url)
    elif store == "azure":
        from azure.core.exceptions import ResourceExistsError

        raw = _AzureRaw(url)
        try:
            with contextlib.suppress(ResourceExistsError):
                raw.container.create_container()
        finally:
            raw.close()

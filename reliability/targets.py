"""The stores under test: one isolated, disposable space per store, plus native access to its records.

A :class:`Target` names a fresh space on one store (a new SQLite file or directory, a PostgreSQL
schema, a MySQL table, a Redis key prefix, an Azure container), removed by :meth:`Target.close`, so
runs never collide with each other or with the test suite on shared servers. It also knows:

* where the store's network service is (``service``) and how to rewrite the URL to go through the
  fault proxy (:meth:`Target.proxied_url`);
* how to reach the store's records *without* dibs (:meth:`snapshot`, :meth:`corruptions`,
  :meth:`tamper`), to plant foreign or damaged records and tampered payloads the way another
  program, a bad migration or an attacker with write access would, and to prove afterwards that
  dibs left them exactly as they were;
* whose clock judges expiry (``local_clock``): the filesystem store and the embedded SQLite store
  use the clock of each calling process, the others the service's.

Service URLs come from the same variables as the test suite (``DIBS_TEST_POSTGRES_URL``,
``DIBS_TEST_MYSQL_URL``, ``DIBS_TEST_REDIS_URL``); with ``defaults=True`` (the command line) the
loopback services of ``.ci/run`` are tried when they are unset. Azure runs on an Azurite emulator
this package starts and owns, so that the fault scenario may restart it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import tempfile
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dibs.keys import Key
from dibs.stores import Store, open_store

__all__ = ["ALL_STORES", "Target", "TargetUnavailable", "open_target", "shared_azurite"]

ALL_STORES = ("sqlite", "postgres", "mysql", "redis", "file", "azure")

_DEFAULT_URLS = {
    "postgres": "postgresql+psycopg://postgres@127.0.0.1:5432/test",
    "mysql": "mysql+pymysql://root@127.0.0.1:3306/test",
    "redis": "redis://127.0.0.1:6379/0",
}
_ENV = {"postgres": "DIBS_TEST_POSTGRES_URL", "mysql": "DIBS_TEST_MYSQL_URL", "redis": "DIBS_TEST_REDIS_URL"}

Corruption = Callable[[Store, Key], None]


class TargetUnavailable(RuntimeError):
    """The store cannot be tested here; the message says why and how to fix it."""


def _flip(payload: bytes) -> bytes:
    """The payload with one byte changed (or one byte, if it was empty): what bit rot or an edit does."""
    if not payload:
        return b"x"
    middle = len(payload) // 2
    return payload[:middle] + bytes([payload[middle] ^ 0x20]) + payload[middle + 1 :]


class Target:
    """One isolated space on one store. Subclasses add the store's native access."""

    name = ""
    local_clock = False
    clock_tolerance = 0.0
    #: Corruptions that the lease holder's own fenced write may repair (a design choice of the SQL
    #: store: the token is intact, so complete/release may rewrite the row into a valid record).
    repairable: frozenset[str] = frozenset()

    def __init__(self, url: str, service: tuple[str, int] | None = None) -> None:
        self.url = url
        self.service = service

    def proxied_url(self, port: int) -> str:
        """The URL of the same space, reached through a proxy on ``127.0.0.1:port``."""
        raise NotImplementedError(f"the {self.name} store has no network connection to proxy")

    def open(self) -> Store:
        return open_store(self.url)

    def snapshot(self, store: Store, key: Key) -> Any:
        """The key's record (and payload) exactly as stored, read without dibs."""
        raise NotImplementedError

    def corruptions(self) -> dict[str, Corruption]:
        """Ways to damage or replace a key's record natively, by name."""
        raise NotImplementedError

    def tamper(self, store: Store, key: Key) -> None:
        """Change one byte of the key's stored artifact payload, leaving its checksum as it was."""
        raise NotImplementedError

    def set_field(self, store: Store, key: Key, name: str, value: Any) -> None:
        """Set one field of the key's record natively, as another program could: ``fence``,
        ``attempts`` (the record's), ``expires_at`` or ``owner`` (its lease's)."""
        raise NotImplementedError

    def close(self) -> None:
        """Remove the space."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"


# -- SQL -------------------------------------------------------------------------------------------


class _SQLTarget(Target):
    repairable = frozenset({"lease without expiry", "lease without attempt"})

    def _update(self, store: Store, key: Key, **values: Any) -> None:
        import sqlalchemy as sa

        table = store.t  # type: ignore[attr-defined]
        with store.engine.begin() as conn:  # type: ignore[attr-defined]
            conn.execute(sa.update(table).where(table.c.key_hash == key.digest).values(**values))

    def snapshot(self, store: Store, key: Key) -> Any:
        import sqlalchemy as sa

        table = store.t  # type: ignore[attr-defined]
        with store.engine.connect() as conn:  # type: ignore[attr-defined]
            row = (
                conn.execute(sa.select(table).where(table.c.key_hash == key.digest)).mappings().one_or_none()
            )
        return (
            None
            if row is None
            else {k: (bytes(v) if isinstance(v, memoryview) else v) for k, v in row.items()}
        )

    def corruptions(self) -> dict[str, Corruption]:
        return {
            "row of another key": lambda s, k: self._update(s, k, namespace="foreign", name="someone-else"),
            "lease without owner": lambda s, k: self._update(s, k, owner=None),
            "lease without expiry": lambda s, k: self._update(s, k, expires_at=None),
            "lease without attempt": lambda s, k: self._update(s, k, attempt=None),
        }

    def tamper(self, store: Store, key: Key) -> None:
        row = self.snapshot(store, key)
        self._update(store, key, payload=_flip(bytes(row["payload"])))

    def set_field(self, store: Store, key: Key, name: str, value: Any) -> None:
        self._update(store, key, **{name: value})


class SQLiteTarget(_SQLTarget):
    name = "sqlite"
    local_clock = True

    def corruptions(self) -> dict[str, Corruption]:
        return {
            **super().corruptions(),
            "text in a number column": lambda s, k: self._update(s, k, fence="garbage"),
        }


class PostgresTarget(_SQLTarget):
    name = "postgres"

    def __init__(self, base: str) -> None:
        from sqlalchemy.engine import make_url

        self.base = base
        self.schema = f"dibs_rel_{uuid.uuid4().hex[:12]}"
        parsed = make_url(base)
        super().__init__(
            _with_query(base, schema=self.schema), (parsed.host or "127.0.0.1", parsed.port or 5432)
        )

    def proxied_url(self, port: int) -> str:
        from sqlalchemy.engine import make_url

        url = make_url(self.url).set(host="127.0.0.1", port=port)
        return url.render_as_string(hide_password=False)

    def close(self) -> None:
        import psycopg

        conninfo = self.base.replace("postgresql+psycopg://", "postgresql://", 1)
        with (
            contextlib.suppress(psycopg.Error),
            psycopg.connect(conninfo, autocommit=True, connect_timeout=5) as conn,
        ):
            conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')


class MySQLTarget(_SQLTarget):
    name = "mysql"

    def __init__(self, base: str) -> None:
        from sqlalchemy.engine import make_url

        self.base = base
        self.table = f"dibs_rel_{uuid.uuid4().hex[:12]}"
        parsed = make_url(base)
        super().__init__(
            _with_query(base, table=self.table), (parsed.host or "127.0.0.1", parsed.port or 3306)
        )

    def proxied_url(self, port: int) -> str:
        from sqlalchemy.engine import make_url

        return make_url(self.url).set(host="127.0.0.1", port=port).render_as_string(hide_password=False)

    def close(self) -> None:
        import sqlalchemy as sa

        engine = sa.create_engine(self.base)
        try:
            with engine.begin() as conn:
                conn.execute(sa.text(f"DROP TABLE IF EXISTS `{self.table}`"))
                conn.execute(sa.text(f"DROP TABLE IF EXISTS `{self.table}_meta`"))
        finally:
            engine.dispose()


# -- Redis -----------------------------------------------------------------------------------------


class RedisTarget(Target):
    name = "redis"

    def __init__(self, base: str) -> None:
        self.base = base
        self.prefix = f"dibs-rel-{uuid.uuid4().hex}:"
        parts = urllib.parse.urlsplit(base)
        super().__init__(
            _with_query(base, prefix=self.prefix), (parts.hostname or "127.0.0.1", parts.port or 6379)
        )

    def _client(self) -> Any:
        import redis

        return redis.Redis.from_url(self.base, socket_timeout=10)

    def proxied_url(self, port: int) -> str:
        parts = urllib.parse.urlsplit(self.url)
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@127.0.0.1:{port}" if userinfo else f"127.0.0.1:{port}"
        return urllib.parse.urlunsplit(parts._replace(netloc=netloc))

    def snapshot(self, store: Store, key: Key) -> Any:
        client = self._client()
        try:
            return client.dump(store.record_key(key))  # type: ignore[attr-defined]
        finally:
            client.close()

    def _with(self, action: Callable[[Any, str], Any]) -> Corruption:
        def corrupt(store: Store, key: Key) -> None:
            client = self._client()
            try:
                action(client, store.record_key(key))  # type: ignore[attr-defined]
            finally:
                client.close()

        return corrupt

    def corruptions(self) -> dict[str, Corruption]:
        def wrong_type(client: Any, name: str) -> None:
            client.delete(name)
            client.set(name, "not a hash")

        return {
            "a string instead of a hash": self._with(wrong_type),
            "foreign format": self._with(lambda c, n: c.hset(n, "format", "someone.else/9")),
            "text in a number field": self._with(lambda c, n: c.hset(n, "fence", "garbage")),
            "incomplete lease": self._with(lambda c, n: c.hdel(n, "lease_owner")),
            "record of another key": self._with(lambda c, n: c.hset(n, "name", "someone-else")),
        }

    def tamper(self, store: Store, key: Key) -> None:
        def flip(client: Any, name: str) -> None:
            client.hset(name, "artifact_payload", _flip(client.hget(name, "artifact_payload") or b""))

        self._with(flip)(store, key)

    def set_field(self, store: Store, key: Key, name: str, value: Any) -> None:
        field = {"expires_at": "lease_expires_at", "owner": "lease_owner"}.get(name, name)
        text = repr(value) if isinstance(value, float) else str(value)
        self._with(lambda client, record: client.hset(record, field, text))(store, key)

    def close(self) -> None:
        client = self._client()
        try:
            doomed = list(client.scan_iter(match=f"{self.prefix}*", count=500))
            for start in range(0, len(doomed), 500):
                client.delete(*doomed[start : start + 500])
        finally:
            client.close()


# -- record documents (file, Azure) ------------------------------------------------------------------


def _document_corruptions(
    write: Callable[[Store, Key, bytes], None], read: Callable[[Store, Key], bytes]
) -> dict[str, Corruption]:
    """Damage shared by the stores that keep one JSON document per key (:mod:`dibs.stores.codec`)."""

    def edited(change: Callable[[dict[str, Any]], None]) -> Corruption:
        def corrupt(store: Store, key: Key) -> None:
            doc = json.loads(read(store, key))
            change(doc)
            write(store, key, json.dumps(doc).encode())

        return corrupt

    def set_lease(field: str, value: Any) -> Callable[[dict[str, Any]], None]:
        def change(doc: dict[str, Any]) -> None:
            doc["lease"][field] = value

        return change

    return {
        "garbage bytes": lambda s, k: write(s, k, b"\x00\xffnot json at all"),
        "truncated document": lambda s, k: write(s, k, read(s, k)[: len(read(s, k)) // 2]),
        "foreign format": edited(lambda doc: doc.update(format="someone.else/9")),
        "record of another key": edited(lambda doc: doc.update(name="someone-else")),
        "lease owner null": edited(set_lease("owner", None)),
        "lease id a number": edited(set_lease("lease_id", 12345)),
        "fence a float": edited(lambda doc: doc.update(fence=1.5)),
        "a JSON list": lambda s, k: write(s, k, b"[1, 2, 3]"),
    }


def _set_document_field(
    write: Callable[[Store, Key, bytes], None],
    read: Callable[[Store, Key], bytes],
    *,
    store: Store,
    key: Key,
    name: str,
    value: Any,
) -> None:
    doc = json.loads(read(store, key))
    if name in ("expires_at", "owner"):
        doc["lease"][name] = value
    else:
        doc[name] = value
    write(store, key, json.dumps(doc).encode())


class FileTarget(Target):
    name = "file"
    local_clock = True

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        super().__init__(f"file://{urllib.parse.quote(str(folder))}/store")

    @staticmethod
    def _write(store: Store, key: Key, data: bytes) -> None:
        path = store.record_path(key)  # type: ignore[attr-defined]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    @staticmethod
    def _read(store: Store, key: Key) -> bytes:
        return bytes(store.record_path(key).read_bytes())  # type: ignore[attr-defined]

    def snapshot(self, store: Store, key: Key) -> Any:
        path = store.record_path(key)  # type: ignore[attr-defined]
        record = path.read_bytes() if path.exists() else None
        payloads = sorted(
            (p.name, p.read_bytes())
            for p in path.parents[2].joinpath("artifacts").rglob(f"{key.digest}-*.bin")
        )
        return record, payloads

    def corruptions(self) -> dict[str, Corruption]:
        return _document_corruptions(self._write, self._read)

    def tamper(self, store: Store, key: Key) -> None:
        state = store.read(key)
        assert state.artifact is not None
        path = store.artifact_path(key, state.artifact.fence)  # type: ignore[attr-defined]
        path.write_bytes(_flip(path.read_bytes()))

    def set_field(self, store: Store, key: Key, name: str, value: Any) -> None:
        _set_document_field(self._write, self._read, store=store, key=key, name=name, value=value)


class AzureTarget(Target):
    name = "azure"
    clock_tolerance = 1.0  # the service's clock is read from the one-second Date header

    def __init__(self, connection_string: str, port: int) -> None:
        self.connection_string = connection_string
        self.container = f"dibs-rel-{uuid.uuid4().hex[:20]}"
        super().__init__(_azure_url(connection_string, self.container), ("127.0.0.1", port))

    def proxied_url(self, port: int) -> str:
        assert self.service is not None
        proxied = self.connection_string.replace(f"127.0.0.1:{self.service[1]}", f"127.0.0.1:{port}")
        return _azure_url(proxied, self.container)

    def _blob(self, store: Store, name: str) -> Any:
        return store._container.get_blob_client(name)  # type: ignore[attr-defined]

    def _write(self, store: Store, key: Key, data: bytes) -> None:
        self._blob(store, store.record_name(key)).upload_blob(data, overwrite=True)  # type: ignore[attr-defined]

    def _read(self, store: Store, key: Key) -> bytes:
        return bytes(self._blob(store, store.record_name(key)).download_blob().readall())  # type: ignore[attr-defined]

    def snapshot(self, store: Store, key: Key) -> Any:
        from azure.core.exceptions import ResourceNotFoundError

        container = store._container  # type: ignore[attr-defined]
        found = []
        for props in container.list_blobs(name_starts_with=store.prefix):  # type: ignore[attr-defined]
            if key.digest in props.name:
                with contextlib.suppress(ResourceNotFoundError):
                    found.append(
                        (
                            props.name,
                            props.etag,
                            container.get_blob_client(props.name).download_blob().readall(),
                        )
                    )
        return sorted(found)

    def corruptions(self) -> dict[str, Corruption]:
        return {
            **_document_corruptions(self._write, self._read),
            "oversized blob": lambda s, k: self._write(s, k, b"{" + b" " * (1024 * 1024 + 10) + b"}"),
        }

    def tamper(self, store: Store, key: Key) -> None:
        state = store.read(key)
        assert state.artifact is not None
        blob = self._blob(store, store.artifact_name(key, state.artifact))  # type: ignore[attr-defined]
        blob.upload_blob(_flip(blob.download_blob().readall()), overwrite=True)

    def set_field(self, store: Store, key: Key, name: str, value: Any) -> None:
        _set_document_field(self._write, self._read, store=store, key=key, name=name, value=value)

    def close(self) -> None:
        from azure.core.exceptions import ResourceNotFoundError
        from azure.storage.blob import BlobServiceClient

        with (
            BlobServiceClient.from_connection_string(self.connection_string) as service,
            contextlib.suppress(ResourceNotFoundError),
        ):
            service.delete_container(self.container)


def _azure_url(connection_string: str, container: str) -> str:
    return f"azure://{container}/rel?connection_string={urllib.parse.quote(connection_string, safe='')}"


def _with_query(url: str, **params: str) -> str:
    separator = "&" if "?" in url else "?"
    return url + separator + urllib.parse.urlencode(params)


# -- availability --------------------------------------------------------------------------------------


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=3):
            return True
    except OSError:
        return False


def _service_url(name: str, defaults: bool) -> str:
    url = os.environ.get(_ENV[name], "").strip() or (_DEFAULT_URLS[name] if defaults else "")
    if not url:
        raise TargetUnavailable(f"set {_ENV[name]} (e.g. {_DEFAULT_URLS[name]}) to include the {name} store")
    return url


class _Azurite:
    """The run's own emulator, started on first use (it may be restarted by the fault scenario)."""

    instance: Any = None
    workspace: Path | None = None
    error: str | None = None


def shared_azurite() -> Any:
    """The harness's Azurite (a :class:`tests.azurite.Azurite`), started once (see :func:`stop_azurite`)."""
    if _Azurite.instance is not None:
        return _Azurite.instance
    if _Azurite.error is not None:
        raise TargetUnavailable(_Azurite.error)
    try:
        import azure.storage.blob  # noqa: F401
        from tests import azurite
    except ImportError as exc:
        _Azurite.error = f"the Azure store needs azure-storage-blob and the tests package ({exc})"
        raise TargetUnavailable(_Azurite.error) from exc
    workspace = Path(tempfile.mkdtemp(prefix="dibs-rel-azurite-"))
    try:
        emulator = azurite.Azurite(workspace)
        emulator.start()
    except azurite.AzuriteUnavailable as exc:
        shutil.rmtree(workspace, ignore_errors=True)
        _Azurite.error = f"no Azurite: {exc}"
        raise TargetUnavailable(_Azurite.error) from exc
    _Azurite.instance, _Azurite.workspace = emulator, workspace
    return emulator


def stop_azurite() -> None:
    if _Azurite.instance is not None:
        _Azurite.instance.stop()
        if _Azurite.workspace is not None:
            shutil.rmtree(_Azurite.workspace, ignore_errors=True)
    _Azurite.instance = _Azurite.workspace = None


def open_target(name: str, folder: Path, *, defaults: bool = True) -> Target:
    """A fresh isolated space on store ``name``; :class:`TargetUnavailable` says why not."""
    if name == "sqlite":
        folder.mkdir(parents=True, exist_ok=True)
        return SQLiteTarget(f"sqlite:///{folder / 'dibs.db'}")
    if name == "file":
        folder.mkdir(parents=True, exist_ok=True)
        return FileTarget(folder)
    if name == "azure":
        emulator = shared_azurite()
        return AzureTarget(emulator.connection_string, emulator.port)
    if name not in _ENV:
        raise TargetUnavailable(f"unknown store {name!r}; known: {', '.join(ALL_STORES)}")
    url = _service_url(name, defaults)
    target: Target
    try:
        target = {"postgres": PostgresTarget, "mysql": MySQLTarget, "redis": RedisTarget}[name](url)
    except ImportError as exc:
        raise TargetUnavailable(
            f"the {name} store needs its driver: pip install 'dibs[{name}]' ({exc})"
        ) from exc
    assert target.service is not None
    if not _answers(*target.service):
        raise TargetUnavailable(
            f"nothing answers at {target.service[0]}:{target.service[1]} for the {name} store"
        )
    return target


@contextlib.contextmanager
def isolated(name: str, folder: Path, *, defaults: bool = True) -> Iterator[Target]:
    target = open_target(name, folder, defaults=defaults)
    try:
        yield target
    finally:
        target.close()

"""The stores this machine can run, each on a fresh, isolated space that is removed afterwards.

Service addresses come from ``DIBS_BENCH_<STORE>_URL``, else the test suite's ``DIBS_TEST_<STORE>_URL``,
else the usual loopback defaults. A store that cannot be reached or imported is skipped, with the
reason recorded in the results.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from benchmarks.raw import prepare_raw
from dibs.stores import AcquireRequest, NewArtifact

__all__ = ["ALL_STORES", "Target", "open_targets"]

#: Every store the benchmarks know, in report order. ``sqlite-full`` (fsync per commit) only runs
#: the overhead benchmark, as a second SQLite durability point.
ALL_STORES = ("sqlite", "postgres", "mysql", "redis", "azure", "file")
EXTRA_STORES = ("sqlite-full",)

_DEFAULTS = {
    "postgres": "postgresql+psycopg://postgres@127.0.0.1:5432/test",
    "mysql": "mysql+pymysql://root@127.0.0.1:3306/test",
    "redis": "redis://127.0.0.1:6379/0",
}
_LABELS = {
    "sqlite": "SQLite (WAL, synchronous=NORMAL)",
    "sqlite-full": "SQLite (WAL, synchronous=FULL)",
    "postgres": "PostgreSQL (psycopg 3)",
    "mysql": "MariaDB (PyMySQL)",
    "redis": "Redis (redis-py)",
    "azure": "Azure Blob (Azurite)",
    "file": "Filesystem (local disk)",
}
_PUSH = {
    "sqlite": "watch hub: data_version probe when inotify sees the -wal file written, else every 0.1 s"
    " (every 4 ms without inotify)",
    "postgres": "watch hub: one LISTEN connection",
    "mysql": "watch hub: one versions query per look (every 25 ms)",
    "redis": "watch hub: one pattern subscription",
    "azure": "watch hub: ETags of the watched records (50 ms to 1 s)",
    "file": "watch hub: stat() of the watched records",
}


@dataclasses.dataclass(frozen=True)
class Target:
    """One store on an isolated space: ``url`` opens it with :func:`dibs.open_store` in any process."""

    name: str
    label: str
    url: str
    pushes: bool
    push_how: str

    @property
    def family(self) -> str:
        return self.name.split("-", 1)[0]


def _service_url(store: str) -> str:
    key = store.upper()
    return (
        os.environ.get(f"DIBS_BENCH_{key}_URL") or os.environ.get(f"DIBS_TEST_{key}_URL") or _DEFAULTS[store]
    )


def _hex() -> str:
    return uuid.uuid4().hex[:12]


class _Unavailable(Exception):
    pass


def _postgres(scratch: Path) -> tuple[str, Callable[[], None]]:
    try:
        import psycopg
    except ImportError as exc:
        raise _Unavailable("psycopg is not installed (pip install 'dibs[postgres]')") from exc
    base = _service_url("postgres")
    libpq = base.replace("postgresql+psycopg://", "postgresql://", 1)
    try:
        psycopg.connect(libpq, connect_timeout=3).close()
    except psycopg.Error as exc:
        raise _Unavailable(f"PostgreSQL does not answer at {base}: {str(exc).splitlines()[0]}") from exc
    schema = f"dibs_bench_{_hex()}"

    def cleanup() -> None:
        with psycopg.connect(libpq, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

    return f"{base}{'&' if '?' in base else '?'}schema={schema}", cleanup


def _mysql(scratch: Path) -> tuple[str, Callable[[], None]]:
    try:
        import pymysql  # type: ignore[import-untyped]  # noqa: F401
        import sqlalchemy as sa
    except ImportError as exc:
        raise _Unavailable("PyMySQL is not installed (pip install 'dibs[mysql]')") from exc
    base = _service_url("mysql")
    engine = sa.create_engine(base)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except sa.exc.OperationalError as exc:
        engine.dispose()
        raise _Unavailable(
            f"MySQL/MariaDB does not answer at {base}: {str(exc.orig).splitlines()[0]}"
        ) from exc
    table = f"dibs_bench_{_hex()}"

    def cleanup() -> None:
        with engine.begin() as conn:
            for suffix in ("", "_meta", "_raw"):
                conn.execute(sa.text(f"DROP TABLE IF EXISTS `{table}{suffix}`"))
        engine.dispose()

    return f"{base}{'&' if '?' in base else '?'}table={table}", cleanup


def _redis(scratch: Path) -> tuple[str, Callable[[], None]]:
    try:
        import redis
    except ImportError as exc:
        raise _Unavailable("redis-py is not installed (pip install 'dibs[redis]')") from exc
    base = _service_url("redis")
    client = redis.Redis.from_url(base, socket_connect_timeout=3)
    try:
        client.ping()
    except redis.RedisError as exc:
        client.close()
        raise _Unavailable(f"Redis does not answer at {base}: {exc}") from exc
    prefix = f"dibs-bench-{_hex()}:"

    def cleanup() -> None:
        try:
            doomed = list(client.scan_iter(match=f"{prefix}*", count=1000))
            for start in range(0, len(doomed), 1000):
                client.delete(*doomed[start : start + 1000])
        finally:
            client.close()

    return f"{base}{'&' if '?' in base else '?'}prefix={prefix}", cleanup


def _azure(scratch: Path) -> tuple[str, Callable[[], None]]:
    try:
        from azure.storage.blob import BlobServiceClient
    except ImportError as exc:
        raise _Unavailable("azure-storage-blob is not installed (pip install 'dibs[azure]')") from exc
    try:
        from tests import azurite
    except ImportError as exc:  # pragma: no cover - the benchmarks run from the repository
        raise _Unavailable("tests/azurite.py (the emulator helper) is not importable") from exc
    try:
        connection_string = azurite.session_azurite().connection_string
    except azurite.AzuriteUnavailable as exc:
        raise _Unavailable(f"no Azurite: {exc}") from exc
    container = f"dibs-bench-{_hex()}"

    def cleanup() -> None:
        with (
            BlobServiceClient.from_connection_string(connection_string) as service,
            contextlib.suppress(Exception),
        ):
            service.delete_container(container)

    query = urllib.parse.urlencode({"connection_string": connection_string}, quote_via=urllib.parse.quote)
    return f"azure://{container}/bench?{query}", cleanup


def _sqlite(scratch: Path, synchronous: str = "") -> tuple[str, Callable[[], None]]:
    folder = scratch / f"sqlite{synchronous.lower()}"
    folder.mkdir()
    suffix = f"?synchronous={synchronous}" if synchronous else ""
    return f"sqlite:///{folder / 'dibs.db'}{suffix}", lambda: None


def _file(scratch: Path) -> tuple[str, Callable[[], None]]:
    return f"file://{urllib.parse.quote(str(scratch / 'filestore'))}", lambda: None


_MAKERS: dict[str, Callable[[Path], tuple[str, Callable[[], None]]]] = {
    "sqlite": _sqlite,
    "sqlite-full": lambda scratch: _sqlite(scratch, "FULL"),
    "postgres": _postgres,
    "mysql": _mysql,
    "redis": _redis,
    "azure": _azure,
    "file": _file,
}


def _self_check(url: str) -> bool:
    """Open the store and take one key through acquire → complete → read; ``notifies`` of the store."""
    import dibs
    from dibs.records import Granted, checksum
    from dibs.stores import open_store

    store = open_store(url)
    try:
        key = dibs.Key("bench.selfcheck", _hex())
        outcome = store.acquire(key, AcquireRequest("self-check", 30.0))
        assert isinstance(outcome, Granted), outcome
        store.complete(key, outcome.lease.token, NewArtifact("json", b"1", checksum(b"1")))
        state = store.read(key)
        assert state.artifact is not None and state.artifact.payload == b"1", state
        return store.change_feed() is not None  # the process's watch hub can follow it
    finally:
        store.close()


@contextlib.contextmanager
def open_targets(
    names: tuple[str, ...], scratch_root: Path | None = None
) -> Iterator[tuple[list[Target], dict[str, str]]]:
    """The available targets among ``names`` and, for the others, why they were skipped."""
    scratch = Path(tempfile.mkdtemp(prefix="dibs-bench-", dir=scratch_root))
    targets: list[Target] = []
    skipped: dict[str, str] = {}
    cleanups: list[Callable[[], None]] = []
    try:
        for name in names:
            try:
                url, cleanup = _MAKERS[name](scratch)
            except _Unavailable as exc:
                skipped[name] = str(exc)
                continue
            cleanups.append(cleanup)
            try:
                pushes = _self_check(url)
                prepare_raw(name, url)
            except Exception as exc:  # a broken store is skipped with the reason
                skipped[name] = f"the store does not work here: {type(exc).__name__}: {str(exc)[:300]}"
                continue
            how = _PUSH.get(name.split("-", 1)[0], "") if pushes else ""
            targets.append(Target(name, _LABELS[name], url, pushes, how or "none (polling only)"))
        yield targets, skipped
    finally:
        for cleanup in reversed(cleanups):
            with contextlib.suppress(Exception):
                cleanup()
        shutil.rmtree(scratch, ignore_errors=True)

"""Payloads on any fsspec file system: ``s3://bucket/prefix``, ``gs://...``, ``abfs://...``, ``local://...``
(the ``fsspec`` extra, plus the file system's own package: s3fs, gcsfs, adlfs, ...).

fsspec is what Airflow's ``ObjectStoragePath`` is built on; credentials come the way the file system
finds them (environment, instance roles, its config files) or as URL options it understands. Layout
under the URL's path::

    <root>/sha256/<64 hex digits>     one payload, named by its SHA-256
    <root>/partial/<random>.part      a payload being uploaded (moved into place once whole)

A stream is spooled to a local temporary file while its digest is computed, uploaded under
``partial/``, then moved to its name (a rename where the file system has one; on object stores a
server-side copy, after which the object appears whole). Putting a payload that is already there
refreshes its modification time where the file system can (``touch``), else uploads it again, so
the collector (:mod:`dibs.payloads.collect`) sees it was just written. A file system that reports no
modification time protects its payloads from collection altogether (they always look just written).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import secrets
import tempfile
import time
from collections.abc import Iterator
from typing import IO, Any

import fsspec  # type: ignore[import-untyped]

from dibs.errors import ConfigurationError
from dibs.payloads.base import (
    Freed,
    PayloadStore,
    PayloadUnavailable,
    PayloadWriter,
    StoredPayload,
    checked_digest,
)
from dibs.stores import redact_url

__all__ = ["FsspecPayloadStore"]


def _modified(info: dict[str, Any]) -> float:
    for name in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(name)
        if isinstance(value, dt.datetime):
            return value.timestamp()
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return time.time()  # no time known: looks just written, so it is never collected


class _SpoolingWriter(PayloadWriter):
    def __init__(self, store: FsspecPayloadStore) -> None:
        super().__init__()
        self._store = store
        self._spool = tempfile.NamedTemporaryFile(prefix="dibs-payload-", delete=False)  # noqa: SIM115

    def _write(self, view: memoryview) -> None:
        self._spool.write(view)

    def _commit(self, sha256: str) -> None:
        self._spool.close()
        try:
            self._store._place(sha256, self._spool.name, self.size)
        finally:
            os.unlink(self._spool.name)

    def _abort(self) -> None:
        self._spool.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._spool.name)


class FsspecPayloadStore(PayloadStore):
    """Payloads under ``root`` of an fsspec file system (see the module docstring)."""

    def __init__(self, fs: Any, root: str, url: str) -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        self._url = redact_url(url)

    @classmethod
    def from_url(cls, url: str) -> FsspecPayloadStore:
        try:
            fs, root = fsspec.core.url_to_fs(url)
        except (ImportError, ValueError) as exc:
            raise ConfigurationError(
                f"payloads={redact_url(url)!r}: fsspec cannot open it ({exc}); install the file system's "
                "package (s3fs for s3://, gcsfs for gs://, adlfs for abfs://)",
                setting="payloads",
            ) from exc
        return cls(fs, root, url)

    @property
    def url(self) -> str:
        return self._url

    def _path(self, sha256: str) -> str:
        return f"{self.root}/sha256/{checked_digest(sha256)}"

    def uri(self, sha256: str) -> str:
        return f"{self._url.split('://', 1)[0]}://{self._path(sha256).lstrip('/')}"

    def writer(self) -> PayloadWriter:
        return _SpoolingWriter(self)

    def _place(self, sha256: str, local: str, size: int) -> None:
        target = self._path(sha256)
        found = self.stat(sha256)
        if found is not None and found.size == size:
            try:
                self.fs.touch(target, truncate=False)  # put again: a writer is about to publish it
                return
            except (NotImplementedError, ValueError, OSError):
                pass  # no touch here: upload it again, which renews its time
        partial = f"{self.root}/partial/{secrets.token_hex(12)}.part"
        self.fs.makedirs(f"{self.root}/partial", exist_ok=True)
        self.fs.makedirs(f"{self.root}/sha256", exist_ok=True)
        self.fs.put_file(local, partial)
        self.fs.mv(partial, target)

    def open(self, sha256: str) -> IO[bytes]:
        try:
            stream: IO[bytes] = self.fs.open(self._path(sha256), "rb")
        except FileNotFoundError:
            raise PayloadUnavailable(f"payload {self.uri(sha256)} is missing") from None
        return stream

    def stat(self, sha256: str) -> StoredPayload | None:
        try:
            info = self.fs.info(self._path(sha256))
        except FileNotFoundError:
            return None
        return StoredPayload(sha256, int(info["size"]), _modified(info))

    def delete(self, sha256: str, *, unchanged_since: float) -> int:
        found = self.stat(sha256)
        if found is None or found.modified >= unchanged_since:
            return 0
        try:
            self.fs.rm(self._path(sha256))
        except FileNotFoundError:
            return 0
        return found.size

    def list(self) -> Iterator[StoredPayload]:
        try:
            found = self.fs.find(f"{self.root}/sha256", detail=True)
        except FileNotFoundError:
            return
        for path, info in found.items():
            name = path.rsplit("/", 1)[-1]
            if len(name) == 64:
                yield StoredPayload(name, int(info["size"]), _modified(info))

    def discard_partial(self, *, unchanged_since: float) -> Freed:
        freed = Freed()
        try:
            found = self.fs.find(f"{self.root}/partial", detail=True)
        except FileNotFoundError:
            return freed
        for path, info in found.items():
            if path.endswith(".part") and _modified(info) < unchanged_since:
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm(path)
                    freed = freed + Freed(1, int(info["size"]))
        return freed

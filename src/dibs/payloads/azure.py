"""Payloads in Azure Blob Storage: ``azure://CONTAINER[/PREFIX]?account_url=...`` (the ``azure`` extra).

The URL, its options and the credential order are the Azure record store's (see
:mod:`dibs.stores.azure`, whose connection and blob helpers this module uses): the same URL may serve
both, as payloads live under their own folder::

    PREFIX/payloads/sha256/<64 hex digits>     one payload, named by its SHA-256

A payload is written by the SDK's block upload (blocks staged, then one block list committed), so a
reader sees the whole blob or none. A stream is first spooled to a local temporary file while its
digest is computed (the name must be known before the upload; memory stays at one chunk), then
uploaded in parallel blocks; bytes already in memory are uploaded from there.

A payload is one blob, so it is kept safe from a collection otherwise than in a folder (see
:mod:`dibs.payloads.base`): putting a payload that is there already updates its metadata, which gives
the blob a new ETag (and a new Last-Modified time), and a removal is conditional on the ETag it
listed (``If-Match``): the service refuses it if the payload was put again since, however long the
collector was paused. A put that finds the blob gone meanwhile uploads it again. Uncommitted blocks of
a writer that died are dropped by the service itself after a week.
"""

from __future__ import annotations

import builtins
import hashlib
import tempfile
from collections.abc import Iterator
from typing import IO, Any, cast

from azure.core import MatchConditions
from azure.core.exceptions import AzureError, ResourceModifiedError, ResourceNotFoundError

from dibs.errors import StoreUnavailable
from dibs.payloads.base import (
    Freed,
    Payload,
    PayloadStore,
    PayloadUnavailable,
    PayloadWriter,
    StoredPayload,
    checked_digest,
    is_digest,
    named_otherwise,
    unavailable,
    unwritable,
)
from dibs.payloads.readers import SdkReader
from dibs.stores import redact_url
from dibs.stores.azure.blobs import create_container, with_container
from dibs.stores.azure.connection import connect
from dibs.stores.azure.settings import AzureSettings, parse_url

__all__ = ["AzurePayloadStore"]


def _etag(value: object) -> str:
    """An ETag as the service compares it, quoted: a listing gives it bare, a blob's properties quoted."""
    return '"' + str(value).strip('"') + '"'


def _described(exc: AzureError) -> str:
    """An SDK error as ``Type: first line of its message``: the SDK's ``str()`` adds the request's
    details (headers, a signed URL), which no error of dibs shows."""
    first = str(getattr(exc, "message", "") or "").strip().splitlines()
    return f"{type(exc).__name__}: {first[0] if first else 'no message'}"


class _SpoolingWriter(PayloadWriter):
    def __init__(self, store: AzurePayloadStore) -> None:
        super().__init__(store.url)
        self._store = store
        self._spool = tempfile.TemporaryFile(prefix="dibs-payload-")  # noqa: SIM115 (closed by commit/abort)

    def _write(self, view: memoryview) -> None:
        self._spool.write(view)

    def _commit(self, sha256: str) -> None:
        try:
            self._spool.seek(0)
            self._store._upload(sha256, self._spool, self.size)
        finally:
            self._spool.close()

    def _abort(self) -> None:
        self._spool.close()


class _Downloaded(SdkReader):
    """A downloading blob as a readable binary stream (``read(n)`` returns the SDK's bytes as they are)."""

    def __init__(self, downloader: Any, uri: str) -> None:
        super().__init__()
        self._downloader, self._uri = downloader, uri
        properties = getattr(downloader, "properties", None)
        #: The ETag of the blob being read: what :meth:`AzurePayloadStore.condemn` removes, if it still is.
        etag = getattr(properties, "etag", None)
        self.etag: str | None = None if etag is None else _etag(etag)

    @property
    def size(self) -> int | None:
        """The blob's size, known from the download's first response (read_verified checks it)."""
        size = getattr(self._downloader, "size", None)
        return size if isinstance(size, int) else None

    def _read(self, size: int) -> bytes:
        try:
            data: bytes = self._downloader.read(size)
        except ResourceNotFoundError:
            raise PayloadUnavailable(f"payload {self._uri} is missing") from None
        except AzureError as exc:
            raise StoreUnavailable(f"reading payload {self._uri} failed: {type(exc).__name__}") from exc
        return data


class AzurePayloadStore(PayloadStore):
    """Payloads in a blob container (see the module docstring)."""

    def __init__(self, settings: AzureSettings, url: str) -> None:
        self._settings = settings
        self._url = redact_url(url)
        self._connection = connect(settings)
        self._container = self._connection.service.get_container_client(settings.container)
        self._folder = f"{settings.prefix.rstrip('/')}/payloads/sha256/".lstrip("/")

    @classmethod
    def from_url(cls, url: str) -> AzurePayloadStore:
        return cls(parse_url(url), url)

    @property
    def url(self) -> str:
        return self._url

    def _name(self, sha256: str) -> str:
        return self._folder + checked_digest(sha256)

    def uri(self, sha256: str) -> str:
        return f"azure://{self._settings.container}/{self._name(sha256)}"

    def _unavailable(self, doing: str, exc: AzureError) -> StoreUnavailable:
        return unavailable(self._url, doing, exc, _described(exc))

    # -- writing ------------------------------------------------------------------------------------
    def writer(self) -> PayloadWriter:
        return _SpoolingWriter(self)

    def put(
        self, data: bytes | bytearray | memoryview, serializer: str = "bytes", *, sha256: str | None = None
    ) -> Payload:
        whole = data if isinstance(data, bytes) else bytes(data)  # the SDK takes bytes (a bytes value: as is)
        payload = Payload(sha256 or hashlib.sha256(whole).hexdigest(), len(whole), serializer)
        self._upload(payload.sha256, whole, payload.size)
        return payload

    def _refresh(self, sha256: str, size: int) -> bool:
        """Whether the payload is there whole; if so its Last-Modified is refreshed (put again)."""
        blob = self._container.get_blob_client(self._name(sha256))
        try:
            if blob.get_blob_properties().size != size:
                return False
            blob.set_blob_metadata({"dibs_put": "again"})
        except ResourceNotFoundError:
            return False
        return True

    def _upload(self, sha256: str, data: IO[bytes] | bytes, size: int) -> None:
        try:
            if self._refresh(sha256, size):
                return

            def upload() -> None:
                if not isinstance(data, bytes):
                    data.seek(0)  # a second attempt starts the stream again
                self._container.upload_blob(
                    self._name(sha256),
                    cast(Any, data),
                    length=size,
                    overwrite=True,  # the same bytes, or a damaged copy this one replaces
                    max_concurrency=self._settings.max_concurrency,
                    metadata={"dibs_sha256": sha256},
                )

            # A container that does not exist yet is created on the first write, as the record store does.
            with_container(upload, lambda: create_container(self._container))
        except AzureError as exc:
            raise unwritable(self._url, exc, _described(exc)) from exc

    # -- reading ------------------------------------------------------------------------------------
    def open(self, sha256: str) -> IO[bytes]:
        if named_otherwise(sha256):
            raise PayloadUnavailable(f"payload {sha256} is missing: {self._url} keeps SHA-256 payloads only")
        try:
            downloader = self._container.download_blob(
                self._name(sha256), max_concurrency=self._settings.max_concurrency
            )
        except ResourceNotFoundError:
            raise PayloadUnavailable(f"payload {self.uri(sha256)} is missing") from None
        except AzureError as exc:
            raise self._unavailable(f"reading payload {sha256}", exc) from exc
        return cast(IO[bytes], _Downloaded(downloader, self.uri(sha256)))

    def copies(self, sha256: str) -> builtins.list[StoredPayload]:
        if named_otherwise(sha256):
            return []  # this store names payloads by SHA-256 only
        try:
            found = self._container.get_blob_client(self._name(sha256)).get_blob_properties()
        except ResourceNotFoundError:
            return []
        except AzureError as exc:
            raise self._unavailable(f"reading payload {sha256}", exc) from exc
        return [StoredPayload(sha256, found.size, found.last_modified.timestamp(), _etag(found.etag))]

    def list(self) -> Iterator[StoredPayload]:
        try:
            for blob in self._container.list_blobs(name_starts_with=self._folder):
                sha256 = blob.name[len(self._folder) :]
                if is_digest(sha256):
                    yield StoredPayload(sha256, blob.size, blob.last_modified.timestamp(), _etag(blob.etag))
        except ResourceNotFoundError:
            return  # no container yet: no payloads
        except AzureError as exc:
            raise self._unavailable("listing payloads", exc) from exc

    # -- removing -----------------------------------------------------------------------------------
    def remove(self, found: StoredPayload) -> Freed:
        return Freed(1, int(found.size), 1) if self._delete(found.sha256, found.copy) else Freed()

    def _delete(self, sha256: str, etag: str) -> bool:
        """Delete the payload's blob if its ETag is still ``etag``: ``False`` if it was put again since
        (or is gone already), whatever the delay since the ETag was read."""
        blob = self._container.get_blob_client(self._name(sha256))
        try:
            blob.delete_blob(etag=etag, match_condition=MatchConditions.IfNotModified)
        except (ResourceNotFoundError, ResourceModifiedError):
            return False  # gone already, or put again since it was listed: kept
        except AzureError as exc:
            if getattr(exc, "status_code", None) == 412:
                return False
            raise self._unavailable(f"removing payload {sha256}", exc) from exc
        return True

    def condemn(self, sha256: str, stream: IO[bytes]) -> int:
        etag = getattr(stream, "etag", None)
        return int(isinstance(etag, str) and self._delete(sha256, etag))

    def close(self) -> None:
        self._connection.service.close()
        if self._connection.owned_credential is not None:
            self._connection.owned_credential.close()

"""Artifacts as files and streams, never whole in memory: the API Airflow, Prefect and the CLI share.

Writing: :func:`put` stores a file, a stream or bytes in the client's payload store and returns a
:class:`~dibs.payloads.Payload`; a work function returns it (or a lease completes with it), and the
lease publishes a reference to it without loading it. Reading: :func:`open_artifact` opens a key's
artifact as a stream and :func:`artifact_path` gives it as a local file, both checked to their end
(size and SHA-256) before the first byte is handed out, a chunk or two in memory at a time
(:func:`dibs.payloads.verify.spool_verified`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Protocol

from dibs.errors import ConfigurationError, ReservationError
from dibs.keys import Key
from dibs.payloads.base import Payload, PayloadUnavailable
from dibs.payloads.files import open_regular
from dibs.payloads.references import REFERENCE
from dibs.payloads.referencing import ReferencedArtifact, ReferencingStore
from dibs.payloads.verify import check_stream, copy_verified

if TYPE_CHECKING:
    from dibs.stores.base import Store

__all__ = ["ArtifactNotFound", "artifact_path", "open_artifact", "put", "referencing_store"]


class ArtifactNotFound(ReservationError, LookupError):
    """The key has no artifact to open."""


class StoreHolder(Protocol):
    """What these functions need of a client (or of a lease's source): its store. Not the client
    itself, which uses them: so this module imports neither the client nor the lease."""

    @property
    def store(self) -> Store: ...


def referencing_store(client: StoreHolder, what: str) -> ReferencingStore:
    store = client.store
    if not isinstance(store, ReferencingStore):
        raise ConfigurationError(
            f"{what} needs a payload store: Reservations(..., payloads='file:///shared/dibs') "
            "(or DIBS_PAYLOADS_URL, or --payloads in the CLI)",
            setting="payloads",
        )
    return store


def put(
    client: StoreHolder,
    source: bytes | bytearray | memoryview | str | os.PathLike[str] | IO[bytes],
    serializer: str,
) -> Payload:
    payloads = referencing_store(client, "put_payload").payloads
    if isinstance(source, bytes | bytearray | memoryview):
        return payloads.put(source, serializer)
    if isinstance(source, str | os.PathLike):
        with open(source, "rb") as stream:
            return payloads.put_stream(stream, serializer)
    return payloads.put_stream(source, serializer)


def _artifact(client: StoreHolder, key: Key) -> ReferencedArtifact | bytes:
    state = client.store.read(key)
    artifact = state.artifact
    if artifact is None:
        raise ArtifactNotFound(f"{key} has no artifact to open (it is {state.status})", key=str(key))
    if isinstance(artifact, ReferencedArtifact):
        return artifact
    if artifact.serializer == REFERENCE:
        referencing_store(client, f"reading the artifact of {key}")
    return artifact.verified_payload(key)


def open_artifact(client: StoreHolder, key: Key) -> IO[bytes]:
    """The artifact's stored bytes (as its serializer wrote them), as a binary stream. A payload is
    checked to its end (into a private temporary file) before this returns: no byte of a payload that
    is not the recorded one is ever handed out (:class:`PayloadUnavailable` instead)."""
    found = _artifact(client, key)
    if isinstance(found, bytes):
        return io.BytesIO(found)
    return dataclasses.replace(found, spooled=None).verified_spool(key)  # the caller's own, to read and close


@contextlib.contextmanager
def artifact_path(client: StoreHolder, key: Key) -> Iterator[Path]:
    """The artifact's stored bytes as a local file, checked before it is handed out. A folder payload
    store hands out the very copy it checked (read it, do not change it); elsewhere a temporary copy,
    checked as it was written, removed when the block ends."""
    found = _artifact(client, key)
    if isinstance(found, ReferencedArtifact):
        local = found.source.local_path(found.reference.sha256)
        stream = None if local is None else open_regular(local)
        if local is not None and stream is not None:
            with stream:
                try:
                    check_stream(stream, found.reference, found.uri)  # before anybody reads it
                except PayloadUnavailable as exc:
                    raise type(exc)(f"artifact of {key}: {exc}", key=str(key), uri=found.uri) from None
            yield local
            return
    with tempfile.TemporaryDirectory(prefix="dibs-artifact-") as folder:
        path = Path(folder) / "artifact"
        with open(path, "wb") as out:
            if isinstance(found, bytes):
                out.write(found)
            else:
                try:
                    copy_verified(found.source, found.reference, found.uri, out)
                except PayloadUnavailable as exc:
                    raise type(exc)(f"artifact of {key}: {exc}", key=str(key), uri=found.uri) from None
        yield path

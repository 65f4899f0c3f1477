"""Reading a stored artifact back into its value: which serializer may read it, its integrity check,
and the one decode a process shares among many waiters.

Both faces of a client (:class:`dibs.Reservations` and :class:`dibs.AsyncReservations`) read through
one :class:`ArtifactReader`; writing is the lease's (:meth:`dibs.lease.Lease.complete`, through
:func:`dibs.serializers.dump_artifact`).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from dibs.errors import ConfigurationError, ReservationError, SerializationError
from dibs.keys import Key
from dibs.outcomes import Hit
from dibs.payloads import REFERENCE, ReferencedArtifact
from dibs.records import ArtifactRecord
from dibs.serializers import (
    BytesSerializer,
    JSONSerializer,
    Serializer,
    SignedPickleSerializer,
    load_artifact,
    resolve_serializer,
)
from dibs.settings import Settings

__all__ = ["DECODE_ON_LOOP_BYTES", "ArtifactReader", "unread_hit"]

#: Artifacts larger than this are decoded in the I/O executor by async callers, never on their loop.
DECODE_ON_LOOP_BYTES = 64 * 1024
#: Serializers whose value depends on the payload alone (no key, no signature): safe to share.
_SHAREABLE_SERIALIZERS = frozenset({"json", "bytes"})
_SHAREABLE_READERS = frozenset({JSONSerializer, BytesSerializer})
#: Values no caller can change, so every waiter may get the same object.
_IMMUTABLE = frozenset({str, bytes, int, float, bool, type(None)})
#: Decoded values by artifact record (records read together are one object, equal records one entry).
_DECODED: weakref.WeakKeyDictionary[ArtifactRecord, tuple[Key, Any]] = weakref.WeakKeyDictionary()
_DECODED_LOCK = threading.Lock()


class ArtifactReader:
    """Decodes the artifacts a client reads, with the serializer that wrote each one, never with one
    that would be unsafe: a pickle is only read when the settings hold a signing key to check it with.

    :param settings: the client's settings (their signing key).
    :param serializer: the client's own serializer (what its leases write).
    """

    def __init__(self, settings: Settings, serializer: Serializer) -> None:
        self.settings = settings
        self.serializer = serializer

    def decode(self, key: Key, artifact: ArtifactRecord) -> Any:
        """The value of a stored artifact, after its integrity check.

        An immutable value of a keyless serializer (JSON, bytes) is decoded once per process: a
        thousand waiters handed one artifact share its value (:data:`_DECODED`)."""
        if artifact.serializer == REFERENCE:  # read through a client without the payload store
            raise ConfigurationError(
                f"artifact of {key} is kept in a payload store (its record holds a reference); give this "
                "client the writers' payload store: Reservations(..., payloads=URL) or DIBS_PAYLOADS_URL",
                key=str(key),
            )
        reader: Serializer | None = None
        shared = artifact.serializer in _SHAREABLE_SERIALIZERS
        if shared:  # a shareable name always has a reader: looked up once, here
            reader = self._reader_for(key, artifact.serializer)
            shared = type(reader) in _SHAREABLE_READERS
        if shared:
            with _DECODED_LOCK:
                cached = _DECODED.get(artifact)
            if cached is not None and cached[0] == key:
                return cached[1]
        payload = artifact.verified_payload(key)  # before an unknown serializer's error, as always
        if reader is None:
            reader = self._reader_for(key, artifact.serializer)
        value = _load(key, artifact, reader, payload)
        if shared and type(value) in _IMMUTABLE:
            with _DECODED_LOCK:
                _DECODED[artifact] = (key, value)
        return value

    def hit(self, key: Key, artifact: ArtifactRecord) -> Hit:
        """The :class:`~dibs.outcomes.Hit` of a stored artifact, its value decoded."""
        return Hit.of(key, artifact, self.decode(key, artifact))

    def _reader_for(self, key: Key, name: str) -> Serializer:
        if name == self.serializer.name:
            return self.serializer
        if name in _SHAREABLE_SERIALIZERS:
            return resolve_serializer(name)
        if name == SignedPickleSerializer.name and self.settings.signing_key is not None:
            return SignedPickleSerializer(self.settings.signing_key)
        raise SerializationError(
            f"artifact of {key} was written with serializer {name!r}, which this client (serializer "
            f"{self.serializer.name!r}) cannot read safely; configure the writer's serializer "
            "(and signing key) here too",
            key=str(key),
        )


def _load(key: Key, artifact: ArtifactRecord, reader: Serializer, payload: bytes) -> Any:
    try:
        return load_artifact(reader, payload, key, artifact.fence)  # signatures bind key + fence
    except ReservationError as exc:
        if str(key) in str(exc):
            raise
        # A serializer does not know which key it reads: a refused signature must still say where.
        raise type(exc)(f"artifact of {key}: {exc}", **{**exc.fields, "key": str(key)}) from exc
    except Exception as exc:
        raise SerializationError(
            f"artifact of {key} could not be read by serializer {artifact.serializer!r}: "
            f"{type(exc).__name__}: {exc}",
            key=str(key),
        ) from exc


def unread_hit(key: Key, artifact: ArtifactRecord) -> Hit | None:
    """The hit of ``artifact`` when it is a payload handed out unread (a store with ``load=False``):
    the artifact itself is its value, for a front end that streams it (``dibs run``) or hands a
    reference on (Airflow), instead of loading it whole to decode it. ``None`` for any other artifact
    (decode it as usual)."""
    if isinstance(artifact, ReferencedArtifact) and artifact.loaded is None:
        return Hit.of(key, artifact, artifact)
    return None

"""The JSON form of a key's record, for stores that keep one document per key (files, blobs).

The document names its format, so a foreign or damaged record is recognised and reported as
:class:`~dibs.errors.CorruptRecord` instead of being misread or overwritten; the checks themselves
are :mod:`dibs.stores.decoder`'s, the same for every store. Payloads are not part of
the document unless a store asks for them inline (base64); large artifacts live beside it.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from typing import Any

from dibs.keys import Key
from dibs.records import KeyState
from dibs.stores import decoder

__all__ = ["FORMAT", "decode", "encode"]

FORMAT = "dibs.record/1"


def encode(state: KeyState, *, inline_payload: bool = False) -> bytes:
    """Serialize ``state`` (its ``now`` is not stored: time is always read from the store anew)."""
    doc: dict[str, Any] = {
        "format": FORMAT,
        "namespace": state.key.namespace,
        "name": state.key.name,
        "fence": state.fence,
        "attempts": state.attempts,
        "lease": None,
        "failure": None,
        "artifact": None,
    }
    if state.lease is not None:
        lease = state.lease
        doc["lease"] = {
            "owner": lease.owner,
            "fence": lease.token.fence,
            "lease_id": lease.token.lease_id,
            "acquired_at": lease.acquired_at,
            "expires_at": lease.expires_at,
            "ttl": lease.ttl,
            "attempt": lease.attempt,
            "max_expires_at": lease.max_expires_at,
        }
    if state.failure is not None:
        doc["failure"] = dataclasses.asdict(state.failure)
    if state.artifact is not None:
        artifact = dataclasses.asdict(state.artifact)
        payload = artifact.pop("payload")
        if inline_payload:
            artifact["payload_b64"] = base64.b64encode(payload).decode("ascii")
        doc["artifact"] = artifact
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def decode(data: bytes, key: Key | None, now: float, *, where: str, digest: str | None = None) -> KeyState:
    """Parse a record written by :func:`encode`; anything else raises :class:`CorruptRecord`.

    ``where`` names the record's location (a path, a blob name) for the error message. The checks
    are :mod:`dibs.stores.decoder`'s, shared with every store; ``key`` and ``digest`` are as there.
    """
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:  # RecursionError: a hostile, deeply nested document
        raise decoder.corrupt(key, where, f"it is not JSON: {type(exc).__name__}") from None
    fields = flatten(doc)
    if isinstance(fields, str):
        raise decoder.corrupt(key, where, fields)
    payload = b""
    artifact = doc.get("artifact")
    if isinstance(artifact, dict) and "payload_b64" in artifact:
        encoded = artifact["payload_b64"]
        try:
            payload = base64.b64decode(encoded, validate=True) if isinstance(encoded, str) else b"\0"
        except ValueError:
            raise decoder.corrupt(key, where, "its artifact payload_b64 is not base64") from None
        if not isinstance(encoded, str):
            raise decoder.corrupt(key, where, f"its artifact payload_b64 is {encoded!r}, not a string")
    return decoder.decode(
        fields, key, now, where=where, digest=digest, expected_format=FORMAT, payload=payload
    )


_SECTIONS = {
    "lease": {
        "owner": "lease_owner",
        "fence": "lease_fence",
        "lease_id": "lease_id",
        "acquired_at": "lease_acquired_at",
        "expires_at": "lease_expires_at",
        "ttl": "lease_ttl",
        "attempt": "lease_attempt",
        "max_expires_at": "lease_max_expires_at",
    },
    "failure": {
        "count": "failure_count",
        "error": "failure_error",
        "owner": "failure_owner",
        "at": "failure_at",
    },
    "artifact": {
        "serializer": "artifact_serializer",
        "size": "artifact_size",
        "checksum": "artifact_checksum",
        "producer": "artifact_producer",
        "fence": "artifact_fence",
        "created_at": "artifact_created_at",
        "compute_seconds": "artifact_compute_seconds",
    },
}


def flatten(doc: Any) -> dict[str, Any] | str:
    """The document's fields under :data:`dibs.stores.decoder.FIELDS` names, or why it has none.

    A section (``lease``, ``failure``, ``artifact``) is ``null`` when absent; one that is present must
    be an object with its fields (the decoder names the first one missing), never an empty stand-in.
    """
    if not isinstance(doc, dict):
        return f"it is a JSON {type(doc).__name__}, not an object"
    fields: dict[str, Any] = {
        name: doc.get(name) for name in ("format", "namespace", "name", "fence", "attempts")
    }
    for section, names in _SECTIONS.items():
        raw = doc.get(section)
        if raw is None:
            continue
        if not isinstance(raw, dict):
            return f"its {section} is a {type(raw).__name__}, not an object"
        if all(raw.get(field) is None for field in names):
            return f"its {section} is an object without any of its fields"
        for field, flat in names.items():
            fields[flat] = raw.get(field)
    return fields

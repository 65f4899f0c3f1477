"""The JSON form of a key's record, for stores that keep one document per key (files, blobs, Redis).

The document names its format, so a foreign or damaged record is recognised and reported as
:class:`~dibs.errors.CorruptRecord` instead of being misread or overwritten. Payloads are not part of
the document unless a store asks for them inline (base64); large artifacts live beside it.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from typing import Any

from dibs.errors import CorruptRecord
from dibs.keys import Key
from dibs.records import ArtifactRecord, FailureRecord, KeyState, LeaseRecord, LeaseToken

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


def decode(data: bytes, key: Key, now: float, *, where: str) -> KeyState:
    """Parse a record written by :func:`encode`; anything else raises :class:`CorruptRecord`.

    ``where`` names the record's location (a path, a blob name) for the error message.
    """
    try:
        doc = json.loads(data)
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
            raise ValueError(f"format is {found!r}, expected {FORMAT!r}")
        if (doc["namespace"], doc["name"]) != (key.namespace, key.name):
            raise ValueError(f"it belongs to key {doc['namespace']}/{doc['name']}")
        lease = None
        if doc["lease"] is not None:
            raw = doc["lease"]
            lease = LeaseRecord(
                key=key,
                owner=str(raw["owner"]),
                token=LeaseToken(int(raw["fence"]), str(raw["lease_id"])),
                acquired_at=float(raw["acquired_at"]),
                expires_at=float(raw["expires_at"]),
                ttl=float(raw["ttl"]),
                attempt=int(raw["attempt"]),
                max_expires_at=None if raw["max_expires_at"] is None else float(raw["max_expires_at"]),
            )
        failure = None
        if doc["failure"] is not None:
            raw = doc["failure"]
            failure = FailureRecord(
                count=int(raw["count"]), error=str(raw["error"]), owner=str(raw["owner"]), at=float(raw["at"])
            )
        artifact = None
        if doc["artifact"] is not None:
            raw = doc["artifact"]
            payload = base64.b64decode(raw["payload_b64"], validate=True) if "payload_b64" in raw else b""
            artifact = ArtifactRecord(
                serializer=str(raw["serializer"]),
                payload=payload,
                size=int(raw["size"]),
                checksum=str(raw["checksum"]),
                producer=str(raw["producer"]),
                fence=int(raw["fence"]),
                created_at=float(raw["created_at"]),
            )
        return KeyState(
            key=key,
            now=now,
            fence=int(doc["fence"]),
            attempts=int(doc["attempts"]),
            lease=lease,
            artifact=artifact,
            failure=failure,
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptRecord(
            f"the record of {key} at {where} is not a dibs record ({exc}); it was left untouched: "
            "inspect or delete it by hand",
            key=str(key),
        ) from exc

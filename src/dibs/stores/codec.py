"""The JSON form of a key's record, for stores that keep one document per key (files, blobs, Redis).

The document names its format, so a foreign or damaged record is recognised and reported as
:class:`~dibs.errors.CorruptRecord` instead of being misread or overwritten. Payloads are not part of
the document unless a store asks for them inline (base64); large artifacts live beside it.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
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
            raw = _section(doc, "lease")
            lease = LeaseRecord(
                key=key,
                owner=_str(raw, "owner"),
                token=LeaseToken(_int(raw, "fence"), _str(raw, "lease_id")),
                acquired_at=_seconds(raw, "acquired_at"),
                expires_at=_seconds(raw, "expires_at"),
                ttl=_seconds(raw, "ttl"),
                attempt=_int(raw, "attempt"),
                max_expires_at=None if raw["max_expires_at"] is None else _seconds(raw, "max_expires_at"),
            )
        failure = None
        if doc["failure"] is not None:
            raw = _section(doc, "failure")
            failure = FailureRecord(
                count=_int(raw, "count"),
                error=_str(raw, "error"),
                owner=_str(raw, "owner"),
                at=_seconds(raw, "at"),
            )
        artifact = None
        if doc["artifact"] is not None:
            raw = _section(doc, "artifact")
            payload = (
                base64.b64decode(_str(raw, "payload_b64"), validate=True) if "payload_b64" in raw else b""
            )
            artifact = ArtifactRecord(
                serializer=_str(raw, "serializer"),
                payload=payload,
                size=_int(raw, "size"),
                checksum=_str(raw, "checksum"),
                producer=_str(raw, "producer"),
                fence=_int(raw, "fence"),
                created_at=_seconds(raw, "created_at"),
            )
        return KeyState(
            key=key,
            now=now,
            fence=_int(doc, "fence"),
            attempts=_int(doc, "attempts"),
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


# Strict field readers: ``str(None)`` or ``int(1.5)`` would turn a damaged or foreign record into a
# plausible one (a lease owned by "None", a fence rounded down), which dibs would then act on and
# overwrite. A field of the wrong type makes the whole record corrupt instead.


def _section(doc: dict[str, Any], name: str) -> dict[str, Any]:
    value = doc[name]
    if not isinstance(value, dict):
        raise TypeError(f"its {name} is a {type(value).__name__}, not an object")
    return value


def _str(doc: dict[str, Any], name: str) -> str:
    value = doc[name]
    if not isinstance(value, str):
        raise TypeError(f"its {name} is {value!r}, not a string")
    return value


def _int(doc: dict[str, Any], name: str) -> int:
    value = doc[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"its {name} is {value!r}, not an integer")
    return value


def _seconds(doc: dict[str, Any], name: str) -> float:
    value = doc[name]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TypeError(f"its {name} is {value!r}, not a finite number of seconds")
    return float(value)

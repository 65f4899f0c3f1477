"""The small record that stands for a large artifact: ``(uri, sha256, size, serializer)``, or
``(uri, blake3, size, serializer)`` for a payload named by BLAKE3 (its own key, so that a reader that
knows only SHA-256 finds no digest it could mistake, and an old reference reads as it always did).

A reference is an artifact like any other to the record store: its serializer is :data:`REFERENCE`,
its payload a short JSON document, and its checksum **the payload's** digest (not the document's;
``sha256:<hex>`` or ``blake3:<hex>``),
so listings, which carry no payloads, still say which payload each record refers to (what the
collector needs), and a holder that re-reads its key after a lost reply recognises its own artifact
by the checksum it computed. The record store's fenced ``complete`` publishes it, so a fenced-out
holder's reference is never published, whatever the payload store holds.
"""

from __future__ import annotations

import json
import re

from dibs.errors import ArtifactCorrupted
from dibs.payloads.base import Payload, address, split_address

__all__ = ["REFERENCE", "decode", "encode"]

#: The serializer name of a reference record.
REFERENCE = "dibs-ref"

_SHA256 = re.compile(r"[0-9a-f]{64}")
#: The keys a reference may name its payload's digest by, one per digest function.
_DIGEST_KEYS = ("sha256", "blake3")


def encode(payload: Payload, uri: str) -> bytes:
    digest, hexdigest = split_address(payload.sha256)
    doc = {
        "v": 1,
        "uri": uri,
        digest: hexdigest,
        "size": payload.size,
        "serializer": payload.serializer,
    }
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def decode(document: bytes, where: str) -> tuple[Payload, str]:
    """The payload a reference names, and its URI; :class:`ArtifactCorrupted` naming ``where`` if the
    document is not a reference this dibs writes."""
    try:
        doc = json.loads(document)
        named = [key for key in _DIGEST_KEYS if key in doc]
        if len(named) != 1:
            raise KeyError("one of " + ", ".join(_DIGEST_KEYS))
        digest = named[0]
        sha256, size, serializer, uri = doc[digest], doc["size"], doc["serializer"], doc["uri"]
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ArtifactCorrupted(f"{where}: the payload reference cannot be read ({exc!r})") from None
    if (
        doc.get("v") != 1
        or not isinstance(sha256, str)
        or not _SHA256.fullmatch(sha256)
        or isinstance(size, bool)
        or not isinstance(size, int)
        or size < 0
        or not isinstance(serializer, str)
        or not isinstance(uri, str)
    ):
        raise ArtifactCorrupted(f"{where}: the payload reference is not one this dibs writes: {doc!r:.200}")
    if serializer == REFERENCE:  # a payload is a value's bytes, never another reference
        raise ArtifactCorrupted(
            f"{where}: the payload reference names another reference, which dibs never writes"
        )
    return Payload(address(digest, sha256), size, serializer), uri

"""How values become artifact bytes, and back.

Artifacts come from a shared store, so reading one must never run code: JSON is the default, raw bytes
are available, and pickle is opt-in *and* signed (HMAC-SHA256 with a key the user supplies), so that
somebody with write access to the store cannot make readers unpickle their payload.

Every artifact records the name of the serializer that wrote it; a reader refuses a payload written by
a different serializer instead of guessing.

What protects what:

* the artifact's **checksum** (SHA-256 of the payload, kept in the record) protects against
  *accidental* corruption: a truncated upload, bit rot, a half-restored backup. It is no defence
  against tampering: whoever can write the payload can write a matching checksum;
* the pickle **signature** (HMAC-SHA256 under the signing key) protects against *tampering* by
  anyone with write access to the store but not the key. It covers the payload *and* where it
  belongs, the key's digest and the lease's fencing token (:func:`artifact_context`), so a signed
  artifact copied to another key, or to another fence of its key, is refused before unpickling. It
  does not stop such a writer from deleting artifacts or putting back an earlier artifact of the
  same key at its original fence, and JSON and bytes artifacts carry no signature at all: their
  readers run no code, but trust the store for the value.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import pickle
import re
import sys
from typing import Any, Protocol, runtime_checkable

from dibs.errors import ArtifactCorrupted, ConfigurationError, SerializationError
from dibs.keys import Key

__all__ = [
    "BytesSerializer",
    "JSONSerializer",
    "Serializer",
    "SignedPickleSerializer",
    "artifact_context",
    "dump_artifact",
    "load_artifact",
    "resolve_serializer",
]


@runtime_checkable
class Serializer(Protocol):
    """Turns a value into bytes and back. ``name`` is stored with every artifact."""

    name: str

    def dumps(self, value: Any) -> bytes: ...

    def loads(self, payload: bytes) -> Any: ...


#: ``json.dumps(value, separators=(",", ":"), sort_keys=True, allow_nan=False)``'s encoder, built once
#: (``dumps`` with options builds one per call); it keeps no state between calls.
_JSON = json.JSONEncoder(separators=(",", ":"), sort_keys=True, allow_nan=False)


class JSONSerializer:
    """Compact, key-sorted JSON: readable with any tool, shared across languages and orchestrators."""

    name = "json"

    def dumps(self, value: Any) -> bytes:
        try:
            return _JSON.encode(value).encode()
        except RecursionError:
            raise SerializationError(
                f"cannot store a {type(value).__name__} as JSON: it is nested deeper than Python's recursion "
                f"limit ({sys.getrecursionlimit()}); flatten it, or store it with serializer='bytes'",
                value_type=type(value).__name__,
            ) from None
        except (TypeError, ValueError) as exc:
            raise SerializationError(
                f"cannot store a {type(value).__name__} as JSON ({exc}); return JSON-like data "
                "(dict, list, str, numbers, bool, None), or choose serializer='bytes' or a signed pickle",
                value_type=type(value).__name__,
            ) from exc

    def loads(self, payload: bytes) -> Any:
        text = _plain_string(payload)
        if text is not None:
            return text
        try:
            return json.loads(payload)
        except (ValueError, UnicodeDecodeError) as exc:
            raise SerializationError(f"stored JSON artifact cannot be decoded: {exc}") from exc
        except RecursionError:
            raise SerializationError(
                "stored JSON artifact cannot be decoded: it is nested deeper than Python's recursion limit"
            ) from None


#: What ends a JSON string or needs decoding inside one: a quote, a backslash, a control character.
_NOT_PLAIN = re.compile(rb'["\\\x00-\x1f]')
#: From this size a JSON document that is one string is read by :func:`_plain_string`.
_PLAIN_FROM = 64 * 1024


def _plain_string(payload: bytes) -> str | None:
    """The value of a large JSON document that is one string without escapes (``"..."``, what
    :class:`JSONSerializer` writes for a text of printable characters), read straight from the bytes
    between its quotes; ``None`` for anything else (decoded by :func:`json.loads`).

    ``json.loads`` first decodes the whole document into a text, then copies the string out of it: a
    large text value cost three times its size at once (the stored bytes, that text, the value).
    Here: the stored bytes and the value. The same value as ``json.loads`` gives, or ``None``."""
    if len(payload) < _PLAIN_FROM or payload[:1] != b'"' or payload[-1:] != b'"':
        return None
    if _NOT_PLAIN.search(payload, 1, len(payload) - 1) is not None:
        return None
    try:
        return str(memoryview(payload)[1:-1], "utf-8")
    except UnicodeDecodeError:
        return None  # json.loads says why


class BytesSerializer:
    """Bytes stored as they are: for files, Parquet buffers, or an artifact's own URI."""

    name = "bytes"

    def dumps(self, value: Any) -> bytes:
        if isinstance(value, bytes | bytearray | memoryview):
            return bytes(value)
        raise SerializationError(
            f"the 'bytes' serializer stores bytes, got {type(value).__name__}; "
            "encode the value first or use serializer='json'",
            value_type=type(value).__name__,
        )

    def loads(self, payload: bytes) -> Any:
        return payload


class SignedPickleSerializer:
    """Pickle with an HMAC-SHA256 signature checked *before* unpickling.

    A payload without a valid signature is refused and never unpickled, so a store's write access
    cannot become code execution on readers. All processes sharing the artifacts need the same key.

    The signature covers ``context`` too: dibs passes :func:`artifact_context` (the key's digest and
    the fence), so a signed payload is only accepted where it was written. Signatures made before
    this binding (dibs 0.1) are refused; ``dibs forget`` such keys to recompute them.
    """

    name = "pickle-hmac-sha256"
    binds_context = True
    _DIGEST_SIZE = 32

    def __init__(self, signing_key: bytes | str) -> None:
        key = signing_key.encode() if isinstance(signing_key, str) else bytes(signing_key)
        if len(key) < 16:
            raise ConfigurationError(
                f"a pickle signing key must be at least 16 bytes long, got {len(key)}; "
                "use e.g. secrets.token_hex(32) and share it through your secrets manager"
            )
        self._key = key

    def __repr__(self) -> str:  # never show the key
        return "SignedPickleSerializer(signing_key=***)"

    def _mac(self, context: bytes, body: bytes) -> bytes:
        # Length-prefixed, so no (context, body) pair can be re-split into another one.
        framed = len(context).to_bytes(8, "big") + context + body
        return hmac.new(self._key, framed, hashlib.sha256).digest()

    def dumps(self, value: Any, context: bytes = b"") -> bytes:
        try:
            body = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except RecursionError:
            raise SerializationError(
                f"cannot pickle a {type(value).__name__}: it is nested deeper than Python's recursion limit"
            ) from None
        except Exception as exc:
            raise SerializationError(f"cannot pickle a {type(value).__name__}: {exc}") from exc
        return self._mac(context, body) + body

    def loads(self, payload: bytes, context: bytes = b"") -> Any:
        signature, body = payload[: self._DIGEST_SIZE], payload[self._DIGEST_SIZE :]
        expected = self._mac(context, body)
        if len(signature) != self._DIGEST_SIZE or not hmac.compare_digest(signature, expected):
            raise ArtifactCorrupted(
                "pickled artifact has no valid signature for this signing key at this place; it was NOT "
                "unpickled (the writer used another signing key, the payload was tampered with, it was "
                "copied from another key or fence, or an older dibs signed it: 'dibs forget' the key)"
            )
        return pickle.loads(body)


def artifact_context(key: Key, fence: int) -> bytes:
    """Where an artifact belongs, as the bytes a signature binds: the key's digest and the fence."""
    return f"dibs.artifact/1\x00{key.digest}\x00{fence}".encode()


def dump_artifact(serializer: Serializer, value: Any, key: Key, fence: int) -> bytes:
    """``value`` as the artifact of ``key`` under ``fence``: serializers that sign (``binds_context``)
    bind the signature to that place; others just serialize."""
    if getattr(serializer, "binds_context", False):
        return bytes(serializer.dumps(value, context=artifact_context(key, fence)))  # type: ignore[call-arg]
    return serializer.dumps(value)


def load_artifact(serializer: Serializer, payload: bytes, key: Key, fence: int) -> Any:
    """The value of the artifact of ``key`` stored under ``fence`` (see :func:`dump_artifact`)."""
    if getattr(serializer, "binds_context", False):
        return serializer.loads(payload, context=artifact_context(key, fence))  # type: ignore[call-arg]
    return serializer.loads(payload)


def resolve_serializer(
    serializer: Serializer | str | None, *, signing_key: bytes | str | None = None
) -> Serializer:
    """A serializer from an object, a name (``"json"``, ``"bytes"``, ``"pickle"``), or ``None`` (JSON)."""
    if serializer is None or serializer == "json":
        return JSONSerializer()
    if serializer == "bytes":
        return BytesSerializer()
    if serializer in {"pickle", SignedPickleSerializer.name}:
        if signing_key is None:
            raise ConfigurationError(
                "serializer='pickle' needs signing_key=...: unsigned pickles from a shared store would let "
                "anyone with write access run code in every reader"
            )
        return SignedPickleSerializer(signing_key)
    if isinstance(serializer, str):
        raise ConfigurationError(
            f"unknown serializer {serializer!r}; use 'json' (default), 'bytes', 'pickle' (with "
            "signing_key=...) or an object with name/dumps/loads"
        )
    if not isinstance(serializer, Serializer):
        raise ConfigurationError(
            f"serializer {serializer!r} lacks name/dumps/loads; "
            "pass 'json', 'bytes', 'pickle' or such an object"
        )
    return serializer

"""How values become artifact bytes, and back.

Artifacts come from a shared store, so reading one must never run code: JSON is the default, raw bytes
are available, and pickle is opt-in *and* signed (HMAC-SHA256 with a key the user supplies), so that
somebody with write access to the store cannot make readers unpickle their payload.

Every artifact records the name of the serializer that wrote it; a reader refuses a payload written by
a different serializer instead of guessing.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import pickle
import sys
from typing import Any, Protocol, runtime_checkable

from dibs.errors import ArtifactCorrupted, ConfigurationError, SerializationError

__all__ = ["BytesSerializer", "JSONSerializer", "Serializer", "SignedPickleSerializer", "resolve_serializer"]


@runtime_checkable
class Serializer(Protocol):
    """Turns a value into bytes and back. ``name`` is stored with every artifact."""

    name: str

    def dumps(self, value: Any) -> bytes: ...

    def loads(self, payload: bytes) -> Any: ...


class JSONSerializer:
    """Compact, key-sorted JSON: readable with any tool, shared across languages and orchestrators."""

    name = "json"

    def dumps(self, value: Any) -> bytes:
        try:
            return json.dumps(value, separators=(",", ":"), sort_keys=True, allow_nan=False).encode()
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
        try:
            return json.loads(payload)
        except (ValueError, UnicodeDecodeError) as exc:
            raise SerializationError(f"stored JSON artifact cannot be decoded: {exc}") from exc
        except RecursionError:
            raise SerializationError(
                "stored JSON artifact cannot be decoded: it is nested deeper than Python's recursion limit"
            ) from None


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
    """

    name = "pickle-hmac-sha256"
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

    def dumps(self, value: Any) -> bytes:
        try:
            body = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except RecursionError:
            raise SerializationError(
                f"cannot pickle a {type(value).__name__}: it is nested deeper than Python's recursion limit"
            ) from None
        except Exception as exc:
            raise SerializationError(f"cannot pickle a {type(value).__name__}: {exc}") from exc
        return hmac.new(self._key, body, hashlib.sha256).digest() + body

    def loads(self, payload: bytes) -> Any:
        signature, body = payload[: self._DIGEST_SIZE], payload[self._DIGEST_SIZE :]
        expected = hmac.new(self._key, body, hashlib.sha256).digest()
        if len(signature) != self._DIGEST_SIZE or not hmac.compare_digest(signature, expected):
            raise ArtifactCorrupted(
                "pickled artifact has no valid signature for this signing key; it was NOT unpickled "
                "(the writer used another key, or the payload was tampered with)"
            )
        return pickle.loads(body)


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

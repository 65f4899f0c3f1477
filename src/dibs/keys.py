"""Keys: what one cacheable computation is called, and how to derive that name from a call.

A key is a *namespace* (dotted simple words, e.g. ``team.features``) plus a *name* (any printable
string up to 1,024 characters). Stores never use either as a path: they address records by
:attr:`Key.digest`, a SHA-256 of both, so no key can traverse a directory or a blob prefix.

Derived keys read ``qualname[@version]/<digest>``: the function's name, the version the caller gives,
and a digest of the function's identity (:mod:`dibs.identity`) and of its arguments. The digest is
canonical (argument order, keyword vs positional, dict order and default values do not change it),
so two processes that make the same call agree on the key without talking to each other, wherever
the code runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import re
import unicodedata
from collections.abc import Callable, Mapping
from typing import Any

from dibs.canonical import canonical_json
from dibs.errors import ConfigurationError, InvalidKey
from dibs.identity import code_identity, qualified_name

__all__ = [
    "DERIVED_DIGEST_LENGTH",
    "MAX_NAMESPACE_LENGTH",
    "MAX_NAME_LENGTH",
    "MAX_OWNER_LENGTH",
    "Key",
    "canonical_json",
    "derive_key",
    "digest",
    "format_key",
    "qualified_name",
    "validate_namespace",
    "validate_owner",
]

MAX_NAME_LENGTH = 1024
MAX_NAMESPACE_LENGTH = 200
#: Owners are logical identities (Airflow: dag_id/run_id/task_id/map_index, under 800 characters).
MAX_OWNER_LENGTH = 2048
_NAMESPACE_WORD = r"[A-Za-z0-9_][A-Za-z0-9_-]{0,62}"
_NAMESPACE_RE = re.compile(rf"{_NAMESPACE_WORD}(?:\.{_NAMESPACE_WORD})*")


def validate_namespace(namespace: object) -> str:
    """Return ``namespace`` if it is valid, else raise :class:`InvalidKey` saying what would be right."""
    if not isinstance(namespace, str):
        raise InvalidKey(
            f"namespace must be a string, got {type(namespace).__name__} {namespace!r}",
            namespace=repr(namespace),
        )
    if len(namespace) > MAX_NAMESPACE_LENGTH or not _NAMESPACE_RE.fullmatch(namespace):
        raise InvalidKey(
            f"invalid namespace {namespace!r}: use dot-separated words of letters, digits, '_' and '-' "
            f"(for example 'team.features'), at most {MAX_NAMESPACE_LENGTH} characters",
            namespace=namespace,
        )
    return namespace


def validate_name(name: object) -> str:
    """Return ``name`` if it is a valid key name, else raise :class:`InvalidKey`."""
    if not isinstance(name, str):
        raise InvalidKey(f"key name must be a string, got {type(name).__name__} {name!r}", name=repr(name))
    if not name:
        raise InvalidKey("key name must not be empty", name=name)
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidKey(
            f"key name is {len(name)} characters long; at most {MAX_NAME_LENGTH} are allowed "
            f"(digest long inputs with dibs.digest()): {name[:60]!r}...",
            name=name[:60],
        )
    bad = None if name.isprintable() else next(ch for ch in name if not ch.isprintable())
    if bad is not None:
        raise InvalidKey(
            f"key name {name!r} contains the non-printable character {bad!r}; "
            "use printable characters only (digest binary inputs with dibs.digest())",
            name=name,
        )
    return name


def validate_owner(owner: object) -> str:
    """Return ``owner`` if dibs may store it as a lease's owner, else raise :class:`ConfigurationError`.

    An owner is written into the record and shown by ``dibs ls``/``show`` and in logs, so it must be
    a non-empty string of printable characters (no NUL, no control characters or escape sequences,
    no bidirectional overrides), at most :data:`MAX_OWNER_LENGTH` long. Anything else would either
    make the record unreadable for every other client (a number where text belongs) or let an owner
    rewrite a terminal.
    """
    if not isinstance(owner, str):
        raise ConfigurationError(
            f"owner must be a string, got {type(owner).__name__} {owner!r:.60}", setting="owner"
        )
    if not owner:
        raise ConfigurationError("owner must not be empty", setting="owner")
    if len(owner) > MAX_OWNER_LENGTH:
        raise ConfigurationError(
            f"owner is {len(owner)} characters long; at most {MAX_OWNER_LENGTH} are allowed: "
            f"{owner[:60]!r}...",
            setting="owner",
        )
    # One C call for the whole text (a character by character look cost ~2 µs a reservation); the
    # look only finds which character to name.
    bad = None if owner.isprintable() else next(ch for ch in owner if not ch.isprintable())
    if bad is not None:
        raise ConfigurationError(
            f"owner {owner!r:.100} contains the non-printable character {bad!r}; "
            "use printable characters only",
            setting="owner",
        )
    return owner


@dataclasses.dataclass(frozen=True, order=True)
class Key:
    """A validated namespace + name. Construct it directly or with :meth:`parse`.

    The name is kept in Unicode normalization form C (NFC): ``"café"`` typed with a combining accent
    (NFD, as macOS file names and some keyboards give it) and with the precomposed ``é`` look the same
    and must be the same key, so they are (issue 16, item 11). Namespaces are ASCII: nothing to do.
    """

    namespace: str
    name: str

    def __post_init__(self) -> None:
        validate_namespace(self.namespace)
        if isinstance(self.name, str):  # before the checks: NFC may change the length
            object.__setattr__(self, "name", unicodedata.normalize("NFC", self.name))
        validate_name(self.name)

    @classmethod
    def parse(cls, key: str | Key, namespace: str = "default") -> Key:
        """Accept a :class:`Key` as it is, or a bare name in ``namespace``.

        A ``/`` inside a name is just a character (``"s3://bucket/part-0"`` keeps its meaning), so
        the namespace is never parsed out of the name.
        """
        if isinstance(key, Key):
            return key
        return cls(namespace, key)

    @property
    def digest(self) -> str:
        """SHA-256 hex of namespace and name: the only form in which stores use a key as an address.

        Computed once per key object (a reserve-and-complete asked for it a dozen times); kept outside
        the fields, so equality, ordering, ``repr`` and ``dataclasses.replace`` are unaffected."""
        digest: str | None = self.__dict__.get("_digest")
        if digest is None:
            digest = self.__dict__["_digest"] = address(self.namespace, self.name)
        return digest

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def address(namespace: str, name: str) -> str:
    """The SHA-256 hex digest of ``namespace`` and ``name`` as given (a :class:`Key`'s :attr:`~Key.digest`).

    Exposed for the record decoder: a record written before names were NFC-normalized sits at the
    address of its name as it was written, which a :class:`Key` no longer computes.
    """
    return hashlib.sha256(f"{namespace}\x00{name}".encode()).hexdigest()


def digest(*values: Any, length: int = 32) -> str:
    """A stable hex digest of ``values`` (canonical JSON, SHA-256), ``length`` characters long."""
    if not 8 <= length <= 64:
        raise ValueError(f"digest length must be between 8 and 64 hex characters, got {length}")
    return hashlib.sha256(canonical_json(list(values)).encode()).hexdigest()[:length]


#: Hex characters of the digest in a derived key: 64 bits, readable, and collision-free in practice
#: among the calls of one function.
DERIVED_DIGEST_LENGTH = 16


def _bound_arguments(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)
    except (TypeError, ValueError):  # builtins without a signature, or a call that does not bind
        return {"args": list(args), "kwargs": dict(kwargs)}


def format_key(
    template: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> str:
    """``template`` with ``{argument}`` fields filled from the call, e.g. ``"features-{day}"``."""
    arguments = _bound_arguments(fn, args, kwargs)
    try:
        return template.format(**arguments)
    except (KeyError, IndexError, ValueError) as exc:
        raise InvalidKey(
            f"key template {template!r} does not fit the call of {qualified_name(fn)} ({exc!r}); "
            f"its fields must name parameters: {', '.join(arguments) or 'none'}",
            name=template,
        ) from exc


def derive_key(
    fn: Callable[..., Any],
    args: tuple[Any, ...] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    version: str | None = None,
    exclude: tuple[str, ...] = (),
) -> str:
    """The default key name of the call ``fn(*args, **kwargs)``: ``qualname[@version]/<digest>``.

    The digest covers the function's identity (:mod:`dibs.identity`: the shape of its source and what
    it closes over; with ``version`` the version replaces the source) and its arguments, bound to its
    signature with defaults applied, so ``f(1)``, ``f(x=1)`` and ``f()`` (when ``x=1`` is the default)
    share a key. Parameters named in ``exclude`` (clients, loggers, anything that does not change the
    result) are left out. The module is not part of the key: the same code shares wherever it runs.

    :raises InvalidKey: when the function or an argument cannot be digested (the message says what to do).
    """
    if version is not None and (not isinstance(version, str) or not version or "/" in version):
        raise InvalidKey(
            f"version must be a non-empty string without '/', got {version!r} (e.g. version='2')",
            name=repr(version),
        )
    arguments = _bound_arguments(fn, args, kwargs or {})
    for name in exclude:
        arguments.pop(name, None)
    identity = code_identity(fn, version=version)
    name = qualified_name(fn)
    try:
        digested = digest(identity, arguments, length=DERIVED_DIGEST_LENGTH)
    except TypeError as exc:
        raise InvalidKey(
            f"cannot derive a key for {name}: {exc}. Give the key yourself (key='...'), or list the "
            "argument in exclude= if it does not change the result",
            name=name,
        ) from exc
    return f"{name}@{version}/{digested}" if version is not None else f"{name}/{digested}"

"""The one strict reader of stored records: the same damage is the same :class:`CorruptRecord` everywhere.

Every store keeps a key's record in its own shape (a JSON document, an SQL row, a Redis hash) and
maps it onto the flat field names of :data:`FIELDS`, with ``None`` for an absent field; :func:`decode`
then applies one set of rules and builds the :class:`~dibs.records.KeyState`. So a lease without an
owner, a fence that is not an integer or a record stored under another key's address is refused in
the same words whichever store holds it, and never silently coerced into a plausible record (a lease
owned by ``"None"``, a fence rounded down) that dibs would then act on and overwrite.

The rules:

* identity: ``namespace`` and ``name`` form a valid :class:`~dibs.keys.Key`, the one asked for (or,
  when listing, the one whose digest is the record's address); ``format`` is the store's, if it has one;
* types: integers are integers (not bools, not floats), times are finite numbers, text is text.
  Stores whose values are all text (Redis) pass ``textual=True``: their numbers must then be written
  exactly as dibs writes them (canonical decimal integers, plain decimal or exponent floats);
* ranges: fences within a signed 64-bit integer (:data:`MAX_FENCE`), counters within a signed 32-bit
  one (:data:`MAX_COUNT`), times between 1970 and the end of the year 9999 (:data:`MAX_TIMESTAMP`,
  so every time can be shown as a date);
* groups: a lease, a failure and an artifact are each wholly present or wholly absent; a lease's
  fence is the record's fence, an artifact's fence is not above it, and a failure's count is 0 or
  more (0: only stops were recorded, which are not counted).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping

from dibs.errors import CorruptRecord, InvalidKey
from dibs.keys import Key, address
from dibs.records import (
    MAX_COUNT,
    MAX_FENCE,
    MAX_TIMESTAMP,
    ArtifactRecord,
    FailureRecord,
    KeyState,
    LeaseRecord,
    LeaseToken,
)

__all__ = ["FIELDS", "MAX_RECORD_BYTES", "corrupt", "decode", "granted_lease", "key_of", "stored_facts"]

LEASE_FIELDS = (
    "lease_owner",
    "lease_fence",
    "lease_id",
    "lease_acquired_at",
    "lease_expires_at",
    "lease_ttl",
    "lease_attempt",
)
OPTIONAL_LEASE_FIELDS = ("lease_max_expires_at",)
FAILURE_FIELDS = ("failure_count", "failure_error", "failure_owner", "failure_at")
ARTIFACT_FIELDS = (
    "artifact_serializer",
    "artifact_size",
    "artifact_checksum",
    "artifact_producer",
    "artifact_fence",
    "artifact_created_at",
)
#: Added later, so records written before it still read (``None``: unknown).
OPTIONAL_ARTIFACT_FIELDS = ("artifact_compute_seconds",)
#: Every field of a record, in the flat names stores map their native shape onto.
FIELDS = (
    "format",
    "namespace",
    "name",
    "fence",
    "attempts",
    *LEASE_FIELDS,
    *OPTIONAL_LEASE_FIELDS,
    *FAILURE_FIELDS,
    *ARTIFACT_FIELDS,
    *OPTIONAL_ARTIFACT_FIELDS,
)

#: A record is a few hundred bytes (a few kilobytes with a long key, owner and error); a store never
#: reads more than this of something that claims to be one.
MAX_RECORD_BYTES = 1024 * 1024

_CANONICAL_INT = re.compile(r"0|[1-9][0-9]*")
_PLAIN_FLOAT = re.compile(r"-?[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?")


class _Damage(ValueError):
    """Why a record is not one dibs wrote; becomes the reason in :class:`CorruptRecord`."""


def corrupt(key: Key | None, where: str, why: str) -> CorruptRecord:
    """The error for a record dibs cannot read, in the words every store uses."""
    whose = f"the record of {key} at {where}" if key is not None else f"the record at {where}"
    return CorruptRecord(
        f"{whose} is not a dibs record ({why}); it was left untouched: inspect or delete it by hand",
        key=None if key is None else str(key),
        record=where,
    )


def key_of(fields: Mapping[str, object], where: str, *, textual: bool = False) -> Key:
    """The key a record names (for listing, where the address is all that is known)."""
    try:
        return _key(fields, textual)
    except _Damage as exc:
        raise corrupt(None, where, str(exc)) from None


def decode(
    fields: Mapping[str, object],
    key: Key | None,
    now: float,
    *,
    where: str,
    digest: str | None = None,
    textual: bool = False,
    expected_format: str | None = None,
    payload: bytes = b"",
) -> KeyState:
    """The state a record's ``fields`` describe, or :class:`CorruptRecord` saying what is wrong.

    ``key`` is the key asked for (``None`` when listing); ``digest`` is the record's address when it
    was found by listing, which must be the digest of the key it names. ``payload`` is the
    artifact's bytes when the caller has them (they are checked later, against the checksum).
    """
    try:
        # The key asked for, when the record names it exactly (the usual case): no second Key to build
        # and validate (a few microseconds of every read). Any other names are parsed and compared.
        found = key if key is not None and _names(fields, textual) == (key.namespace, key.name) else None
        if found is None:
            found = _key(fields, textual)
        if key is not None and found != key:
            raise _Damage(f"it belongs to key {found}")
        # A record written before key names were NFC-normalized sits at its name's own address.
        if digest is not None and digest not in (found.digest, _written_address(fields, textual)):
            raise _Damage(f"it names key {found}, whose digest differs from the address it is stored at")
        key = found
        if expected_format is not None:
            value = _text(fields, "format", textual)
            if value != expected_format:
                raise _Damage(f"its format is {value!r}, expected {expected_format!r}")
        return _state(_Reader(fields, textual), key, now, payload)
    except _Damage as exc:
        raise corrupt(key, where, str(exc)) from None


def granted_lease(
    key: Key,
    owner: str,
    lease_id: str,
    ttl: float,
    fields: Mapping[str, object],
    *,
    where: Callable[[], str],
    textual: bool = False,
) -> LeaseRecord:
    """The lease a store just granted, from what the caller sent (``key``, ``owner``, ``lease_id``,
    ``ttl``) and what only the store knew, in ``fields``: ``fence``, ``attempts``,
    ``lease_acquired_at``, ``lease_expires_at`` and ``lease_max_expires_at``, each checked as
    :func:`decode` checks it (a :class:`CorruptRecord` naming ``where()`` if one is wrong). A store's
    short reply to a grant is read this way rather than by decoding back every field it was sent."""
    r = _Reader(fields, textual)
    try:
        fence = r.integer("fence", low=1, high=MAX_FENCE)
        max_expires_at = fields.get("lease_max_expires_at")
        return LeaseRecord(
            key=key,
            owner=owner,
            token=LeaseToken(fence, lease_id),
            acquired_at=r.seconds("lease_acquired_at"),
            expires_at=r.seconds("lease_expires_at"),
            ttl=ttl,
            attempt=r.integer("attempts"),
            max_expires_at=None if max_expires_at is None else r.seconds("lease_max_expires_at"),
        )
    except _Damage as exc:
        raise corrupt(key, where(), str(exc)) from None


def stored_facts(
    key: Key, fields: Mapping[str, object], *, where: Callable[[], str], textual: bool = False
) -> tuple[str, float, float | None]:
    """What a store's short reply to ``complete`` tells of the artifact it stored that the caller
    did not know: its ``artifact_producer``, ``artifact_created_at`` and
    ``artifact_compute_seconds`` (and the record's ``attempts``, checked), each checked as
    :func:`decode` checks it."""
    r = _Reader(fields, textual)
    try:
        r.integer("attempts")
        compute_seconds = fields.get("artifact_compute_seconds")
        return (
            r.text("artifact_producer"),
            r.seconds("artifact_created_at"),
            None if compute_seconds is None else r.seconds("artifact_compute_seconds"),
        )
    except _Damage as exc:
        raise corrupt(key, where(), str(exc)) from None


def _key(fields: Mapping[str, object], textual: bool) -> Key:
    namespace, name = _text(fields, "namespace", textual), _text(fields, "name", textual)
    try:
        return Key(namespace, name)
    except InvalidKey as exc:
        raise _Damage(f"it names an invalid key: {exc}") from None


def _names(fields: Mapping[str, object], textual: bool) -> tuple[str, str]:
    return _text(fields, "namespace", textual), _text(fields, "name", textual)


def _written_address(fields: Mapping[str, object], textual: bool) -> str:
    return address(_text(fields, "namespace", textual), _text(fields, "name", textual))


def _text(fields: Mapping[str, object], name: str, textual: bool) -> str:
    value = fields.get(name)
    if value is None:
        raise _Damage(f"its {name} is missing")
    if textual and isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise _Damage(f"its {name} is not UTF-8 text") from None
    if not isinstance(value, str):
        raise _Damage(f"its {name} is {value!r}, not a string")
    return value


#: The types of a textual field and of a number, as tuples: ``bytes | str`` would build a union per call.
_TEXTS = (bytes, str)
_NUMBERS = (int, float)


def _canonical_digits(text: bytes | str) -> bool:
    """Whether ``text`` is an integer as dibs writes it (``_CANONICAL_INT``), without a regex: ASCII
    digits, no leading zero."""
    return text.isascii() and text.isdigit() and (len(text) == 1 or text[0] not in _ZEROS)


def _plain_decimal(text: bytes | str) -> bool:
    """Whether ``text`` is digits with at most one point, a digit first: the usual form of a time
    (``_PLAIN_FLOAT`` accepts it, and more: those take the regex)."""
    if not (text.isascii() and text[:1].isdigit()):
        return False
    bare = text.replace(b".", b"", 1) if isinstance(text, bytes) else text.replace(".", "", 1)
    return bare.isdigit()


#: The first character of a leading zero, in bytes (an int) and in text: never a bytes compared with a str.
_ZEROS = (ord("0"), "0")


class _Reader:
    """Typed, range-checked access to one record's fields."""

    def __init__(self, fields: Mapping[str, object], textual: bool) -> None:
        self.fields = fields
        self.textual = textual

    def present(self, names: tuple[str, ...]) -> bool:
        """Whether a group is there; ``_Damage`` if only part of it is."""
        get = self.fields.get
        there = 0
        for name in names:  # a loop, not a list: every read checks three groups
            if get(name) is not None:
                there += 1
        if there and there != len(names):
            missing = next(name for name in names if get(name) is None)
            raise _Damage(f"its {missing} is missing")
        return there > 0

    def text(self, name: str, *, empty: bool = False) -> str:
        value = _text(self.fields, name, self.textual)
        if not value and not empty:
            raise _Damage(f"its {name} is empty")
        return value

    def _number(
        self, name: str, pattern: re.Pattern[str], parse: Callable[[str], object], what: str
    ) -> object:
        """The field's value; a textual store's text must be the number exactly as dibs writes it."""
        value = self.fields.get(name)
        if value is None:
            raise _Damage(f"its {name} is missing")
        if self.textual and isinstance(value, _TEXTS):
            text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
            if not pattern.fullmatch(text):
                raise _Damage(f"its {name} is {text[:40]!r}, not {what} as dibs writes it")
            return parse(text)
        return value

    def integer(self, name: str, *, low: int = 0, high: int = MAX_COUNT) -> int:
        # The usual cases first, each exactly what the checks of _integer accept: an SQL integer, or
        # a textual store's canonical decimal. The rest, and every refusal, take those checks (a
        # read decodes about fifteen numbers).
        value = self.fields.get(name)
        if type(value) is int:
            if low <= value <= high:
                return value
        elif self.textual and isinstance(value, _TEXTS) and _canonical_digits(value):
            number = int(value)
            if low <= number <= high:
                return number
        return self._integer(name, low, high)

    def _integer(self, name: str, low: int, high: int) -> int:
        value = self._number(name, _CANONICAL_INT, int, "an integer")
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Damage(f"its {name} is {value!r}, not an integer")
        if not low <= value <= high:
            raise _Damage(f"its {name} is {value}, outside {low}..{high}")
        return value

    def seconds(self, name: str) -> float:
        # As in integer: an SQL number, or a textual store's plain decimal, in range, read at once;
        # anything else (NaN and infinities fail the range) takes the checks of _seconds.
        value = self.fields.get(name)
        if type(value) is float or type(value) is int:
            if 0 <= value <= MAX_TIMESTAMP:
                return float(value)
        elif self.textual and isinstance(value, _TEXTS) and _plain_decimal(value):
            number = float(value)
            if 0 <= number <= MAX_TIMESTAMP:
                return number
        return self._seconds(name)

    def _seconds(self, name: str) -> float:
        value = self._number(name, _PLAIN_FLOAT, float, "a number of seconds")
        if isinstance(value, bool) or not isinstance(value, _NUMBERS) or not math.isfinite(value):
            raise _Damage(f"its {name} is {value!r}, not a finite number of seconds")
        if not 0 <= value <= MAX_TIMESTAMP:
            raise _Damage(f"its {name} is {value!r}, outside 0..{MAX_TIMESTAMP:.0f} (the year 9999)")
        return float(value)


def _state(r: _Reader, key: Key, now: float, payload: bytes) -> KeyState:
    fence = r.integer("fence", high=MAX_FENCE)
    lease = None
    if r.present(LEASE_FIELDS):
        lease_fence = r.integer("lease_fence", low=1, high=MAX_FENCE)
        if lease_fence != fence:
            raise _Damage(f"its lease_fence {lease_fence} is not its fence {fence}")
        max_expires_at = r.fields.get("lease_max_expires_at")
        lease = LeaseRecord(
            key=key,
            owner=r.text("lease_owner"),
            token=LeaseToken(lease_fence, r.text("lease_id")),
            acquired_at=r.seconds("lease_acquired_at"),
            expires_at=r.seconds("lease_expires_at"),
            ttl=r.seconds("lease_ttl"),
            attempt=r.integer("lease_attempt"),
            max_expires_at=None if max_expires_at is None else r.seconds("lease_max_expires_at"),
        )
    elif r.fields.get("lease_max_expires_at") is not None:
        raise _Damage("its lease_max_expires_at is set without a lease")
    failure = None
    if r.present(FAILURE_FIELDS):
        failure = FailureRecord(
            count=r.integer("failure_count", low=0),
            error=r.text("failure_error", empty=True),
            owner=r.text("failure_owner"),
            at=r.seconds("failure_at"),
        )
    artifact = None
    if r.present(ARTIFACT_FIELDS):
        artifact_fence = r.integer("artifact_fence", low=1, high=MAX_FENCE)
        if artifact_fence > fence:
            raise _Damage(f"its artifact_fence {artifact_fence} is above its fence {fence}")
        artifact = ArtifactRecord(
            serializer=r.text("artifact_serializer"),
            payload=bytes(payload),
            size=r.integer("artifact_size", high=MAX_FENCE),
            checksum=r.text("artifact_checksum"),
            producer=r.text("artifact_producer"),
            fence=artifact_fence,
            created_at=r.seconds("artifact_created_at"),
            compute_seconds=(
                None
                if r.fields.get("artifact_compute_seconds") is None
                else r.seconds("artifact_compute_seconds")
            ),
        )
    return KeyState(
        key=key,
        now=now,
        fence=fence,
        attempts=r.integer("attempts"),
        lease=lease,
        artifact=artifact,
        failure=failure,
    )

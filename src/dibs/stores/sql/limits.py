"""How large an artifact each database takes, known before anything is sent, and how long a call
that sends one may wait for the server.

A value too large for the database is refused before it is sent (:class:`~dibs.errors.ArtifactTooLarge`,
see :func:`dibs.stores.base.refuse_too_large`): sent, it made the server drop the connection, which
looked like a network failure, and the client re-sent it for a whole ttl.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dibs.keys import Key
from dibs.stores.base import refuse_too_large

__all__ = ["BYTES_PER_SECOND", "POSTGRES_MAX_BYTEA", "SizeLimits"]

#: The slowest transfer a ``complete`` is allowed: its bound grows by a second per this many bytes.
BYTES_PER_SECOND = 1024 * 1024  # a slow link: a generous bound, never a cut of a healthy write
#: PostgreSQL's largest ``bytea`` value (1 GB less its 4-byte header): the payload's limit there.
POSTGRES_MAX_BYTEA = 0x3FFFFFFF - 4
#: What a row holds besides the payload and the texts complete writes (numbers, digests, a failure).
_ROW_OVERHEAD = 16 * 1024
#: The longest text of a number a statement carries: an int64 takes up to 20 characters; PyMySQL
#: writes a float as its repr with ``e0`` appended when the repr has no exponent, up to 25 characters
#: (``-0.00012345678901234567e0``). An int longer than this counts as its own text.
_NUMBER_SIZE = 32
#: The int whose text is the longest one :data:`_NUMBER_SIZE` covers (a sign and 30 digits).
_NUMBER_LIMIT = 10**30


def others_size(values: Mapping[str, Any]) -> int:
    """An upper bound of the bytes the values of ``complete`` other than the payload take as text.

    Called on every ``complete``: only texts (owner, key, digests) vary in length, and an ASCII text's
    length is its size in UTF-8, so a plain ``str`` is not converted. A number counts as its longest
    text. Anything else (a ``str`` subclass such as a ``StrEnum`` namespace, which validation keeps,
    bytes, a ``Decimal``) counts as its encoded text, so the bound is never below the real size.
    """
    size = 0
    for name, value in values.items():
        if name == "p_payload":
            continue
        kind = type(value)
        if kind is str:
            size += len(value) if value.isascii() else len(value.encode())
        elif value is None or kind is bool or kind is float:
            size += _NUMBER_SIZE
        elif kind is int:
            size += _NUMBER_SIZE if -_NUMBER_LIMIT < value < _NUMBER_LIMIT else len(str(value))
        elif isinstance(value, str):
            size += len(value.encode())
        elif isinstance(value, (bytes, bytearray, memoryview)):
            size += memoryview(value).nbytes
        else:
            size += len(str(value).encode())
    return size


# The bytes older PyMySQL (and mysqlclient) write as two when they inline bytes as an escaped string.
_MYSQL_ESCAPED = (b"\0", b"\\", b"\n", b"\r", b"\x1a", b"'", b'"')


class SizeLimits:
    """One store's limits on what ``complete`` sends: the database's own (read from the server once,
    where it has one of its own) and the URL's ``?max_artifact_size=``."""

    def __init__(self, dialect: str, url: str, max_artifact_size: int | None) -> None:
        self.dialect, self.url, self.max_artifact_size = dialect, url, max_artifact_size
        self._max_packet: int | None = None  # MySQL's max_allowed_packet, read on the first complete
        self._hex_literals: bool | None = None  # how the MySQL driver writes bytes (see _literal_size)

    @staticmethod
    def bound_for(timeout: float, size: int) -> float:
        """How long a call that sends ``size`` bytes may wait for the server (see :mod:`dibs.stores.sql`)."""
        return timeout + size / BYTES_PER_SECOND

    def check(self, cursor: Any, key: Key, values: Mapping[str, Any], statement: str) -> None:
        """Refuse (with :class:`ArtifactTooLarge`) a ``complete`` the database would refuse, or that
        is over ``max_artifact_size``, before anything is sent (see :func:`refuse_too_large`); ``statement``
        is the SQL the values go into."""
        payload: bytes = values["p_payload"]
        if self.max_artifact_size is not None:
            refuse_too_large(
                key,
                len(payload),
                len(payload),
                self.max_artifact_size,
                where=f"this store's max_artifact_size of {self.url}",
                remedy="Raise ?max_artifact_size= in the store URL, or store the data elsewhere and return a "
                "reference to it",
            )
        if self.dialect in ("mysql", "mariadb"):
            self._check_packet_size(cursor, key, values, statement)
        elif self.dialect == "sqlite":
            import sqlite3

            limit = int(cursor.connection.getlimit(sqlite3.SQLITE_LIMIT_LENGTH))
            others = others_size(values)
            refuse_too_large(
                key,
                len(payload),
                len(payload) + others + _ROW_OVERHEAD,
                limit,
                where="SQLite takes in one row (SQLITE_LIMIT_LENGTH)",
                remedy="Use a store for large values (PostgreSQL, Azure), or store the data elsewhere "
                "and return a reference to it",
            )
        elif self.dialect == "postgresql":
            refuse_too_large(
                key,
                len(payload),
                len(payload),
                POSTGRES_MAX_BYTEA,
                where="PostgreSQL takes in one bytea value",
                remedy="Store the data elsewhere (e.g. Azure blobs) and return a reference to it",
            )

    def _check_packet_size(self, cursor: Any, key: Key, values: Mapping[str, Any], statement: str) -> None:
        """Refuse (with :class:`ArtifactTooLarge`) a complete that MySQL/MariaDB would refuse.

        The server drops the connection when a statement is longer than ``max_allowed_packet``, which
        looks like a network failure: the client then re-sent the payload for a whole ttl and never
        released the lease. The statement's length is known before sending: the driver inlines the
        payload as a literal (see :meth:`_literal_size`), and the other values are short.
        """
        if self._max_packet is None:
            cursor.execute("SELECT @@max_allowed_packet")
            self._max_packet = int(cursor.fetchone()[0])
        payload = values["p_payload"]
        others = 2 * others_size(values)
        needed = self._literal_size(cursor, payload) + others + len(statement) + 64
        refuse_too_large(
            key,
            len(payload),
            needed,
            self._max_packet,
            where=f"this {self.dialect} server's max_allowed_packet",
            remedy="Raise max_allowed_packet on the server, or store the data elsewhere and return a "
            "reference to it",
        )

    def _literal_size(self, cursor: Any, payload: bytes) -> int:
        """How many bytes the driver's literal of ``payload`` takes: PyMySQL 1.1 and later write hex
        (``X'..'``, two bytes per byte), older drivers an escaped string (two bytes for each of the
        seven bytes of ``_MYSQL_ESCAPED``). Which one is asked of the driver once per store."""
        if self._hex_literals is None:
            try:
                probe = cursor.connection.escape(b"a\0")
                text = probe.decode("ascii") if isinstance(probe, bytes) else str(probe)
                self._hex_literals = text.upper().startswith("X'")
            except Exception:  # a driver without escape(): assume the larger form
                self._hex_literals = True
        if self._hex_literals:
            return 2 * len(payload) + 3
        return len(payload) + sum(payload.count(byte) for byte in _MYSQL_ESCAPED) + 10

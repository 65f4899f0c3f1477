"""The one exception tree of dibs.

Everything dibs raises on purpose derives from :class:`ReservationError`, so callers can catch the
whole family at once::

    ReservationError
    ├── ConfigurationError (also ValueError)   bad settings: ttl, URL, serializer, connection
    │   └── InvalidKey                         a key or namespace that breaks the key rules
    ├── StoreUnavailable                       the store could not be reached or answered an error
    ├── LeaseLost                              the lease's fencing token is no longer current
    ├── WaitTimeout (also TimeoutError)        a waiter gave up; names the holder it waited on
    ├── TooManyFailures                        the key failed too often; someone must reset it
    ├── ArtifactCorrupted                      a stored artifact failed its checksum or signature
    ├── SerializationError                     a value could not be (de)serialized
    │   └── ArtifactTooLarge                   its bytes are more than the store takes in one write
    └── CorruptRecord                          a stored record dibs cannot read (foreign or damaged)

Every error is picklable (``__reduce__`` rebuilds it from its message and fields), because errors cross
process boundaries: Airflow trigger events, Prefect task runners, ``multiprocessing`` pools.
Messages name the key and, where there is one, the holder; they never contain credentials.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ArtifactCorrupted",
    "ArtifactTooLarge",
    "ConfigurationError",
    "CorruptRecord",
    "InvalidKey",
    "LeaseLost",
    "ReservationError",
    "SerializationError",
    "StoreUnavailable",
    "TooManyFailures",
    "WaitTimeout",
]


class ReservationError(Exception):
    """Base of every error dibs raises on purpose.

    Fields are keyword-only attributes so that handlers can act on them without parsing messages.
    """

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields
        for name, value in fields.items():
            setattr(self, name, value)

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception's default pickling passes only ``args``; keyword fields would be lost.
        return (_rebuild, (type(self), self.message, self.fields))

    def __str__(self) -> str:
        return self.message


def _rebuild(cls: type[ReservationError], message: str, fields: dict[str, Any]) -> ReservationError:
    error = cls.__new__(cls)
    ReservationError.__init__(error, message, **fields)
    return error


class ConfigurationError(ReservationError, ValueError):
    """A setting is wrong: the message names the value and what would be right."""


class InvalidKey(ConfigurationError):
    """A key name or namespace breaks the key rules (see :mod:`dibs.keys`)."""


class StoreUnavailable(ReservationError):
    """The store could not be reached, or failed in a way that may pass (network, locks, restarts)."""


class LeaseLost(ReservationError):
    """The lease is no longer current: it expired and someone else took the key, or it was released.

    A holder that sees this must not publish anything on the key's behalf; its own result is still
    correct for its own run.
    """


class WaitTimeout(ReservationError, TimeoutError):
    """A waiter's own timeout passed while someone else still held the key."""


class TooManyFailures(ReservationError):
    """The key's work failed ``max_failures`` times; dibs stops a thundering retry until it is reset."""


class ArtifactCorrupted(ReservationError):
    """A stored artifact does not match its checksum or signature; it is left in place for inspection."""


class SerializationError(ReservationError):
    """A value could not be serialized, or stored bytes could not be turned back into a value."""


class ArtifactTooLarge(SerializationError):
    """The value's bytes are more than the store accepts in one write; nothing was sent or stored.

    A :class:`SerializationError`, so the client releases the lease (with the failure recorded) at once
    instead of retrying the write for a whole ttl; the message names the size and the store's limit.
    """


class CorruptRecord(ReservationError):
    """A stored record is unreadable: written by something else, or damaged. It is never overwritten."""

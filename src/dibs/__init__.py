"""dibs: leases on cache keys, so identical expensive tasks compute once across runs and processes.

>>> import dibs
>>> reservations = dibs.Reservations("sqlite:///dibs.db")          # doctest: +SKIP
>>> reservations.run("features-2026-11-25", build_features, day)    # doctest: +SKIP

The first process to ask for a key takes a lease and computes; every other one waits and then gets
the stored artifact; if the holder dies its lease expires and one waiter takes over. The semantics
are in docs/contract.md. Importing dibs imports neither a database driver nor an orchestrator.
"""

from __future__ import annotations

from dibs.aio import AsyncReservations
from dibs.backoff import Backoff, Outage
from dibs.client import Reservations
from dibs.errors import (
    ArtifactCorrupted,
    ArtifactTooLarge,
    ConfigurationError,
    CorruptRecord,
    InvalidKey,
    LeaseLost,
    ReservationError,
    SerializationError,
    StoreUnavailable,
    TooManyFailures,
    WaitTimeout,
)
from dibs.events import (
    ArtifactFound,
    ArtifactStored,
    Asked,
    Deferred,
    Event,
    Finished,
    HeartbeatFailed,
    HeartbeatSent,
    HolderChanged,
    KeyBusy,
    LeaseAcquired,
    LeaseReleased,
    LostLease,
    NotStored,
    Observation,
    Observer,
    RanUnreserved,
    StillWaiting,
    StoreOperation,
    StoreReachable,
    StoreUnreachable,
    Waited,
    WorkFailed,
    observe,
)
from dibs.keys import Key, derive_key, digest
from dibs.lease import KeepAlive, Lease
from dibs.outcomes import Acquired, Busy, Hit, RunReport
from dibs.serializers import BytesSerializer, JSONSerializer, Serializer, SignedPickleSerializer
from dibs.settings import Settings
from dibs.stores import Store, open_store

__version__ = "0.1.0"

__all__ = [
    "Acquired",
    "ArtifactCorrupted",
    "ArtifactFound",
    "ArtifactStored",
    "ArtifactTooLarge",
    "Asked",
    "AsyncReservations",
    "Backoff",
    "Busy",
    "BytesSerializer",
    "ConfigurationError",
    "CorruptRecord",
    "Deferred",
    "Event",
    "Finished",
    "HeartbeatFailed",
    "HeartbeatSent",
    "Hit",
    "HolderChanged",
    "InvalidKey",
    "JSONSerializer",
    "KeepAlive",
    "Key",
    "KeyBusy",
    "Lease",
    "LeaseAcquired",
    "LeaseLost",
    "LeaseReleased",
    "LostLease",
    "NotStored",
    "Observation",
    "Observer",
    "Outage",
    "RanUnreserved",
    "ReservationError",
    "Reservations",
    "RunReport",
    "SerializationError",
    "Serializer",
    "Settings",
    "SignedPickleSerializer",
    "StillWaiting",
    "Store",
    "StoreOperation",
    "StoreReachable",
    "StoreUnavailable",
    "StoreUnreachable",
    "TooManyFailures",
    "WaitTimeout",
    "Waited",
    "WorkFailed",
    "__version__",
    "derive_key",
    "digest",
    "observe",
    "open_store",
]

"""The plain data a store reads and writes: leases, failures, artifacts, and what one key looks like.

These are the store-level records (bytes, store-clock timestamps as Unix seconds). The client wraps
them into the user-facing outcomes of :mod:`dibs.outcomes`. All times here come from the *store's*
clock: comparing them with ``time.time()`` of some client would break the contract's Time section.
"""

from __future__ import annotations

import dataclasses
import hashlib
import secrets

from dibs.errors import ArtifactCorrupted
from dibs.keys import Key

__all__ = [
    "MAX_COUNT",
    "MAX_FENCE",
    "MAX_TIMESTAMP",
    "ArtifactRecord",
    "FailureRecord",
    "Granted",
    "Held",
    "KeyState",
    "LeaseRecord",
    "LeaseToken",
    "Present",
    "StoreOutcome",
    "checksum",
    "new_lease_id",
]


#: The largest fencing token: what every store can hold exactly (a signed 64-bit SQL ``BIGINT``, a
#: Redis ``HINCRBY`` counter). A key would need that many changes of hands to reach it, so a record
#: at this fence was damaged; no lease is granted past it (the next token could not be higher).
MAX_FENCE = 2**63 - 1
#: The largest attempt and failure count (a signed 32-bit SQL ``INTEGER``); both stop there.
MAX_COUNT = 2**31 - 1
#: The last second of the year 9999 (Unix time): the latest time a record may hold, so every time
#: dibs stores can also be shown as a date.
MAX_TIMESTAMP = 253402300799.0


def new_lease_id() -> str:
    """128 random bits: the unguessable half of a lease's identity (the fence is the ordered half)."""
    return secrets.token_hex(16)


def checksum(payload: bytes) -> str:
    return "sha256:" + hashlib.sha256(payload).hexdigest()


@dataclasses.dataclass(frozen=True)
class LeaseToken:
    """What a holder proves it holds: the fencing token (strictly increasing per change of hands) and
    the lease's random id. Stores accept a write only when both match the current record."""

    fence: int
    lease_id: str

    def __str__(self) -> str:
        return f"{self.fence}"


@dataclasses.dataclass(frozen=True)
class LeaseRecord:
    """A lease as the store last wrote it. It may be expired: compare ``expires_at`` with a store ``now``."""

    key: Key
    owner: str
    token: LeaseToken
    acquired_at: float
    expires_at: float
    ttl: float
    attempt: int
    max_expires_at: float | None = None

    def live_at(self, now: float) -> bool:
        return now < self.expires_at


@dataclasses.dataclass(frozen=True)
class FailureRecord:
    """Why the last holder released without an artifact, and how many of those releases were failures.

    A stop (Ctrl-C, a cancellation, a kill) is recorded here too, so waiters can say why the key is
    free, but not counted: ``count`` is 0 when only stops were ever recorded, and ``max_failures``
    counts failures only.
    """

    count: int
    error: str
    owner: str
    at: float


@dataclasses.dataclass(frozen=True)
class ArtifactRecord:
    """A completed key's stored bytes with the facts needed to trust and decode them."""

    serializer: str
    payload: bytes
    size: int
    checksum: str
    producer: str
    fence: int
    created_at: float
    #: How long the producer's work ran under its lease (seconds, its own monotonic clock): what each
    #: waiter and hit was spared (``dibs.compute.saved``). ``None`` for artifacts stored before dibs
    #: recorded it, or by a caller that did not say.
    compute_seconds: float | None = None

    def is_fresh(self, now: float, *, max_age: float | None = None, min_fence: int | None = None) -> bool:
        """Whether this artifact still counts at ``now`` (the store's clock): not ``max_age`` seconds old
        or older, and stored under a lease with a fencing token of at least ``min_fence``.

        A refresh asks with ``max_age=0`` (no artifact that exists counts), and when the key is busy,
        waits for one stored under the busy lease's token or a later one: exact, where a comparison of
        times would depend on the clock's resolution. A stale artifact is a miss: the next caller
        recomputes it under a lease, and its value replaces this one.
        """
        if max_age is not None and (max_age <= 0 or now - self.created_at >= max_age):
            return False  # 0: none is young enough (a refresh), whatever two clients' clocks say
        return min_fence is None or self.fence >= min_fence

    def verified_payload(self, key: Key) -> bytes:
        """The payload, after checking its size and checksum: a mismatch is never served as a value."""
        if len(self.payload) != self.size or checksum(self.payload) != self.checksum:
            raise ArtifactCorrupted(
                f"artifact of {key} failed its integrity check (stored size {self.size}, "
                f"read {len(self.payload)} bytes; checksum {self.checksum}); it is left in place: "
                f"inspect it with 'dibs show', then 'dibs forget' it to recompute",
                key=str(key),
            )
        return self.payload


@dataclasses.dataclass(frozen=True)
class KeyState:
    """Everything a store knows about one key, read at one instant of the store's clock (``now``)."""

    key: Key
    now: float
    fence: int = 0
    attempts: int = 0
    lease: LeaseRecord | None = None
    artifact: ArtifactRecord | None = None
    failure: FailureRecord | None = None

    @property
    def live_lease(self) -> LeaseRecord | None:
        return self.lease if self.lease is not None and self.lease.live_at(self.now) else None

    @property
    def status(self) -> str:
        """One word for people and scripts: ``done``, ``held``, ``expired``, ``failed`` or ``free``.

        A live lease wins over an artifact: the key is being computed again (a refresh, or an artifact
        past somebody's maximum age), and the artifact stays until the new one replaces it.
        """
        if self.lease is not None and self.lease.live_at(self.now):
            return "held"
        if self.artifact is not None:
            return "done"
        if self.lease is not None:
            return "expired"
        if self.failure is not None:
            return "failed"
        return "free"


# What a store's one-attempt ``acquire`` returns. The client turns these into Hit / Acquired / Busy.


@dataclasses.dataclass(frozen=True)
class Present:
    """The key has an artifact."""

    artifact: ArtifactRecord


@dataclasses.dataclass(frozen=True)
class Granted:
    """The caller holds the lease (new, taken over from an expired holder, or its own again)."""

    lease: LeaseRecord
    failure: FailureRecord | None = None
    took_over_from: str | None = None
    #: The owner's own live lease, given again with its expiry extended (no new token): a caller that
    #: did not receive this answer (a cancelled ask) must not release it, it belongs to the first ask.
    reentered: bool = False


@dataclasses.dataclass(frozen=True)
class Held:
    """Someone else holds a live lease; ``now`` is the store's clock when that was seen."""

    lease: LeaseRecord
    now: float
    failure: FailureRecord | None = None


StoreOutcome = Present | Granted | Held

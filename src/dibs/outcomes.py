"""What :meth:`dibs.Reservations.get_or_reserve` answers: exactly one of Hit, Acquired or Busy."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Literal

from dibs.errors import WaitTimeout
from dibs.keys import Key
from dibs.records import ArtifactRecord, FailureRecord, LeaseRecord

if TYPE_CHECKING:
    from dibs.lease import Lease

__all__ = ["Acquired", "Busy", "Hit", "Outcome", "RunReport"]


@dataclasses.dataclass(frozen=True)
class Hit:
    """The key's artifact exists: use ``value`` and run nothing."""

    key: Key
    value: Any
    producer: str
    created_at: float
    token: int
    serializer: str
    size: int
    #: How long the producer computed it (``None``: not recorded, e.g. an artifact from older dibs).
    compute_seconds: float | None = None

    @classmethod
    def of(cls, key: Key, artifact: ArtifactRecord, value: Any) -> Hit:
        """The hit of a stored ``artifact`` whose value is ``value`` (decoded, or handed on as it is:
        ``dibs run`` streams a payload instead of decoding it)."""
        return cls(
            key,
            value,
            artifact.producer,
            artifact.created_at,
            artifact.fence,
            artifact.serializer,
            artifact.size,
            artifact.compute_seconds,
        )


@dataclasses.dataclass(frozen=True)
class Acquired:
    """You hold the lease: run the work, then ``lease.complete(value)`` or ``lease.release(error)``."""

    lease: Lease
    took_over_from: str | None = None
    last_failure: FailureRecord | None = None

    @property
    def key(self) -> Key:
        return self.lease.key


@dataclasses.dataclass(frozen=True)
class Busy:
    """Someone else holds a live lease. Times are on the store's clock; ``remaining`` is a duration."""

    key: Key
    holder: str
    since: float
    expires_at: float
    attempt: int
    now: float
    last_failure: FailureRecord | None = None
    #: The holder's fencing token: ``min_token=busy.token`` waits for the artifact this lease stores
    #: (or a later one), which is how a refresh that found the key busy shares the holder's result.
    token: int | None = None

    @classmethod
    def of(cls, lease: LeaseRecord, now: float, last_failure: FailureRecord | None) -> Busy:
        """The busy key ``lease`` holds, as the store saw it at ``now`` (its clock)."""
        return cls(
            lease.key,
            lease.owner,
            lease.acquired_at,
            lease.expires_at,
            lease.attempt,
            now,
            last_failure,
            lease.token.fence,
        )

    @property
    def remaining(self) -> float:
        return max(0.0, self.expires_at - self.now)

    def timed_out(self, waited: float) -> WaitTimeout:
        """The error of a waiter that gave up on this holder after ``waited`` seconds: the one wording
        every dibs caller uses."""
        return WaitTimeout(
            f"gave up waiting for {self.key} after {waited:.1f}s: still held by {self.holder!r} (lease "
            f"attempt {self.attempt} on this key; its lease runs {self.remaining:.1f}s more unless renewed)",
            key=str(self.key),
            holder=self.holder,
        )


Outcome = Hit | Acquired | Busy


@dataclasses.dataclass(frozen=True)
class RunReport:
    """How a :meth:`~dibs.Reservations.compute` call got its value, for logs, XComs and artifacts.

    ``role`` is ``"computed"`` (this call ran the work), ``"waited"`` (another run computed it while
    this one waited), ``"hit"`` (it was already stored) or ``"unreserved"`` (the store was unreachable
    and the policy said to run anyway).
    """

    key: Key
    value: Any
    role: Literal["computed", "waited", "hit", "unreserved"]
    token: int | None
    producer: str | None
    waited_seconds: float = 0.0
    waited_on: str | None = None
    took_over_from: str | None = None
    stored: bool = True

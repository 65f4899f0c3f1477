"""What a store is asked for by :meth:`~dibs.stores.Store.acquire` and :meth:`~dibs.stores.Store.complete`.

Each of these operations takes one object for its terms instead of a list of arguments, so a new term
(``max_age``, ``min_fence`` and ``compute_seconds`` were all added after the first stores were
written) is a new field with a default, and no store's signature changes again: a store written
before the field existed still accepts every call, and only a store that keeps the new term reads it.
Adding ``compute_seconds`` as an argument of ``complete`` had broken every store written elsewhere.

Only what every store needs is checked here, once (the owner, which is written into the record);
each store still checks what its own service needs.
"""

from __future__ import annotations

import dataclasses

from dibs.keys import validate_owner
from dibs.records import ArtifactRecord

__all__ = ["AcquireRequest", "NewArtifact"]


@dataclasses.dataclass(frozen=True, slots=True)
class AcquireRequest:
    """The terms of one ``acquire``: who asks, the lease it would get, and which artifact counts.

    The lease lasts ``ttl`` seconds from each grant or heartbeat, never beyond ``max_lease_age``
    seconds after it was granted (``None``: no cap). An artifact counts only if it is fresh by the
    store's clock (see :meth:`takes`).
    """

    owner: str
    ttl: float
    max_lease_age: float | None = None
    #: An artifact this old or older is no hit (``0``: none is, a refresh).
    max_age: float | None = None
    #: Only an artifact stored under a lease with at least this fencing token is a hit.
    min_fence: int | None = None

    def __post_init__(self) -> None:
        validate_owner(self.owner)  # a bad owner written into the record would make it unreadable for all

    def takes(self, artifact: ArtifactRecord, now: float) -> bool:
        """Whether ``artifact`` answers this request at ``now`` (the store's clock): see
        :meth:`~dibs.records.ArtifactRecord.is_fresh`."""
        return artifact.is_fresh(now, max_age=self.max_age, min_fence=self.min_fence)


@dataclasses.dataclass(frozen=True, slots=True)
class NewArtifact:
    """What ``complete`` stores: the serialized value, and what the lease's holder knows about it."""

    #: The name of the serializer that made ``payload`` (it decodes it again).
    serializer: str
    payload: bytes
    #: ``payload``'s checksum (``sha256:<hex>``), checked by every reader.
    checksum: str
    #: How long the work ran under the lease (seconds), kept with the artifact when given.
    compute_seconds: float | None = None

    def __post_init__(self) -> None:
        # A serializer may return any bytes-like object (a bytearray, a memoryview): the record keeps
        # an immutable copy, the same type a read returns, and its size counts bytes, not items.
        if type(self.payload) is not bytes:
            object.__setattr__(self, "payload", bytes(self.payload))

    def stored(self, producer: str, fence: int, created_at: float) -> ArtifactRecord:
        """The record of this artifact once stored by ``producer`` under token ``fence`` at ``created_at``."""
        return ArtifactRecord(
            serializer=self.serializer,
            payload=self.payload,
            size=len(self.payload),
            checksum=self.checksum,
            producer=producer,
            fence=fence,
            created_at=created_at,
            compute_seconds=self.compute_seconds,
        )

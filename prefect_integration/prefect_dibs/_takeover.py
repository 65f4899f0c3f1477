"""Why a holder's lease had expired when a waiter took it over, in words for a run's log.

A waiter hears every lease it finds on the key while it waits (:attr:`dibs.integration.Steps.seen`), so
when it later takes the key over it can say whether the lease ran out of heartbeats or reached its
maximum age (Prefect's ``hold_timeout``, a block's ``max_lease_age``), which it reaches whatever its
holder does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dibs.records import LeaseRecord

__all__ = ["expiry_cause"]


def expiry_cause(took_over_from: str, acquired_at: float, seen: LeaseRecord | None, *, limit: str) -> str:
    """Why the lease of ``took_over_from``, taken over at ``acquired_at`` (store clock), had expired,
    as far as the waiter saw it (``seen``: the last lease it found; ``limit``: what the maximum age is
    called where the reader set it)."""
    lease = seen if seen is not None and seen.owner == took_over_from else None
    if lease is None:
        return f"its lease had expired (its holder stopped heartbeating, or its {limit} ran out)"
    if lease.max_expires_at is not None and acquired_at >= lease.max_expires_at:
        return f"its {limit} ({lease.max_expires_at - lease.acquired_at:g}s) ran out"
    return "its holder stopped heartbeating, so its lease expired"

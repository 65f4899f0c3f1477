"""Why a holder's lease had expired when a waiter took it over, in words for a run's log.

The flow remembers the last lease a waiter found on the key, and says in its ``LeaseAcquired`` event
whether the lease taken over ran out of heartbeats or reached its maximum age (Prefect's
``hold_timeout``, a block's ``max_lease_age``), which it reaches whatever its holder does.
"""

from __future__ import annotations

from dibs import events

__all__ = ["expiry_cause"]


def expiry_cause(acquired: events.LeaseAcquired, *, limit: str) -> str:
    """Why the lease ``acquired`` took over had expired, as far as the waiter saw it (``limit``: what
    the maximum age is called where the reader set it)."""
    if acquired.expired_by == "max_lease_age":
        age = "" if acquired.expired_max_age is None else f" ({acquired.expired_max_age:g}s)"
        return f"its {limit}{age} ran out"
    if acquired.expired_by == "heartbeating":
        return "its holder stopped heartbeating, so its lease expired"
    return f"its lease had expired (its holder stopped heartbeating, or its {limit} ran out)"

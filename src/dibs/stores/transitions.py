"""The reservation state machine, written once as pure functions over :class:`~dibs.records.KeyState`.

Stores that read a whole record and replace it conditionally (memory, filesystem, Azure blobs) apply
these functions between their read and their compare-and-swap. Stores that decide inside the
service (SQL statements, Redis Lua) implement the same rules natively, and the shared contract suite
holds every store to the behaviour written here. The rules are the contract's:

* ``acquire``: a fresh artifact wins (see :meth:`~dibs.records.ArtifactRecord.is_fresh`: a caller may
  ask for one younger than a maximum age, or made after its refresh began); a live lease of another
  owner is *held*; the same owner re-enters its own lease (same fence, expiry extended); otherwise the
  key changes hands and the fence goes up. A stale artifact stays until ``complete`` replaces it.
* ``heartbeat``/``complete``/``release`` are accepted only while the caller's token (fence + lease
  id) is the current one; an expired lease that nobody took over is still current.
* A maximum lease age caps every extension, including re-entries.
* Removal never deletes a record: it leaves a *tombstone* (see :func:`tombstone`), a record that
  keeps only the key's fence (and, in the SQL store, the row's version). ``discard`` turns a record
  that holds nothing into one, ``prune`` one that :func:`prunable` says is old, and ``reap`` clears
  expired leases and then discards. So a key's fence never goes down for the life of the store: the
  next holder always gets a higher token than any before it, and a payload named by its fence is
  never written twice. (Deleting the record and starting again from fence 0 let the next holder
  print token 1 a second time, and let a delayed compare-and-swap on a re-created record's version
  match it: issue 16.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from dibs.errors import CorruptRecord, LeaseLost
from dibs.keys import Key
from dibs.records import (
    MAX_COUNT,
    MAX_FENCE,
    ArtifactRecord,
    FailureRecord,
    Granted,
    Held,
    KeyState,
    LeaseRecord,
    LeaseToken,
    Present,
    StoreOutcome,
    new_lease_id,
)
from dibs.stores.requests import AcquireRequest, NewArtifact

__all__ = [
    "acquire",
    "complete",
    "discard",
    "explain_lost",
    "fence_exhausted",
    "force_release",
    "forget",
    "heartbeat",
    "holds_nothing",
    "is_tombstone",
    "prunable",
    "prune",
    "reap",
    "release",
    "tombstone",
]

MAX_ERROR_LENGTH = 2000


def _capped_expiry(now: float, ttl: float, max_expires_at: float | None) -> float:
    expires = now + ttl
    return expires if max_expires_at is None else min(expires, max_expires_at)


def acquire(
    state: KeyState,
    request: AcquireRequest,
    make_lease_id: Callable[[], str] = new_lease_id,
) -> tuple[StoreOutcome, KeyState | None]:
    """Decide one ``get_or_reserve``: the outcome, and the new state to write (``None``: write nothing)."""
    now = state.now
    artifact = state.artifact
    if artifact is not None and request.takes(artifact, now):
        return Present(artifact), None
    lease = state.lease
    if (
        lease is not None
        and lease.owner == request.owner
        and (lease.max_expires_at is None or now < lease.max_expires_at)
    ):
        renewed = LeaseRecord(
            lease.key,
            lease.owner,
            lease.token,
            lease.acquired_at,
            _capped_expiry(now, request.ttl, lease.max_expires_at),
            request.ttl,
            lease.attempt,
            lease.max_expires_at,
        )
        return Granted(renewed, state.failure, reentered=True), _with_lease(state, renewed)
    if lease is not None and lease.live_at(now):
        return Held(lease, now, state.failure), None
    if state.fence >= MAX_FENCE:
        raise fence_exhausted(state.key, state.fence)
    max_expires_at = None if request.max_lease_age is None else now + request.max_lease_age
    fresh = LeaseRecord(
        key=state.key,
        owner=request.owner,
        token=LeaseToken(state.fence + 1, make_lease_id()),
        acquired_at=now,
        expires_at=_capped_expiry(now, request.ttl, max_expires_at),
        ttl=request.ttl,
        attempt=min(state.attempts + 1, MAX_COUNT),
        max_expires_at=max_expires_at,
    )
    # The states are built field by field: dataclasses.replace cost 3 µs of every reservation (issue 20).
    new_state = KeyState(
        state.key, now, fresh.token.fence, fresh.attempt, fresh, state.artifact, state.failure
    )
    took_over_from = lease.owner if lease is not None else None
    return Granted(fresh, state.failure, took_over_from), new_state


def _with_lease(state: KeyState, lease: LeaseRecord) -> KeyState:
    """``state`` with ``lease`` (``dataclasses.replace(state, lease=lease)``, without its cost)."""
    return KeyState(state.key, state.now, state.fence, state.attempts, lease, state.artifact, state.failure)


def fence_exhausted(key: Key, fence: int) -> CorruptRecord:
    """The error for a key whose fence cannot go up any more (only damage gets it there)."""
    return CorruptRecord(
        f"the record of {key} has the fencing token {fence}, the largest a store can hold, so no new "
        "lease can be granted (its token must be higher); it was left untouched: inspect it, and delete "
        "it by hand to start the key afresh",
        key=str(key),
        fence=fence,
    )


def explain_lost(state: KeyState, token: LeaseToken, action: str) -> LeaseLost:
    """The :class:`LeaseLost` for a write with a stale ``token``: says who has the key now, if anyone."""
    key = state.key
    reason = "released"
    if state.fence < token.fence or (
        state.fence == token.fence and state.lease is not None and state.lease.token != token
    ):
        # A fence never goes down and is never handed out twice: a record below this token, or a lease
        # of this token's fence that is not this token, is a record that lost writes since the grant.
        reason = "rolled_back"
        holder = (
            ""
            if state.lease is None
            else f" ({state.lease.owner!r} holds it with token {state.lease.token.fence})"
        )
        why = (
            f"the store's record of the key is at token {state.fence}{holder}: it lost writes made since "
            "this token was granted (a restart without persistence, or a failover to a replica that had "
            "not received them), or the token is not from this store"
        )
    elif state.lease is not None and state.lease.token != token:
        reason = "taken_over"
        why = (
            f"it was taken over by {state.lease.owner!r} with token {state.lease.token.fence} "
            f"(attempt {state.lease.attempt})"
        )
    elif state.artifact is not None and state.lease is None:
        reason = "completed"
        why = f"the key was already completed by {state.artifact.producer!r} (token {state.artifact.fence})"
    elif state.lease is not None:
        reason = "max_lease_age"
        why = "the lease reached its maximum age"
    else:
        why = "the lease was released (by its holder, an operator, or the reaper)"
    return LeaseLost(
        f"cannot {action} {key}: token {token.fence} is no longer current: {why}",
        key=str(key),
        token=token.fence,
        holder=state.lease.owner if state.lease is not None else None,
        reason=reason,
    )


def _current(state: KeyState, token: LeaseToken) -> LeaseRecord | None:
    lease = state.lease
    if lease is not None and lease.token == token:
        return lease  # also beside a stale artifact, which its complete replaces
    return None


def heartbeat(state: KeyState, token: LeaseToken, ttl: float) -> tuple[LeaseRecord, KeyState]:
    lease = _current(state, token)
    if lease is None or (lease.max_expires_at is not None and state.now >= lease.max_expires_at):
        raise explain_lost(state, token, "heartbeat")
    renewed = dataclasses.replace(
        lease, expires_at=_capped_expiry(state.now, ttl, lease.max_expires_at), ttl=ttl
    )
    return renewed, dataclasses.replace(state, lease=renewed)


def complete(state: KeyState, token: LeaseToken, artifact: NewArtifact) -> tuple[ArtifactRecord, KeyState]:
    lease = _current(state, token)
    if lease is None:
        raise explain_lost(state, token, "complete")
    stored = artifact.stored(producer=lease.owner, fence=token.fence, created_at=state.now)
    return stored, dataclasses.replace(state, lease=None, artifact=stored)


def release(state: KeyState, token: LeaseToken, error: str | None, counted: bool = True) -> KeyState:
    """End the lease; ``error`` is recorded, and counted as a failure unless ``counted`` is false (a
    stop: Ctrl-C, a cancellation, a kill is recorded so waiters can say why, but is not a failure)."""
    lease = _current(state, token)
    if lease is None:
        raise explain_lost(state, token, "release")
    failure = state.failure
    if error is not None:
        count = min((failure.count if failure is not None else 0) + int(counted), MAX_COUNT)
        failure = FailureRecord(count=count, error=error[:MAX_ERROR_LENGTH], owner=lease.owner, at=state.now)
    return dataclasses.replace(state, lease=None, failure=failure)


def force_release(state: KeyState) -> KeyState | None:
    """Drop the lease whoever holds it (an operator's repair); ``None`` when there is none."""
    return None if state.lease is None else dataclasses.replace(state, lease=None)


def forget(state: KeyState) -> KeyState | None:
    """Drop the artifact and the failure history so the key computes again; the fence is kept."""
    if state.artifact is None and state.failure is None:
        return None
    return dataclasses.replace(state, artifact=None, failure=None)


def reap(state: KeyState) -> KeyState | None:
    """Clear an expired lease nobody took over; ``None`` when there is nothing to reap."""
    if state.lease is None or state.lease.live_at(state.now):
        return None
    return dataclasses.replace(state, lease=None)


def holds_nothing(state: KeyState) -> bool:
    """No lease, no artifact, no failure: a record only its fence distinguishes from no record."""
    return state.lease is None and state.artifact is None and state.failure is None


def is_tombstone(state: KeyState) -> bool:
    """What removal leaves (or a key never used): only counters, so listings leave it out.

    ``attempts`` is 0 too: a record released without a failure holds nothing as well, but still counts
    its attempts until it is discarded, reaped or pruned (as it used to be listed until it was removed).
    """
    return holds_nothing(state) and state.attempts == 0


def tombstone(state: KeyState) -> KeyState | None:
    """The record that removal leaves in place of ``state``: no lease, no artifact, no failure, and its
    attempts counted from 0 again, but the same fence; ``None`` when it is one already.

    The record is kept rather than deleted so that the key's fence never goes down: the next holder
    gets fence + 1, a token no earlier holder had, and stores that name payloads or compare versions
    per record never see a name or a version twice.
    """
    if is_tombstone(state):
        return None
    return dataclasses.replace(state, lease=None, artifact=None, failure=None, attempts=0)


def discard(state: KeyState) -> KeyState | None:
    """A record that holds nothing becomes a tombstone; ``None`` when there is nothing to change."""
    return tombstone(state) if holds_nothing(state) else None


def prune(state: KeyState, older_than: float) -> KeyState | None:
    """A record :func:`prunable` says is ``older_than`` seconds old becomes a tombstone; ``None`` when
    it is not that old, or a tombstone already (which is not counted again)."""
    return tombstone(state) if prunable(state, older_than) else None


def prunable(state: KeyState, older_than: float) -> bool:
    """Whether ``prune`` clears this record: nobody holds it (or its lease ended ``older_than``
    seconds ago), and what it keeps is that old: an artifact made before, a failure recorded before,
    or nothing at all."""
    limit = state.now - older_than
    lease = state.lease
    if lease is not None and lease.expires_at >= limit:
        return False
    if state.artifact is not None:
        return state.artifact.created_at < limit
    if state.failure is not None:
        return state.failure.at < limit
    return True


def empty(key: Key, now: float) -> KeyState:
    return KeyState(key=key, now=now)

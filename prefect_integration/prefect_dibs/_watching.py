"""Waiting on a busy key while the run's logs and state keep naming whoever holds it now.

:meth:`dibs.Reservations.acquire` waits through changes of holder without saying so, so a Prefect run
waiting with it would go on showing the holder it first found, dead or not. Here a waiter waits in
steps instead: the core's :meth:`~dibs.Reservations.wait` (woken by the process's watch hub) returns as
soon as the key is done or nobody holds it, and one ``get_or_reserve`` then finds the artifact, takes
the key, or names the new holder, which the caller hears about at once (:class:`Watch.changed`).

A key changes hands while someone waits only when its lease is released or expires. A release wakes
the waiter; an expiry is the one change no store announces, so a step never lasts past the holder's
expiry (plus :data:`EXPIRY_MARGIN`): a waiter asks right then, and either takes the key over or learns
who did. A step also ends every ``progress_every`` seconds, for the caller's "still waiting" line.

Each new holder's lease is read once (:class:`Seen`), so that a takeover can later be explained:
whether the lease ran out of heartbeats or hit its maximum age (Prefect's ``hold_timeout``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, cast

from dibs.backoff import Deadline
from dibs.errors import WaitTimeout
from dibs.outcomes import Acquired, Busy, Hit

if TYPE_CHECKING:
    from dibs import AsyncReservations, Reservations
    from dibs.keys import Key
    from dibs.records import KeyState, LeaseRecord

__all__ = ["EXPIRY_MARGIN", "Seen", "Watch", "await_key", "expiry_cause", "wait_for_key"]

#: Seconds after a holder's expiry (store clock) that a waiter asks again, whatever it heard meanwhile.
EXPIRY_MARGIN = 0.05


@dataclasses.dataclass(frozen=True)
class Seen:
    """The holder a waiter last found: its latest :class:`~dibs.Busy`, and its lease as first read
    (``None`` if it had changed hands again by then)."""

    busy: Busy
    lease: LeaseRecord | None


@dataclasses.dataclass(frozen=True)
class Watch:
    """What the caller is told while it waits: a new holder at once, and every ``progress_every``
    seconds (``None``: never) that it still waits."""

    changed: Callable[[Seen], None]
    progress: Callable[[Seen, float], None] | None = None
    progress_every: float | None = None


def _seen(busy: Busy, state: KeyState) -> Seen:
    lease = state.live_lease
    return Seen(busy, lease if lease is not None and lease.owner == busy.holder else None)


# The loop is written once, as a generator of requests (as the core's own waiting loops are), and
# carried out by a sync and an async driver: read the key (_READ), wait a step (_Wait: the core's
# wait, answered with its Hit or None), or ask for the key (_ASK: get_or_reserve).
_READ, _ASK = "read", "ask"


@dataclasses.dataclass(frozen=True)
class _Wait:
    seconds: float


Loop = Generator["str | _Wait", object, "tuple[Hit | Acquired | Busy, Seen]"]


def _waiting(busy: Busy, watch: Watch, deadline: Deadline) -> Loop:
    state = yield _READ
    seen = _seen(busy, cast("KeyState", state))
    last_progress = time.monotonic()
    while True:
        hit = yield _Wait(_step(deadline, seen.busy, watch, time.monotonic() - last_progress))
        if hit is not None:
            return cast("Hit", hit), seen
        got = yield _ASK
        if not isinstance(got, Busy):
            return cast("Hit | Acquired", got), seen
        if got.holder != seen.busy.holder:
            seen = _seen(got, cast("KeyState", (yield _READ)))
            watch.changed(seen)
        else:
            seen = dataclasses.replace(seen, busy=got)
        if deadline.expired:
            return got, seen
        last_progress = _progress(watch, seen, deadline, last_progress)


def _step(deadline: Deadline, busy: Busy, watch: Watch, since_progress: float) -> float:
    step = busy.remaining + EXPIRY_MARGIN
    if watch.progress_every is not None:
        step = min(step, max(0.0, watch.progress_every - since_progress))
    remaining = deadline.remaining
    return step if remaining is None else min(step, remaining)


def wait_for_key(
    client: Reservations,
    key: Key,
    owner: str,
    busy: Busy,
    watch: Watch,
    *,
    timeout: float | None,
    ttl: float | None = None,
    max_lease_age: float | None = None,
    min_token: int | None = None,
) -> tuple[Hit | Acquired | Busy, Seen]:
    """Wait until the key is done or ``owner``'s, or ``timeout`` passes (then the last :class:`Busy`).

    ``busy`` is the answer that started the wait; ``ttl``/``max_lease_age`` are the terms of the lease
    asked for, and ``min_token`` the oldest artifact that counts (a refresh waits for what the busy
    holder stores, never for the artifact it is replacing). Returns the outcome and the last holder
    seen (to explain a takeover).
    """
    loop = _waiting(busy, watch, Deadline(timeout))
    answer: object = None
    try:
        while True:
            request = loop.send(answer)
            if isinstance(request, _Wait):
                try:
                    answer = client.wait(key, timeout=request.seconds, min_token=min_token)
                except WaitTimeout:
                    answer = None  # the step ended with the key still held: ask anyway
            elif request == _ASK:
                answer = client.get_or_reserve(
                    key, owner, ttl=ttl, max_lease_age=max_lease_age, min_token=min_token
                )
            else:
                answer = client.status(key)
    except StopIteration as stop:
        result: tuple[Hit | Acquired | Busy, Seen] = stop.value
        return result


async def await_key(
    client: AsyncReservations,
    key: Key,
    owner: str,
    busy: Busy,
    watch: Watch,
    *,
    timeout: float | None,
    ttl: float | None = None,
    max_lease_age: float | None = None,
    min_token: int | None = None,
) -> tuple[Hit | Acquired | Busy, Seen]:
    """:func:`wait_for_key` for event loops: the same steps, awaited; the loop is never blocked."""
    loop = _waiting(busy, watch, Deadline(timeout))
    answer: object = None
    try:
        while True:
            request = loop.send(answer)
            if isinstance(request, _Wait):
                try:
                    answer = await client.wait(key, timeout=request.seconds, min_token=min_token)
                except WaitTimeout:
                    answer = None
            elif request == _ASK:
                answer = await client.get_or_reserve(
                    key, owner, ttl=ttl, max_lease_age=max_lease_age, min_token=min_token
                )
            else:
                answer = await client.status(key)
    except StopIteration as stop:
        result: tuple[Hit | Acquired | Busy, Seen] = stop.value
        return result


def _progress(watch: Watch, seen: Seen, deadline: Deadline, last: float) -> float:
    """Tell the caller it still waits, when ``progress_every`` has passed; the time it was last told."""
    now = time.monotonic()
    if watch.progress is None or watch.progress_every is None or now - last < watch.progress_every:
        return last
    watch.progress(seen, deadline.elapsed)
    return now


def expiry_cause(took_over_from: str, acquired_at: float, seen: Seen | None, *, limit: str) -> str:
    """Why the lease of ``took_over_from``, taken over at ``acquired_at`` (store clock), had expired, as
    far as this waiter saw it.

    A lease that expired at its maximum age (``limit``: Prefect's ``hold_timeout``, or a block's
    ``max_lease_age``) ran out, whatever its holder did; one that expired earlier was not renewed.
    """
    lease = seen.lease if seen is not None and seen.busy.holder == took_over_from else None
    if lease is None:
        return f"its lease had expired (its holder stopped heartbeating, or its {limit} ran out)"
    if lease.max_expires_at is not None and acquired_at >= lease.max_expires_at:
        return f"its {limit} ({lease.max_expires_at - lease.acquired_at:g}s) ran out"
    return "its holder stopped heartbeating, so its lease expired"

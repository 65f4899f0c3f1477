"""Waiting, written once for sync and async callers.

The waiting loops are generators that *describe* what to do next (ask the store, read the key, sleep
or watch for a while) and receive the answers; :func:`drive` carries them out with a sync store and
:func:`adrive` with an :class:`~dibs.stores.aio.AsyncStore`. So backoff, deadlines and the decision
of when to stop exist in one place, whichever world the caller lives in.

Delays follow capped exponential backoff with jitter (so a crowd of waiters spreads out instead of
stampeding the store), and never sleep past the holder's expiry (the earliest moment the answer can
change without a notification). Stores that notify wake waiters as soon as a key completes or is
released, so their backstop poll can be slow.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, TypeVar

from dibs.config import validate_seconds
from dibs.errors import ConfigurationError
from dibs.keys import Key
from dibs.records import Held, KeyState, StoreOutcome
from dibs.stores.base import Store, Watch

if TYPE_CHECKING:  # asyncio costs ~10 ms to import: only async callers pay for it
    from dibs.stores.aio import AsyncStore, AsyncWatch

__all__ = ["Backoff", "Deadline", "acquire_until", "adrive", "drive", "read_until"]

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Backoff:
    """Capped exponential backoff with jitter for polling a busy key.

    With the defaults a waiter asks at most about once per second once the cap is reached, and the
    cap rises to ``notify_maximum`` on stores that wake waiters themselves.
    """

    initial: float = 0.02
    maximum: float = 1.0
    multiplier: float = 2.0
    jitter: float = 0.25
    notify_maximum: float = 10.0

    def __post_init__(self) -> None:
        for name in ("initial", "maximum", "notify_maximum"):
            validate_seconds(f"backoff {name}", getattr(self, name))
        if not 0 < self.initial <= self.maximum <= self.notify_maximum:
            raise ConfigurationError(
                f"backoff needs 0 < initial <= maximum <= notify_maximum, got initial={self.initial}, "
                f"maximum={self.maximum}, notify_maximum={self.notify_maximum}"
            )
        if self.multiplier < 1 or not 0 <= self.jitter < 1:
            raise ConfigurationError(
                f"backoff needs multiplier >= 1 and 0 <= jitter < 1, got {self.multiplier}, {self.jitter}"
            )

    def delay(self, attempt: int, *, notifies: bool = False, rng: random.Random | None = None) -> float:
        cap = self.notify_maximum if notifies else self.maximum
        base = min(cap, self.initial * self.multiplier ** min(attempt, 64))
        spread = base * self.jitter
        return max(0.0, base - spread + (rng or random).random() * 2 * spread)


@dataclasses.dataclass
class Deadline:
    """A waiter's own timeout, on the local monotonic clock (a duration, never compared across hosts)."""

    timeout: float | None
    clock: Callable[[], float] = time.monotonic
    started: float = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.timeout = validate_seconds("timeout", self.timeout, allow_none=True, allow_zero=True)
        self.started = self.clock()

    @property
    def elapsed(self) -> float:
        return self.clock() - self.started

    @property
    def remaining(self) -> float | None:
        return None if self.timeout is None else max(0.0, self.timeout - self.elapsed)

    @property
    def expired(self) -> bool:
        remaining = self.remaining
        return remaining is not None and remaining <= 0


# The requests a waiting generator yields; the driver sends back the answer.
@dataclasses.dataclass(frozen=True)
class AskAcquire:
    key: Key
    owner: str
    ttl: float
    max_lease_age: float | None


@dataclasses.dataclass(frozen=True)
class AskRead:
    key: Key


@dataclasses.dataclass(frozen=True)
class Pause:
    seconds: float


Request = AskAcquire | AskRead | Pause
Loop = Generator[Request, object, T]


def _pause_for(
    backoff: Backoff, attempt: int, notifies: bool, holder_remaining: float, deadline: Deadline
) -> float:
    delay = backoff.delay(attempt, notifies=notifies)
    # Re-ask right after the holder's expiry: that moment can change the answer without any notification.
    delay = min(delay, holder_remaining + backoff.initial)
    remaining = deadline.remaining
    return delay if remaining is None else min(delay, remaining)


def acquire_until(
    ask: AskAcquire, deadline: Deadline, backoff: Backoff, *, notifies: bool
) -> Loop[tuple[StoreOutcome, int]]:
    """Ask until the answer is not :class:`Held` or the deadline passes; returns (last answer, polls)."""
    attempt = 0
    while True:
        outcome = yield ask
        assert isinstance(outcome, StoreOutcome), outcome
        if not isinstance(outcome, Held) or deadline.expired:
            return outcome, attempt
        yield Pause(_pause_for(backoff, attempt, notifies, outcome.lease.expires_at - outcome.now, deadline))
        attempt += 1


def read_until(
    key: Key, deadline: Deadline, backoff: Backoff, *, notifies: bool, for_artifact: bool
) -> Loop[KeyState]:
    """Read until the key is done (or also free, unless ``for_artifact``) or the deadline passes."""
    attempt = 0
    while True:
        state = yield AskRead(key)
        assert isinstance(state, KeyState), state
        done = state.artifact is not None or (not for_artifact and state.live_lease is None)
        if done or deadline.expired:
            return state
        lease = state.live_lease
        holder_remaining = lease.expires_at - state.now if lease is not None else backoff.maximum
        if for_artifact and lease is None:
            holder_remaining = backoff.maximum  # nobody is computing: nothing will notify an expiry
        yield Pause(_pause_for(backoff, attempt, notifies, holder_remaining, deadline))
        attempt += 1


def drive(loop: Loop[T], store: Store, watch: Watch) -> T:
    """Run a waiting loop against a sync store."""
    answer: object = None
    try:
        while True:
            request = loop.send(answer)
            if isinstance(request, AskAcquire):
                answer = store.acquire(request.key, request.owner, request.ttl, request.max_lease_age)
            elif isinstance(request, AskRead):
                answer = store.read(request.key)
            else:
                answer = watch.wait(request.seconds)
    except StopIteration as stop:
        result: T = stop.value
        return result


async def adrive(loop: Loop[T], store: AsyncStore, watch: AsyncWatch) -> T:
    """Run a waiting loop against an async store: the same decisions, awaited."""
    answer: object = None
    try:
        while True:
            request = loop.send(answer)
            if isinstance(request, AskAcquire):
                answer = await store.acquire(request.key, request.owner, request.ttl, request.max_lease_age)
            elif isinstance(request, AskRead):
                answer = await store.read(request.key)
            else:
                answer = await watch.wait(request.seconds)
    except StopIteration as stop:
        result: T = stop.value
        return result

"""Waiting, written once for sync and async callers (private: use ``Reservations.acquire``/``wait``).

The waiting loops are generators that *describe* what to do next (ask the store, read the key, or
pause until the watch hub delivers a change or some time has passed) and receive the answers;
:func:`drive` carries them out in a thread and :func:`adrive` on an event loop. So the decisions of
when to ask, when to stop and what a delivered change means exist in one place.

A change the hub delivers is the key's state, read once for every waiter on it: an artifact ends
the wait at once (no waiter asks the store), a lease still held by somebody else means waiting on,
and only a key that turned free makes the waiters ask (one of them wins it). A pause that ends with
nothing delivered is the backstop: the waiter asks itself. It never sleeps past the holder's expiry,
the one change no store announces.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Protocol, TypeVar

from dibs.backoff import Backoff, Deadline
from dibs.keys import Key
from dibs.records import Held, KeyState, Present, StoreOutcome
from dibs.stores.base import Store
from dibs.stores.requests import AcquireRequest

if TYPE_CHECKING:
    from dibs.hub import Subscription

__all__ = ["AskAcquire", "AskRead", "Pause", "acquire_until", "adrive", "drive", "read_until"]

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class AskAcquire:
    """Answered with the store's one-attempt ``acquire`` of ``key`` on ``request``'s terms."""

    key: Key
    request: AcquireRequest

    @property
    def refreshing(self) -> bool:
        """Whether no artifact that exists counts (a refresh: ``max_age`` 0)."""
        return self.request.max_age == 0.0

    def takes(self, state: KeyState) -> bool:
        """Whether ``state``'s artifact (if any) answers this ask."""
        return state.artifact is not None and self.request.takes(state.artifact, state.now)

    def sharing(self, fence: int, max_age: float | None) -> AskAcquire:
        """This ask after a refresh found the key busy under token ``fence``: the artifact that lease
        stores (or a later one, not ``max_age`` old) is the fresh one, so concurrent refreshes compute
        once, and share it."""
        request = dataclasses.replace(self.request, max_age=max_age, min_fence=fence)
        return dataclasses.replace(self, request=request)


@dataclasses.dataclass(frozen=True)
class AskRead:
    """Answered with the store's ``read``."""

    key: Key


@dataclasses.dataclass(frozen=True)
class Pause:
    """Answered with the key's state if the hub delivers a change within ``seconds``, else ``None``."""

    seconds: float


Request = AskAcquire | AskRead | Pause
Loop = Generator[Request, object, T]


def _pause_for(
    backoff: Backoff, attempt: int, following: bool, holder_remaining: float, deadline: Deadline
) -> float:
    delay = backoff.delay(attempt, notifies=following)
    # Ask right after the holder's expiry: that moment changes the answer without any notification.
    delay = min(delay, max(0.0, holder_remaining) + backoff.initial)
    remaining = deadline.remaining
    return delay if remaining is None else min(delay, remaining)


def acquire_until(
    ask: AskAcquire,
    deadline: Deadline,
    backoff: Backoff,
    following: Callable[[], bool],
    held: Callable[[Held], None] | None = None,
) -> Loop[StoreOutcome]:
    """Ask until the answer is not :class:`Held` or the deadline passes; returns the last answer.

    ``following()`` says whether the hub follows the store right now (then the backstop can be slow);
    ``held(answer)`` hears every busy answer, from an ask or a delivered change (who holds it now).
    """
    attempt = 0
    outcome = yield ask
    while True:
        assert isinstance(outcome, StoreOutcome), outcome
        if isinstance(outcome, Held) and held is not None:
            held(outcome)
        if not isinstance(outcome, Held) or deadline.expired:
            return outcome
        holder_remaining = outcome.lease.expires_at - outcome.now
        change = yield Pause(_pause_for(backoff, attempt, following(), holder_remaining, deadline))
        attempt += 1
        if change is None:
            outcome = yield ask  # the backstop, or the holder's expiry
            continue
        assert isinstance(change, KeyState), change
        if change.artifact is not None and ask.takes(change):
            return Present(change.artifact)  # done: every waiter gets the one read the hub made
        live = change.live_lease
        if live is not None and live.owner != ask.request.owner:
            outcome = Held(live, change.now, change.failure)  # changed hands, still busy: wait on
            continue
        outcome = yield ask  # free (released, expired) or ours: try to take it


def read_until(
    key: Key,
    deadline: Deadline,
    backoff: Backoff,
    following: Callable[[], bool],
    *,
    for_artifact: bool,
    max_age: float | None = None,
    min_fence: int | None = None,
) -> Loop[KeyState]:
    """Read until the key is done (or also free, unless ``for_artifact``) or the deadline passes."""
    attempt = 0
    state = yield AskRead(key)
    while True:
        assert isinstance(state, KeyState), state
        if is_settled(state, for_artifact, max_age, min_fence) or deadline.expired:
            return state
        lease = state.live_lease
        holder_remaining = lease.expires_at - state.now if lease is not None else backoff.maximum
        if for_artifact and lease is None:
            holder_remaining = backoff.maximum  # nobody is computing: no expiry to watch for
        change = yield Pause(_pause_for(backoff, attempt, following(), holder_remaining, deadline))
        attempt += 1
        state = change if change is not None else (yield AskRead(key))


def is_settled(
    state: KeyState, for_artifact: bool, max_age: float | None = None, min_fence: int | None = None
) -> bool:
    """Whether ``state`` ends a wait: a fresh artifact, or (unless ``for_artifact``) nobody holding
    the key."""
    artifact = state.artifact
    fresh = artifact is not None and artifact.is_fresh(state.now, max_age=max_age, min_fence=min_fence)
    return fresh or (not for_artifact and state.live_lease is None)


def drive(loop: Loop[T], store: Store, subscription: Subscription) -> T:
    """Run a waiting loop in this thread."""
    answer: object = None
    try:
        while True:
            request = loop.send(answer)
            if isinstance(request, AskAcquire):
                answer = store.acquire(request.key, request.request)
            elif isinstance(request, AskRead):
                answer = store.read(request.key)
            else:
                answer = subscription.wait(request.seconds)
    except StopIteration as stop:
        result: T = stop.value
        return result


class _AsyncIO(Protocol):
    async def acquire(self, ask: AskAcquire) -> StoreOutcome: ...

    async def read(self, key: Key) -> KeyState: ...


async def adrive(
    loop: Loop[T],
    io: _AsyncIO,
    subscription: Subscription,
    seen: Callable[[KeyState], None] | None = None,
) -> T:
    """Run a waiting loop on an event loop: the same decisions, awaited; the loop is never blocked.

    ``seen`` is shown every state of the key the loop reads or is notified of (a watcher's log of who
    holds the key); it must not raise.
    """
    answer: object = None
    try:
        while True:
            request = loop.send(answer)
            if isinstance(request, AskAcquire):
                answer = await io.acquire(request)
            elif isinstance(request, AskRead):
                answer = await io.read(request.key)
            else:
                answer = await subscription.wait_async(request.seconds)
            if seen is not None and isinstance(answer, KeyState):
                seen(answer)
    except StopIteration as stop:
        result: T = stop.value
        return result

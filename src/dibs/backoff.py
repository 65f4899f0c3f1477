"""How often a waiter asks again, how long it is willing to wait at all, and how long it rides out
a store that cannot be reached.

Delays follow capped exponential backoff with jitter, so a crowd of waiters spreads out instead of
stampeding the store. When the process's watch hub is following the store's changes (see
:mod:`dibs.hub`), a waiter is woken by the hub and its own asking is only a backstop: it starts at
``maximum`` and grows to ``notify_maximum``. Starting the backstop as fast as ordinary polling would
have every one of a thousand deferred tasks ask the store five times in its first second, and queue
those reads in front of the hand-off they are waiting for.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable

from dibs.config import validate_seconds
from dibs.errors import ConfigurationError

__all__ = ["DEFAULT_OUTAGE_PATIENCE", "Backoff", "Deadline", "Outage", "Retrying"]

#: Seconds a waiter keeps waiting while its store cannot be reached: a routine restart, or a managed
#: database's failover (20 to 60 s on the large clouds), passes without failing anybody's wait.
DEFAULT_OUTAGE_PATIENCE = 60.0


@dataclasses.dataclass(frozen=True)
class Backoff:
    """Capped exponential backoff with jitter for asking about a busy key again.

    With the defaults a polling waiter asks after 20 ms, 40 ms, ... and at most about once per second
    once the cap is reached; while the watch hub follows the store for it, after about 1 s, 2 s, 4 s,
    8 s, then every ten seconds or so.
    """

    initial: float = 0.02
    maximum: float = 1.0
    multiplier: float = 2.0
    jitter: float = 0.25
    notify_maximum: float = 10.0

    def __post_init__(self) -> None:
        for name in ("initial", "maximum", "notify_maximum"):
            validate_seconds(f"backoff {name}", getattr(self, name))
        numbers = (self.multiplier, self.jitter)
        if any(isinstance(n, bool) or not isinstance(n, int | float) or n != n for n in numbers):  # noqa: PLR0124
            raise ConfigurationError(f"backoff settings must be numbers, got {self!r}")
        if not 0 < self.initial <= self.maximum <= self.notify_maximum:
            raise ConfigurationError(
                f"backoff needs 0 < initial <= maximum <= notify_maximum < inf, got initial={self.initial}, "
                f"maximum={self.maximum}, notify_maximum={self.notify_maximum}"
            )
        if self.multiplier < 1 or not 0 <= self.jitter < 1:
            raise ConfigurationError(
                f"backoff needs multiplier >= 1 and 0 <= jitter < 1, got {self.multiplier}, {self.jitter}"
            )

    def delay(self, attempt: int, *, notifies: bool = False, rng: random.Random | None = None) -> float:
        """Seconds to wait before the ``attempt``-th question (0-based); ``notifies``: the hub follows
        the store for this waiter, so the question is only a backstop."""
        first, cap = (self.maximum, self.notify_maximum) if notifies else (self.initial, self.maximum)
        base = min(cap, first * self.multiplier ** min(attempt, 64))
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


@dataclasses.dataclass(frozen=True)
class Outage:
    """How a waiter rides out a store that cannot be reached (contract: "Outages are ridden out where
    nothing is at stake").

    A waiter holds nothing: while the store is down it keeps waiting, asking again after pauses that
    grow from ``backoff.initial`` to ``backoff.maximum`` (so it is back within about that long after
    the store is), for at most ``patience`` seconds of one outage (``None``: as long as its own
    timeout allows), never beyond its own timeout. Only the first ask of a call applies
    ``on_store_unavailable`` instead: nothing is known yet, and a store that was never reached may
    be a wrong URL rather than an outage.
    """

    patience: float | None = DEFAULT_OUTAGE_PATIENCE
    backoff: Backoff = dataclasses.field(
        default_factory=lambda: Backoff(initial=0.1, maximum=2.0, notify_maximum=2.0)
    )

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "patience",
            validate_seconds("outage_patience", self.patience, allow_none=True, allow_zero=True),
        )
        if not isinstance(self.backoff, Backoff):
            raise ConfigurationError(f"an outage's backoff must be a dibs.Backoff, got {self.backoff!r}")

    def riding(self, deadline: Deadline | None = None) -> Retrying:
        """One outage as it happens: :meth:`Retrying.pause` says how long to wait before asking again,
        or ``None`` when this outage has lasted too long (or ``deadline`` passed)."""
        return Retrying(self.backoff, self.patience, deadline)


class Retrying:
    """The pauses of one run of retries: growing with the backoff, for at most ``patience`` seconds
    (``None``: no limit of its own) and never past ``deadline``. Every retry loop of dibs takes its
    pauses from one of these (a waiter riding out an outage, a complete whose reply was lost, a
    contended SQLite switching to WAL), so how dibs waits is decided in one place."""

    __slots__ = ("_attempt", "_backoff", "_deadline", "_patience", "clock", "started")

    def __init__(
        self,
        backoff: Backoff,
        patience: float | None,
        deadline: Deadline | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._backoff, self._patience, self._deadline = backoff, patience, deadline
        self.clock = clock
        self.started = clock()
        self._attempt = 0

    @property
    def seconds(self) -> float:
        """How long these retries have lasted."""
        return self.clock() - self.started

    @property
    def attempts(self) -> int:
        """How many pauses were handed out."""
        return self._attempt

    def pause(self) -> float | None:
        """Seconds to wait before the next attempt, or ``None``: stop, the time is up."""
        left = None if self._patience is None else self._patience - self.seconds
        if self._deadline is not None:
            remaining = self._deadline.remaining
            if remaining is not None:
                left = remaining if left is None else min(left, remaining)
        if left is not None and left <= 0:
            return None
        delay = self._backoff.delay(self._attempt)
        self._attempt += 1
        return delay if left is None else min(delay, left)

    def sleep(self) -> bool:
        """Wait out :meth:`pause` in this thread; ``False`` when the time is up (nothing waited)."""
        delay = self.pause()
        if delay is None:
            return False
        time.sleep(delay)
        return True

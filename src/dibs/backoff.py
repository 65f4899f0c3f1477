"""How often a waiter asks again, and how long it is willing to wait at all.

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

__all__ = ["Backoff", "Deadline"]


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

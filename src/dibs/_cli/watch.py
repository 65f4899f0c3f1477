"""What a waiter shows while it waits: who holds the key, for how long, and what changes.

The main thread waits with one call of the public API (``acquire`` or ``wait``), so the timeout,
its message and the wake-ups are exactly the core's. Meanwhile, when anybody follows (a terminal,
or ``-v``), a :class:`KeyWatch` thread reads the key once a second and reports through the
:class:`~dibs._cli.console.Console`: the live line (holder, attempt, time until the holder's lease
expires, time waited) and events: a takeover of an expired lease, a holder that failed, the key
left failed with nobody computing it. Times come from the store's clock; only the time waited is
measured here.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from types import TracebackType
from typing import Any

from dibs._cli.console import Console
from dibs.client import Reservations
from dibs.display import duration
from dibs.errors import ReservationError
from dibs.keys import Key
from dibs.outcomes import Busy
from dibs.records import FailureRecord, KeyState

__all__ = ["KeyWatch", "Sight"]

log = logging.getLogger("dibs")

#: How often the watch reads the key (and redraws the live line).
POLL_SECONDS = 1.0
#: How much of a failure's text the live line shows (events show all of it).
_SHORT_ERROR = 60


@dataclasses.dataclass(frozen=True)
class Sight:
    """One look at the key, on the store's clock."""

    holder: str | None
    live: bool
    attempt: int
    since: float
    expires_at: float
    now: float
    failure: FailureRecord | None
    done: bool = False

    @classmethod
    def of_busy(cls, busy: Busy) -> Sight:
        return cls(busy.holder, True, busy.attempt, busy.since, busy.expires_at, busy.now, busy.last_failure)

    @classmethod
    def of_state(cls, state: KeyState) -> Sight:
        lease = state.lease
        if lease is None:
            return cls(
                None, False, 0, state.now, state.now, state.now, state.failure, state.artifact is not None
            )
        return cls(
            lease.owner,
            lease.live_at(state.now),
            lease.attempt,
            lease.acquired_at,
            lease.expires_at,
            state.now,
            state.failure,
            state.artifact is not None,
        )


class KeyWatch:
    """Follows ``key`` in a thread while the main thread waits (a no-op when nobody follows)."""

    def __init__(self, console: Console, client: Reservations, key: Key, *, me: str | None = None) -> None:
        self.console = console
        self.client = client
        self.key = key
        self.me = me  # the waiter's own owner: its own lease is the end of the wait, not news
        self.started = time.monotonic()
        self.last: Sight | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> KeyWatch:
        if self.console.watching:
            self._thread = threading.Thread(target=self._follow, name="dibs-cli-watch", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.console.clear_status()

    @property
    def waited(self) -> float:
        return time.monotonic() - self.started

    def see(self, sight: Sight) -> None:
        """Report what changed since the last look, and redraw the live line."""
        if not self.console.watching:
            self.last = sight
            return
        with self._lock:
            before, self.last = self.last, sight
            if sight.done or (self.me is not None and sight.holder == self.me):
                return  # the waiter says how it ended
            if before is None:
                self._first(sight)
            else:
                self._changed(before, sight)
            self.console.status(*self._status(sight))

    def _follow(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            try:
                state = self.client.status(self.key)
            except ReservationError as exc:
                self.console.status(
                    f"dibs: waiting for {self.key}", "the store does not answer", f"waited {self._w()}"
                )
                log.debug("the watch of %s could not read it: %s", self.key, exc)
                continue
            if not self._stop.is_set():
                self.see(Sight.of_state(state))

    # -- events ----------------------------------------------------------------------------------
    def _first(self, s: Sight) -> None:
        key, fields = self.key, self._fields(s)
        if s.live:
            self.console.event(
                "waiting",
                f"{key}: {s.holder!r} is computing it (attempt {s.attempt}, for {duration(s.now - s.since)}; "
                f"its lease expires in {duration(s.expires_at - s.now)} unless renewed); waiting",
                **fields,
            )
        elif s.holder is not None:
            self.console.event(
                "expired",
                f"{key}: the lease of {s.holder!r} expired {duration(s.now - s.expires_at)} ago; "
                "the next caller takes over",
                **fields,
            )
        elif s.failure is not None:
            self.console.event(
                "failed",
                f"{key}: not computed: its last attempt failed ({_failure(s.failure, s.now)}); waiting "
                "until someone computes it",
                notable=True,
                **fields,
            )
        else:
            self.console.event(
                "waiting", f"{key}: not computed yet, and nobody is computing it; waiting", **fields
            )

    def _changed(self, b: Sight, s: Sight) -> None:
        key, fields = self.key, self._fields(s)
        new_failure = s.failure is not None and s.failure != b.failure
        if s.live and s.holder != b.holder:
            if b.holder is None:
                self.console.event(
                    "started", f"{key}: {s.holder!r} started computing it (attempt {s.attempt})", **fields
                )
            elif new_failure and s.failure is not None and s.failure.owner == b.holder:
                self.console.event(
                    "failed",
                    f"{key}: {b.holder!r} failed ({s.failure.error}); {s.holder!r} is computing it now "
                    f"(attempt {s.attempt})",
                    notable=True,
                    **fields,
                )
            elif s.since >= b.expires_at:
                self.console.event(
                    "takeover",
                    f"{key}: {s.holder!r} took over from {b.holder!r}, whose lease expired "
                    f"(attempt {s.attempt})",
                    notable=True,
                    **fields,
                )
            else:
                self.console.event(
                    "holder",
                    f"{key}: {b.holder!r} let go of it; {s.holder!r} is computing it now "
                    f"(attempt {s.attempt})",
                    notable=True,
                    **fields,
                )
        elif not s.live and s.holder is not None and b.live:
            self.console.event(
                "expired",
                f"{key}: the lease of {s.holder!r} expired (it stopped renewing it); the next caller "
                "takes over",
                notable=True,
                **fields,
            )
        elif s.holder is None and new_failure and s.failure is not None:
            self.console.event(
                "failed",
                f"{key}: {s.failure.owner!r} failed ({s.failure.error}); waiting until someone computes it",
                notable=True,
                **fields,
            )

    # -- the live line ---------------------------------------------------------------------------
    def _status(self, s: Sight) -> tuple[str, ...]:
        """The live line, most important first (the console keeps what fits the terminal)."""
        head = f"dibs: waiting for {self.key}"
        if s.live:
            return (
                head,
                f"held by {s.holder}",
                f"lease expires in {duration(s.expires_at - s.now)}",
                f"waited {self._w()}",
                f"attempt {s.attempt}",
            )
        if s.holder is not None:
            return (
                head,
                f"the lease of {s.holder} expired {duration(s.now - s.expires_at)} ago",
                f"waited {self._w()}",
            )
        if s.failure is not None:
            return head, f"last attempt failed: {_shorten(s.failure.error)}", f"waited {self._w()}"
        return head, "nobody is computing it yet", f"waited {self._w()}"

    def _w(self) -> str:
        return duration(self.waited)

    def _fields(self, s: Sight) -> dict[str, Any]:
        fields: dict[str, Any] = {"key": str(self.key), "waited": round(self.waited, 3)}
        if s.holder is not None:
            fields |= {
                "holder": s.holder,
                "attempt": s.attempt,
                "expires_in": round(s.expires_at - s.now, 3),
            }
        if s.failure is not None:
            fields |= {"last_failure": s.failure.error, "failed_by": s.failure.owner}
        return fields


def _failure(failure: FailureRecord, now: float) -> str:
    return (
        f"{failure.count} failure(s); the last by {failure.owner!r}, {duration(now - failure.at)} ago: "
        f"{failure.error}"
    )


def _shorten(text: str) -> str:
    first = text.splitlines()[0] if text else ""
    if len(first) <= _SHORT_ERROR:
        return first
    cut = first[:_SHORT_ERROR]
    return (cut[: cut.rindex(" ")] if " " in cut else cut) + "…"

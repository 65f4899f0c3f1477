"""SIGINT, SIGTERM and SIGHUP: how the ``dibs`` command stops.

A stop is never a traceback. While the command only waits or reads, a stop signal raises
:class:`Stopped` in the main thread: the wait ends, and ``dibs`` exits with the shell's status for
that signal (130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP). While ``dibs run`` holds a lease,
the signal is *deferred* instead: it is handed to the running command (whose process group gets
the same signal), and the code in charge stops at its next safe point, after the command has
exited and the lease has been released with the stop recorded.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType, TracebackType
from typing import Any

__all__ = ["STOP_SIGNALS", "StopSignals", "Stopped", "signal_name"]

#: The signals that stop ``dibs`` (SIGHUP where the platform has it: a closed terminal).
STOP_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class Stopped(BaseException):
    """A stop signal ended what the command was doing. A ``BaseException``, like ``KeyboardInterrupt``,
    so that no ``except Exception`` on the way turns it into an ordinary error."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal_name(signum))
        self.signum = signum

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


#: Called (in the main thread) with the signal and whether it is the first stop signal received.
OnSignal = Callable[[int, bool], None]


class StopSignals:
    """The stop-signal handlers of one ``dibs`` invocation (installed only in the main thread)."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._on_signal: OnSignal | None = None
        self._deferring = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    @contextlib.contextmanager
    def deferred(self, on_signal: OnSignal | None = None) -> Iterator[None]:
        """Within the block a stop signal does not raise: it is recorded in :attr:`received` and
        handed to ``on_signal``; the block checks :attr:`received` at its safe points."""
        previous = self._deferring, self._on_signal
        self._deferring, self._on_signal = True, on_signal
        try:
            yield
        finally:
            self._deferring, self._on_signal = previous

    def raise_if_received(self) -> None:
        """Honour a stop that arrived while deferred, now that it is safe to stop."""
        if self.received is not None:
            raise Stopped(self.received)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        first = self.received is None
        if first:
            self.received = signum
        if not self._deferring:
            raise Stopped(signum)
        if self._on_signal is not None:
            self._on_signal(signum, first)

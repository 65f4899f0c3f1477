"""Points recorded on a thread of their own, off the caller's path.

An OpenTelemetry SDK spends microseconds on each measurement (attribute checks, aggregation, locks):
a handful per compute-once call would add tens of percent to a fast store's reserve + complete. The
caller only appends its points to a queue; one daemon thread per process, woken by the first point
after a quiet spell, hands them to the SDK a moment later in a batch. Exports run every few seconds
at the soonest, so nothing a dashboard shows is delayed; :meth:`Later.flush` records what is queued
at once (tests, and at interpreter exit).
"""

from __future__ import annotations

import atexit
import collections
import os
import threading
from collections.abc import Callable, Iterable

from dibs.observers.measures import Measurement

__all__ = ["Later"]

#: How long the recorder lets points gather after the first one wakes it (seconds).
BATCH_DELAY = 0.01


class Later:
    """Queue measurements now, record them through ``record`` soon (in order, on one thread)."""

    def __init__(self, record: Callable[[Measurement], None]) -> None:
        self._record = record
        self._queue: collections.deque[Measurement] = collections.deque()
        self._wake = threading.Event()
        self._flushing = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = 0
        atexit.register(self.flush)

    def put(self, points: Iterable[Measurement]) -> None:
        self._queue.extend(points)
        if not self._wake.is_set():  # the recorder clears it before each batch: set once per batch
            if self._pid != os.getpid():  # first use, or a forked child (its parent's thread is gone)
                self._start()
            self._wake.set()

    def _start(self) -> None:
        with self._flushing:
            if self._pid == os.getpid():
                return
            self._pid = os.getpid()
            self._thread = threading.Thread(target=self._run, name="dibs-metrics", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            threading.Event().wait(BATCH_DELAY)  # let the call's other points arrive
            self.flush()

    def flush(self) -> None:
        """Record every queued point now."""
        with self._flushing:
            queue = self._queue
            while queue:
                point = queue.popleft()
                try:
                    self._record(point)
                except Exception:  # an SDK that fails on one point must not lose the rest
                    continue

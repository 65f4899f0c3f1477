"""Points recorded on a thread of their own, off the caller's path.

An OpenTelemetry SDK spends microseconds on each measurement (attribute checks, aggregation, locks):
a handful per compute-once call would add tens of percent to a fast store's reserve + complete. The
caller only appends its points to a queue; one daemon thread per process, woken by the first point
after a quiet spell, hands them to the SDK a moment later in a batch. Exports run every few seconds
at the soonest, so nothing a dashboard shows is delayed; :meth:`Later.flush` records what is queued
at once (tests, and at interpreter exit).

The caller may queue its events instead (:meth:`Later.put_event`): turning them into points
(:class:`~dibs.observers.measures.Measurer`, several microseconds per event) then happens on the
recorder's thread too, in order, so the caller's path is one ``deque.append`` per event.

Points of an *additive* metric (a counter, an up-down counter) with the same attributes in one batch
are recorded as one, their sum, and not at all when it is 0 (once the series has its first point,
so that a reader shows it): what any reader collects is the same sum. The uncontended call's
``dibs.leases.active`` +1 and -1 then cost the SDK nothing (each recorded point costs it 6 to 14 µs,
on a thread that shares the interpreter with the callers).
"""

from __future__ import annotations

import atexit
import collections
import os
import threading
import weakref
from collections.abc import Callable, Collection, Iterable

from dibs.events import Event
from dibs.observers.measures import Measurement

__all__ = ["Later"]

#: How long the recorder lets points gather after the first one wakes it (seconds).
BATCH_DELAY = 0.01


class Later:
    """Queue measurements (or events, for ``measure``) now, record them through ``record`` soon (in
    order, on one thread)."""

    def __init__(
        self,
        record: Callable[[Measurement], None],
        additive: Collection[str] = frozenset(),
        measure: Callable[[Event], Iterable[Measurement] | None] | None = None,
        *,
        in_child: Callable[[], None] | None = None,
    ) -> None:
        self._record = record
        self._additive = additive  # names of the metrics whose points are summed (see the docstring)
        self._measure = measure
        self._in_child = in_child
        self._series: set[tuple[str, tuple[tuple[str, str], ...]]] = set()  # additive series recorded
        self._queue: collections.deque[Measurement | Event] = collections.deque()
        self._wake = threading.Event()
        self._flushing = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = 0
        _EVERY.add(self)

    def after_fork_in_child(self) -> None:
        """Start afresh in a forked child (``os.register_at_fork``; ``in_child`` too).

        The child has a copy of the parent's state but not its recorder thread: the wake-up may be
        copied set (no recorder would ever be started), the lock copied held by the parent's
        recorder mid-batch (the child's first point would wait forever), and the queue holds the
        parent's points and events, which the parent records itself (recorded here too, they would
        count twice and end the parent's spans a second time)."""
        self._queue.clear()
        self._wake = threading.Event()
        self._flushing = threading.Lock()
        self._thread = None
        self._pid = 0
        if self._in_child is not None:
            self._in_child()

    def put(self, points: Iterable[Measurement]) -> None:
        self._queue.extend(points)
        self._wake_up()

    def put_event(self, event: Event) -> None:
        """Queue ``event``; its points (``measure(event)``) are computed and recorded soon."""
        self._queue.append(event)
        if not self._wake.is_set():  # as _wake_up, inline: this runs for every event, on the caller's path
            self._wake_up()

    def _wake_up(self) -> None:
        if not self._wake.is_set():  # the recorder clears it before each batch: set once per batch
            if self._pid != os.getpid():  # first use, or a forked child (its parent's thread is gone)
                self._start()
            self._wake.set()

    def _start(self) -> None:
        with self._flushing:
            if self._pid == os.getpid():
                return
            self._pid = os.getpid()
            # The exit flush is registered at the first point, not when the observer was made: exit
            # hooks run last-registered first, so it runs before the shutdown hook of an SDK provider
            # the application set up in between (which would drop what is flushed after it).
            atexit.unregister(self.flush)
            atexit.register(self.flush)
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
                batch = self._points([queue.popleft() for _ in range(len(queue))])
                for point in self._summed(batch) if self._additive else batch:
                    try:
                        self._record(point)
                    except Exception:  # an SDK that fails on one point must not lose the rest
                        continue

    def _points(self, items: list[Measurement | Event]) -> list[Measurement]:
        points: list[Measurement] = []
        for item in items:
            if isinstance(item, Measurement):
                points.append(item)
            elif self._measure is not None:
                try:
                    points.extend(self._measure(item) or ())
                except Exception:  # one event that cannot be measured must not lose the rest
                    continue
        return points

    def _summed(self, batch: list[Measurement]) -> Iterable[Measurement]:
        """``batch`` with each additive metric's points of the same attributes summed into one (at
        the first one's place), and sums of 0 left out once their series exists (a reader shows a
        series only after its first point: ``dibs.leases.active`` must read 0, not "no data")."""
        sums: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}  # -> index in ``out``
        out: list[Measurement] = []
        keys: list[tuple[str, tuple[tuple[str, str], ...]] | None] = []
        for point in batch:
            if point.name not in self._additive:
                out.append(point)
                keys.append(None)
                continue
            key = (point.name, tuple(point.attributes.items()))
            index = sums.get(key)
            if index is None:
                sums[key] = len(out)
                out.append(point)
                keys.append(key)
            else:
                first = out[index]
                out[index] = Measurement(point.name, first.value + point.value, first.attributes)
        kept: list[Measurement] = []
        for point, series in zip(out, keys, strict=True):
            if series is not None:
                if point.value == 0 and series in self._series:
                    continue
                self._series.add(series)
            kept.append(point)
        return kept


#: Every recorder of the process, reset in a forked child (see :meth:`Later.after_fork_in_child`).
_EVERY: weakref.WeakSet[Later] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for later in list(_EVERY):
        later.after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)

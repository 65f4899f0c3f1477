"""The flow's events as measurements: the metric names, units and attributes, decided once.

Every exporter (OpenTelemetry, Airflow's ``Stats``) takes its points from :class:`Measurer`, so a
dashboard built on one name works with each. Attributes never carry a key, run id or token: those
would give every call its own time series (they go on spans, see :mod:`dibs.observers.otel`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping
from typing import Literal

from dibs import events
from dibs.events import Event

__all__ = ["METRICS", "Measurement", "Measurer", "Metric"]

Kind = Literal["counter", "histogram", "updown"]


@dataclasses.dataclass(frozen=True)
class Metric:
    """One instrument: its kind, unit (UCUM, as OpenTelemetry names them) and what it measures."""

    kind: Kind
    unit: str
    description: str
    #: The attributes it may carry besides the common ones (``dibs.namespace``, ``dibs.store``,
    #: ``dibs.frontend``).
    attributes: tuple[str, ...] = ()


#: Every metric dibs emits; docs/observability.md and the Grafana dashboard are checked against it.
METRICS: Mapping[str, Metric] = {
    "dibs.reservation.outcomes": Metric(
        "counter", "{call}", "Compute-once calls by how they ended", ("dibs.outcome",)
    ),
    "dibs.compute.duration": Metric("histogram", "s", "How long the work ran under a lease"),
    "dibs.wait.duration": Metric(
        "histogram", "s", "How long each waiter sat idle on another holder", ("dibs.outcome",)
    ),
    "dibs.handoff.duration": Metric("histogram", "s", "From the artifact's storing to each waiter's return"),
    "dibs.compute.saved": Metric(
        "counter", "s", "The producer's compute time, credited to every waiter and hit that used its artifact"
    ),
    "dibs.store.operation.duration": Metric(
        "histogram", "s", "How long each store operation took", ("dibs.store.operation", "error.type")
    ),
    "dibs.heartbeat.lateness": Metric("histogram", "s", "How late each heartbeat ran against its interval"),
    "dibs.lease.lost": Metric("counter", "{lease}", "Leases lost while their work ran", ("dibs.reason",)),
    "dibs.leases.active": Metric("updown", "{lease}", "Leases held by this process now"),
    "dibs.waiters.active": Metric("updown", "{call}", "Calls of this process waiting on another holder now"),
}


@dataclasses.dataclass(frozen=True, slots=True)
class Measurement:
    """One point: add ``value`` to a counter, or record it in a histogram."""

    name: str
    value: float
    attributes: Mapping[str, str]


class Measurer:
    """Turns one event into its measurements, remembering which calls of this process hold a lease
    or wait (for the two ``.active`` counters). Safe to call from any thread."""

    def __init__(self) -> None:
        self._leased: set[int] = set()
        self._waiting: set[int] = set()
        self._lock = threading.Lock()

    def __call__(self, event: Event) -> list[Measurement]:
        common = _common(event)
        out: list[Measurement] = []

        def point(name: str, value: float, **extra: str) -> None:
            attributes = common if not extra else {**common, **{_attr(k): v for k, v in extra.items()}}
            out.append(Measurement(name, value, attributes))

        match event:
            case events.StoreOperation():
                extra = {"dibs_store_operation": event.operation}
                if event.error_type is not None:
                    extra["error_type"] = event.error_type
                point("dibs.store.operation.duration", event.seconds, **extra)
            case events.Finished():
                point("dibs.reservation.outcomes", 1, dibs_outcome=event.outcome)
                if event.waited_on is not None:
                    point("dibs.wait.duration", event.waited_seconds, dibs_outcome=event.outcome)
                if self._left(self._leased, event.call):
                    point("dibs.leases.active", -1)
                if self._left(self._waiting, event.call):
                    point("dibs.waiters.active", -1)
            case events.KeyBusy():
                if self._entered(self._waiting, event.call):
                    point("dibs.waiters.active", 1)
            case events.Waited() | events.Deferred():
                if self._left(self._waiting, event.call):
                    point("dibs.waiters.active", -1)
            case events.LeaseAcquired():
                if self._entered(self._leased, event.call):
                    point("dibs.leases.active", 1)
            case events.ArtifactStored() | events.NotStored():
                point("dibs.compute.duration", event.compute_seconds)
            case events.ArtifactFound():
                if event.compute_seconds is not None:
                    point("dibs.compute.saved", event.compute_seconds)
                if event.waited:
                    point("dibs.handoff.duration", max(0.0, event.at - event.stored_at))
            case events.LostLease():
                point("dibs.lease.lost", 1, dibs_reason=event.reason)
            case events.HeartbeatSent():
                point("dibs.heartbeat.lateness", event.lateness)
        return out

    def _entered(self, calls: set[int], call: int) -> bool:
        with self._lock:
            if call in calls:
                return False
            calls.add(call)
            return True

    def _left(self, calls: set[int], call: int) -> bool:
        with self._lock:
            if call not in calls:
                return False
            calls.discard(call)
            return True


def _common(event: Event) -> dict[str, str]:
    attributes = {"dibs.namespace": event.key.namespace}
    if event.store:
        attributes["dibs.store"] = event.store
    if event.frontend:
        attributes["dibs.frontend"] = event.frontend
    return attributes


def _attr(name: str) -> str:
    """``dibs_store_operation`` → ``dibs.store.operation`` (keyword arguments cannot hold dots)."""
    return name.replace("_", ".")

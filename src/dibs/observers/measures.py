"""The flow's events as measurements: the metric names, units and attributes, decided once.

Every exporter (OpenTelemetry, Airflow's ``Stats``) takes its points from :class:`Measurer`, so a
dashboard built on one name works with each. Attributes never carry a key, run id or token: those
would give every call its own time series (they go on spans, see :mod:`dibs.observers.otel`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping
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
    "dibs.reservation.not_stored": Metric(
        "counter",
        "{call}",
        "Calls that computed a value under a lease but could not store it",
        ("dibs.reason",),
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
    "dibs.store.outages": Metric(
        "counter",
        "{outage}",
        "Store outages a waiter rode out (it kept waiting while the store was unreachable)",
    ),
    "dibs.store.outage.duration": Metric(
        "histogram", "s", "How long the store stayed unreachable for a waiter that rode it out"
    ),
}


@dataclasses.dataclass(frozen=True, slots=True)
class Measurement:
    """One point: add ``value`` to a counter, or record it in a histogram."""

    name: str
    value: float
    attributes: Mapping[str, str]


class Measurer:
    """Turns one event into its measurements, remembering which calls of this process hold a lease
    or wait (for the two ``.active`` counters). Safe to call from any thread.

    It runs on the caller's path for every event, so it dispatches on the event's type with one dict
    lookup and reuses each (namespace, store, front end)'s attributes. :data:`KINDS` are the kinds of
    event it measures: an exporter that only measures asks for those (``kinds``), and a call then
    builds no other event for it.
    """

    #: The kinds of event that give measurements (the store operations among them).
    KINDS: frozenset[type[Event]] = frozenset(
        {
            events.StoreOperation,
            events.Finished,
            events.KeyBusy,
            events.Waited,
            events.Deferred,
            events.LeaseAcquired,
            events.ArtifactStored,
            events.NotStored,
            events.ArtifactFound,
            events.LostLease,
            events.HeartbeatSent,
            events.StoreUnreachable,
            events.StoreReachable,
        }
    )

    def __init__(self) -> None:
        self._leased: set[int] = set()
        self._waiting: set[int] = set()
        self._lock = threading.Lock()
        self._commons: dict[tuple[str, str, str], dict[str, str]] = {}
        self._extra: dict[tuple[int, str, str], dict[str, str]] = {}
        self._dispatch: dict[type[Event], Callable[[Event, dict[str, str], list[Measurement]], None]] = {
            events.StoreOperation: self._store_operation,  # type: ignore[dict-item]
            events.Finished: self._finished,  # type: ignore[dict-item]
            events.KeyBusy: self._key_busy,
            events.Waited: self._wait_ended,
            events.Deferred: self._wait_ended,
            events.LeaseAcquired: self._lease_acquired,
            events.ArtifactStored: self._computed,  # type: ignore[dict-item]
            events.NotStored: self._not_stored,  # type: ignore[dict-item]
            events.ArtifactFound: self._found,  # type: ignore[dict-item]
            events.LostLease: self._lost,  # type: ignore[dict-item]
            events.HeartbeatSent: self._beat,  # type: ignore[dict-item]
            events.StoreUnreachable: self._outage,
            events.StoreReachable: self._outage_over,  # type: ignore[dict-item]
        }
        assert frozenset(self._dispatch) == self.KINDS

    def __call__(self, event: Event) -> list[Measurement]:
        handle = self._dispatch.get(type(event))
        out: list[Measurement] = []
        if handle is not None:
            handle(event, self._common(event), out)
        return out

    def _common(self, event: Event) -> dict[str, str]:
        which = (event.key.namespace, event.store, event.frontend)
        found = self._commons.get(which)
        if found is None:
            found = {"dibs.namespace": which[0]}
            if which[1]:
                found["dibs.store"] = which[1]
            if which[2]:
                found["dibs.frontend"] = which[2]
            # Two threads may build one at once: only the dict kept in ``_commons`` is ever used, so
            # the identity ``_with`` keys on stays alive (a dropped one's address could be reused).
            found = self._commons.setdefault(which, found)
        return found

    def _with(self, common: dict[str, str], name: str, value: str) -> dict[str, str]:
        # ``common`` is one of ``_commons``' dicts, kept for good: its identity names it.
        which = (id(common), name, value)
        found = self._extra.get(which)
        if found is None:
            found = self._extra[which] = {**common, name: value}
        return found

    def _store_operation(
        self, event: events.StoreOperation, common: dict[str, str], out: list[Measurement]
    ) -> None:
        attributes = self._with(common, "dibs.store.operation", event.operation)
        if event.error_type is not None:
            attributes = {**attributes, "error.type": event.error_type}
        out.append(Measurement("dibs.store.operation.duration", event.seconds, attributes))

    def _finished(self, event: events.Finished, common: dict[str, str], out: list[Measurement]) -> None:
        attributes = self._with(common, "dibs.outcome", event.outcome)
        out.append(Measurement("dibs.reservation.outcomes", 1, attributes))
        if event.waited_on is not None:
            out.append(Measurement("dibs.wait.duration", event.waited_seconds, attributes))
        if self._left(self._leased, event.call):
            out.append(Measurement("dibs.leases.active", -1, common))
        if self._left(self._waiting, event.call):
            out.append(Measurement("dibs.waiters.active", -1, common))

    def _key_busy(self, event: Event, common: dict[str, str], out: list[Measurement]) -> None:
        if self._entered(self._waiting, event.call):
            out.append(Measurement("dibs.waiters.active", 1, common))

    def _wait_ended(self, event: Event, common: dict[str, str], out: list[Measurement]) -> None:
        if self._left(self._waiting, event.call):
            out.append(Measurement("dibs.waiters.active", -1, common))

    def _lease_acquired(self, event: Event, common: dict[str, str], out: list[Measurement]) -> None:
        if self._entered(self._leased, event.call):
            out.append(Measurement("dibs.leases.active", 1, common))

    def _computed(
        self, event: events.ArtifactStored | events.NotStored, common: dict[str, str], out: list[Measurement]
    ) -> None:
        out.append(Measurement("dibs.compute.duration", event.compute_seconds, common))

    def _not_stored(self, event: events.NotStored, common: dict[str, str], out: list[Measurement]) -> None:
        self._computed(event, common, out)
        out.append(
            Measurement("dibs.reservation.not_stored", 1, self._with(common, "dibs.reason", event.reason))
        )

    def _found(self, event: events.ArtifactFound, common: dict[str, str], out: list[Measurement]) -> None:
        if event.compute_seconds is not None:
            out.append(Measurement("dibs.compute.saved", event.compute_seconds, common))
        if event.waited:
            out.append(Measurement("dibs.handoff.duration", max(0.0, event.at - event.stored_at), common))

    def _lost(self, event: events.LostLease, common: dict[str, str], out: list[Measurement]) -> None:
        out.append(Measurement("dibs.lease.lost", 1, self._with(common, "dibs.reason", event.reason)))

    def _beat(self, event: events.HeartbeatSent, common: dict[str, str], out: list[Measurement]) -> None:
        out.append(Measurement("dibs.heartbeat.lateness", event.lateness, common))

    def _outage(self, event: Event, common: dict[str, str], out: list[Measurement]) -> None:
        out.append(Measurement("dibs.store.outages", 1, common))

    def _outage_over(
        self, event: events.StoreReachable, common: dict[str, str], out: list[Measurement]
    ) -> None:
        out.append(Measurement("dibs.store.outage.duration", event.seconds, common))

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

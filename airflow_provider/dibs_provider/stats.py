"""dibs's measurements through Airflow's own ``Stats``: a deployment's StatsD, OpenTelemetry or Datadog
setup shows them beside Airflow's metrics.

The measurements are the ones :mod:`dibs.observers.measures` makes for every exporter. The hook
installs this observer once per process (:func:`install`), so the task process (the compute-once
flow: outcomes, compute, waits, hand-offs, heartbeats) and the triggerer (the store operations of its
waits) both publish. A deferred waiter's wait is measured in the task that resumes: its flow counts
the time across deferrals.

Airflow's StatsD carries no tags (unless InfluxDB-style tags are on), so what a metric's attribute
says is also in its name, within Airflow's rules (letters, digits, ``_.-``); tags carry the rest for
the backends that take them. Names (each under Airflow's prefix, ``airflow.`` by default):

=====================================================  =====================  ==================
name                                                   kind                   tags
=====================================================  =====================  ==================
``dibs.reservation.outcomes.<outcome>``                counter                outcome
``dibs.reservation.not_stored.<reason>``               counter                reason
``dibs.compute.duration``                              timer
``dibs.wait.duration.<outcome>``                       timer                  outcome
``dibs.handoff.duration``                              timer
``dibs.compute.saved_ms``                              counter (milliseconds)
``dibs.store.operation.duration.<operation>``          timer                  operation
``dibs.store.operation.errors.<operation>``            counter                operation, error_type
``dibs.heartbeat.lateness``                            timer
``dibs.lease.lost.<reason>``                           counter                reason
``dibs.leases.active``, ``dibs.waiters.active``        gauge (changes)
=====================================================  =====================  ==================

Every metric also has the tags ``namespace``, ``store`` and ``frontend``. A metrics call never
raises: an error is logged once and the call goes on.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from dibs import events
from dibs.events import Event
from dibs.observers import Measurement, Measurer
from dibs_provider._compat import Stats

__all__ = ["AirflowStats", "install"]

log = logging.getLogger(__name__)

#: The measurement attribute whose value joins a metric's name, per metric.
_IN_NAME = {
    "dibs.reservation.outcomes": "dibs.outcome",
    "dibs.wait.duration": "dibs.outcome",
    "dibs.store.operation.duration": "dibs.store.operation",
    "dibs.lease.lost": "dibs.reason",
    "dibs.reservation.not_stored": "dibs.reason",
}
_TAGS = {
    "dibs.namespace": "namespace",
    "dibs.store": "store",
    "dibs.frontend": "frontend",
    "dibs.outcome": "outcome",
    "dibs.store.operation": "operation",
    "dibs.reason": "reason",
    "error.type": "error_type",
}
_TIMERS = frozenset(
    {
        "dibs.compute.duration",
        "dibs.wait.duration",
        "dibs.handoff.duration",
        "dibs.store.operation.duration",
        "dibs.heartbeat.lateness",
        "dibs.store.outage.duration",
    }
)


class AirflowStats:
    """An observer (see :mod:`dibs.events`) that sends the measurements through ``Stats``."""

    kinds = Measurer.KINDS  # what it measures, the store operations among them

    def __init__(self, stats: Any = Stats) -> None:
        self._stats = stats
        self._measure = Measurer()
        self._complained = False

    def __call__(self, event: Event) -> None:
        try:
            for point in self._measure(event):
                self._send(point)
        except Exception:
            if not self._complained:
                self._complained = True
                log.warning(
                    "dibs: sending a metric through Airflow's Stats failed; not logged again", exc_info=True
                )

    def _send(self, point: Measurement) -> None:
        attributes = point.attributes
        tags = {_TAGS[name]: value for name, value in attributes.items() if name in _TAGS}
        # A store operation that serves no one call (the triggerer's waits, the watch hub's reads)
        # names no front end: in an Airflow process, it is Airflow's.
        tags.setdefault("frontend", "airflow")
        name = point.name
        named_by = _IN_NAME.get(name)
        if named_by is not None:
            name = f"{name}.{_safe(attributes.get(named_by, 'unknown'))}"
        stats = self._stats
        if point.name in _TIMERS:
            stats.timing(name, dt.timedelta(seconds=point.value), tags=tags)
            if "error.type" in attributes:
                errors = f"dibs.store.operation.errors.{_safe(attributes['dibs.store.operation'])}"
                stats.incr(errors, tags=tags)
        elif point.name == "dibs.compute.saved":
            stats.incr("dibs.compute.saved_ms", count=round(point.value * 1000), tags=tags)
        elif point.name.endswith(".active"):
            stats.gauge(name, point.value, delta=True, tags=tags)
        else:
            stats.incr(name, count=round(point.value), tags=tags)


def _safe(value: str) -> str:
    """A name part within Airflow's rules (its StatsD validator drops a metric with anything else)."""
    return "".join(c if c.isascii() and (c.isalnum() or c in "_-") else "_" for c in value) or "unknown"


def install() -> None:
    """Publish this process's compute-once calls and store operations through ``Stats`` (once)."""
    events.observe_once(AirflowStats)

"""Metrics and traces through the OpenTelemetry API (``pip install 'dibs[otel]'``).

As OpenTelemetry's guidance for libraries says, dibs depends on the API only: the application owns
the SDK, its providers and exporters. Without an SDK configured every instrument is a no-op; with one,
:func:`instrument` publishes the metrics of :mod:`dibs.observers.measures` and a ``dibs.reserve``
span per compute-once call::

    from dibs.observers import otel

    otel.instrument()          # every call of this process, through the global providers

Events are measured and recorded on a thread of their own a moment later (:mod:`dibs.observers.later`),
so that work and the SDK's stay off the call's path; :meth:`OpenTelemetry.flush` records them at once.

The span nests under whatever span is active when the call starts (Airflow's task span, Prefect's
run span, your own), is the active span while the work runs, and carries the key, the owner, the
token and the holder; its events say what happened (waiting on holder, took over, stored). The span
itself is the SDK's work on the caller's path (its ends are the call's): the uncontended call makes
one span, one event and a few attributes, each set the SDK's cheapest way (see ``_trace``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry import context, metrics, trace
from opentelemetry.trace import Span, Status, StatusCode

from dibs import events
from dibs.events import Event, Observation
from dibs.observers.later import Later
from dibs.observers.measures import METRICS, Measurer

__all__ = ["OpenTelemetry", "instrument"]

_NAME = "dibs"
#: Seconds, for what takes from milliseconds (a store) to an hour (a long task or wait).
_STORE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_WORK_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dibs")
    except PackageNotFoundError:
        return ""


class OpenTelemetry:
    """An observer (see :mod:`dibs.events`) that records metrics and spans.

    :param meter_provider: default: the global one (``opentelemetry.metrics.set_meter_provider``).
    :param tracer_provider: default: the global one.
    :param traces: ``False`` to record metrics only.
    """

    kinds = events.EVERY_KIND  # also the store operations

    def __init__(
        self,
        meter_provider: metrics.MeterProvider | None = None,
        tracer_provider: trace.TracerProvider | None = None,
        *,
        traces: bool = True,
    ) -> None:
        meter = metrics.get_meter(_NAME, _version(), meter_provider=meter_provider)
        #: Each metric's ``add`` (counters) or ``record`` (histograms), looked up once.
        self._points: dict[str, Callable[[float, Mapping[str, str]], None]] = {}
        for name, metric in METRICS.items():
            if metric.kind == "counter":
                self._points[name] = meter.create_counter(name, metric.unit, metric.description).add
            elif metric.kind == "updown":
                self._points[name] = meter.create_up_down_counter(name, metric.unit, metric.description).add
            else:
                buckets = _STORE_BUCKETS if name.startswith("dibs.store.") else _WORK_BUCKETS
                self._points[name] = meter.create_histogram(
                    name, metric.unit, metric.description, explicit_bucket_boundaries_advisory=buckets
                ).record
        self._tracer = (
            trace.get_tracer(_NAME, _version(), tracer_provider=tracer_provider) if traces else None
        )
        self._measure = Measurer()
        additive = frozenset(name for name, metric in METRICS.items() if metric.kind in ("counter", "updown"))
        self._later = Later(
            lambda point: self._points[point.name](point.value, point.attributes), additive, self._measure
        )
        #: The open ``dibs.reserve`` span of each call, and its context token. Each entry is added once
        #: (the call's ask) and popped once (its end): single dict operations, atomic, need no lock.
        self._spans: dict[int, tuple[Span, object]] = {}
        self._put = self._later.put_event
        #: What each kind of event does to its call's span (the other kinds: nothing), by exact type.
        self._steps: dict[type[Event], Callable[[Span, Any], None]] = {
            events.KeyBusy: _busy,
            events.HolderChanged: _holder_changed,
            events.LeaseAcquired: _acquired,
            events.ArtifactStored: _stored,
            events.NotStored: _not_stored,
            events.ArtifactFound: _found,
            events.LostLease: _lost,
            events.WorkFailed: _work_failed,
        }

    def __call__(self, event: Event) -> None:
        self._put(event)  # measured and recorded off the caller's path (dibs.observers.later)
        if self._tracer is not None and event.call:
            self._trace(event, self._tracer)

    def flush(self) -> None:
        """Record the measurements still queued now (a reader collecting right after a call wants them)."""
        self._later.flush()

    def _trace(self, event: Event, tracer: trace.Tracer) -> None:
        # What the SDK charges on the caller's path (Python SDK 1.45, measured on an idle core): about
        # 12 µs for a bare span's start and end, 1 µs per attribute given to start_span or set with
        # set_attribute (set_attributes cleans the mapping as one nested value: no cheaper), 5 µs per
        # event with two attributes. So the attributes known at the start go to start_span (samplers
        # see them too), the span's start is the "asked" (no event for it), ``dibs.refresh`` is set
        # only when true, the end sets its few attributes one by one, and a span that does not record
        # (sampled out) gets neither events nor attributes built for it. Every other event costs a
        # dict lookup by its type; the calls' spans are found without a lock (one dict operation
        # each, atomic).
        kind = type(event)
        if kind is events.Asked:
            self._start(event, tracer)  # type: ignore[arg-type]
            return
        if kind is events.Finished:
            self._finish(event)  # type: ignore[arg-type]
            return
        if kind is events.Deferred:
            found = self._spans.pop(event.call, None)
            if found is not None:
                found[0].set_attribute("dibs.deferred", True)
                _close(found)
            return
        step = self._steps.get(kind)
        if step is None:
            return
        found = self._spans.get(event.call)
        if found is not None and found[0].is_recording():  # else: the call started before this observer
            step(found[0], event)

    def _start(self, event: events.Asked, tracer: trace.Tracer) -> None:
        attributes: dict[str, Any] = {
            "dibs.key": str(event.key),
            "dibs.namespace": event.key.namespace,
            "dibs.owner": event.owner,
            "dibs.store": event.store,
            "dibs.frontend": event.frontend,
        }
        if event.refresh:
            attributes["dibs.refresh"] = True
        span = tracer.start_span("dibs.reserve", attributes=attributes)
        # The span is the active one while the call runs, so the work's own spans nest under it.
        self._spans[event.call] = (span, context.attach(trace.set_span_in_context(span)))

    def _finish(self, event: events.Finished) -> None:
        found = self._spans.pop(event.call, None)
        if found is None:
            return
        span = found[0]
        if span.is_recording():
            span.set_attribute("dibs.outcome", event.outcome)
            holder = event.waited_on or event.producer
            if holder is not None:
                span.set_attribute("dibs.holder", holder)
            if event.token is not None:
                span.set_attribute("dibs.token", event.token)
            if event.outcome == "failed":
                span.set_status(Status(StatusCode.ERROR, event.error or event.error_type or "failed"))
                if event.error_type:
                    span.set_attribute("error.type", event.error_type)
        _close(found)


def _close(found: tuple[Span, object]) -> None:
    span, attached = found
    # OpenTelemetry logs (never raises) a detach from another context (a driver that moved threads).
    context.detach(attached)  # type: ignore[arg-type]
    span.end()


def _busy(span: Span, event: events.KeyBusy) -> None:
    span.add_event("waiting on holder", _some(holder=event.holder, token=event.token))


def _holder_changed(span: Span, event: events.HolderChanged) -> None:
    span.add_event("holder changed", _some(previous=event.previous, holder=event.holder))


def _acquired(span: Span, event: events.LeaseAcquired) -> None:
    if event.took_over_from is not None:  # its token is set at the end, with the rest
        span.add_event("took over", _some(holder=event.took_over_from, token=event.token))


def _stored(span: Span, event: events.ArtifactStored) -> None:
    span.add_event("stored", {"dibs.token": event.token, "dibs.size": event.size})


def _not_stored(span: Span, event: events.NotStored) -> None:
    span.add_event("not stored", _some(reason=event.reason, error=event.error))


def _found(span: Span, event: events.ArtifactFound) -> None:
    span.add_event("artifact found", _some(producer=event.producer, token=event.token))


def _lost(span: Span, event: events.LostLease) -> None:
    span.add_event("lease lost", _some(reason=event.reason, error=event.error))


def _work_failed(span: Span, event: events.WorkFailed) -> None:
    span.add_event("work failed", _some(error=event.error))


def _some(**attributes: Any) -> dict[str, Any]:
    """Span event attributes under ``dibs.``, without the ones that are unknown."""
    return {f"dibs.{name}": value for name, value in attributes.items() if value is not None}


def instrument(
    meter_provider: metrics.MeterProvider | None = None,
    tracer_provider: trace.TracerProvider | None = None,
    *,
    traces: bool = True,
) -> Observation:
    """Publish every compute-once call of this process; ``close()`` the result to stop."""
    return events.observe(OpenTelemetry(meter_provider, tracer_provider, traces=traces))

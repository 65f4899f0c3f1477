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
token and the holder; its events say what happened (waiting on holder, took over, stored). Only its
start (which makes it the active span) and the context's detach at the end run on the caller's path;
its events, its ending attributes and its end are given to it on the recorder's thread, with the
times the call's events happened (so the span's end and its events keep the call's clock, and an
exporter sees the span a moment after the call returns: :meth:`OpenTelemetry.flush` ends it at once).
With ``active_span=False`` the span is not the active one while the work runs, and its start too is the
recorder's: nothing of the SDK's remains on the caller's path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry import context, metrics, trace
from opentelemetry.trace import Span, Status, StatusCode

from dibs import events
from dibs.events import Event, Observation
from dibs.observers.later import Later
from dibs.observers.measures import METRICS, Measurement, Measurer

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
    :param active_span: ``False``: the ``dibs.reserve`` span is not the active one while the work
        runs (the work's own spans nest under the caller's span, not under it), and so the whole
        span is made on the recorder's thread, with the call's times: none of the SDK's work is left
        on the caller's path (see ``_start``).
    """

    #: The kinds of event it hears (read when it is added): its metrics' and, with traces, its spans'.
    kinds: frozenset[type[Event]]

    def __init__(
        self,
        meter_provider: metrics.MeterProvider | None = None,
        tracer_provider: trace.TracerProvider | None = None,
        *,
        traces: bool = True,
        active_span: bool = True,
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
            lambda point: self._points[point.name](point.value, point.attributes),
            additive,
            self._measure if self._tracer is None else self._measure_and_trace,
            in_child=self._forget_the_parents_spans,
        )
        #: The context token of each call's ``dibs.reserve`` span, on the caller's side (added at the
        #: call's ask, popped at its end), and the span of each call that records, on the recorder's
        #: (added at the ask, popped by the recorder when it ends the span). Each entry is added once
        #: and popped once: single dict operations, atomic, need no lock.
        self._tokens: dict[int, object] = {}
        self._open: dict[int, Span] = {}
        self._active = active_span
        #: Without ``active_span``: the context each call started in (its span's parent), from its
        #: ask on the caller's side to the recorder's start of the span.
        self._parents: dict[int, context.Context] = {}
        self._put = self._later.put_event
        #: What each kind of event does to its call's span on the recorder's thread (the other kinds:
        #: nothing), by exact type. ``Finished`` and ``Deferred`` end it.
        self._steps: dict[type[Event], Callable[[Span, Any], None]] = {
            events.KeyBusy: _busy,
            events.HolderChanged: _holder_changed,
            events.LeaseAcquired: _acquired,
            events.ArtifactStored: _stored,
            events.NotStored: _not_stored,
            events.ArtifactFound: _found,
            events.LostLease: _lost,
            events.WorkFailed: _work_failed,
            events.Finished: _finish,
            events.Deferred: _deferred,
        }
        # Metrics only: a call builds none of the events that only a span would show (its ask).
        self.kinds = Measurer.KINDS | (frozenset({events.Asked, *self._steps}) if traces else frozenset())

    def __call__(self, event: Event) -> None:
        if self._tracer is not None and event.call:
            # Only what must happen on the caller's path: the span's start (it is the active span
            # while the work runs, so the work's own spans nest under it) and, at the end, the
            # context's detach. Every other event costs a type check.
            kind = type(event)
            if kind is events.Asked:
                if self._active:
                    self._start(event, self._tracer)  # type: ignore[arg-type]
                else:
                    self._parents[event.call] = context.get_current()
            elif kind is events.Finished or kind is events.Deferred:
                attached = self._tokens.pop(event.call, None)
                if attached is not None:
                    # OpenTelemetry logs (never raises) a detach from another context (a driver that
                    # moved threads).
                    context.detach(attached)  # type: ignore[arg-type]
        # Measured, recorded and traced off the caller's path (dibs.observers.later); queued last, so
        # that the recorder finds what the ask left for it (the span, or the context to start it in).
        self._put(event)

    def _forget_the_parents_spans(self) -> None:
        """In a forked child: the spans open in the parent are the parent's to end (and export once);
        a call the child goes on with ends without one. The forking thread's context tokens stay: it
        is the child's one thread, and detaches them itself."""
        self._open.clear()
        self._parents.clear()

    def flush(self) -> None:
        """Record the measurements still queued now, and end the spans of the calls that ended (a
        reader or an exporter looking right after a call wants them)."""
        self._later.flush()

    def _start(self, event: events.Asked, tracer: trace.Tracer) -> None:
        # What the SDK charges (Python SDK 1.45, a tight loop on a busy 2-core machine): about 9 µs for
        # a bare span's start, 1 µs more per attribute given to start_span; several times that inside
        # a real call (benchmarks/observing.py). So only the key goes to start_span (samplers see it;
        # the namespace is its prefix): the call's other attributes, its events, its end and the span
        # processor's on_end (2 to 3 µs per attribute set or event added) are the recorder's (see
        # _measure_and_trace). A span that does not record (sampled out) gets neither. Without
        # active_span even the start is the recorder's (_start_later).
        span = tracer.start_span("dibs.reserve", attributes=_asked(event), start_time=_nanoseconds(event))
        if span.is_recording():
            self._open[event.call] = span
        self._tokens[event.call] = context.attach(trace.set_span_in_context(span))

    def _start_later(self, event: events.Asked, tracer: trace.Tracer) -> None:
        """Without ``active_span``, on the recorder's thread: the span, in the context the call
        started in, from the time it asked."""
        parent = self._parents.pop(event.call, None)
        if parent is None:
            return  # the call started before this observer
        span = tracer.start_span(
            "dibs.reserve", context=parent, attributes=_asked(event), start_time=_nanoseconds(event)
        )
        if span.is_recording():
            self._open[event.call] = span

    def _measure_and_trace(self, event: Event) -> list[Measurement]:
        """On the recorder's thread, in the call's order: ``event``'s step on its call's span (the
        event's own time on it), then its measurements."""
        if type(event) is events.Asked and not self._active and self._tracer is not None:
            with contextlib.suppress(Exception):
                self._start_later(event, self._tracer)  # type: ignore[arg-type]
        step = self._steps.get(type(event))
        if step is not None and event.call:
            kind = type(event)
            ends = kind is events.Finished or kind is events.Deferred
            span = self._open.pop(event.call, None) if ends else self._open.get(event.call)
            if span is not None:  # else: sampled out, or the call started before this observer
                with contextlib.suppress(Exception):  # a span the SDK refuses must not lose the points
                    step(span, event)
        return self._measure(event)


def _asked(event: events.Asked) -> dict[str, Any]:
    """The attributes the span starts with (samplers see them; the rest come with its end)."""
    attributes: dict[str, Any] = {"dibs.key": str(event.key)}
    if event.refresh:
        attributes["dibs.refresh"] = True
    return attributes


def _nanoseconds(event: Event) -> int:
    """When ``event`` happened, as the SDK's timestamps count (``time.time_ns()``)."""
    return round(event.at * 1e9)


def _call(event: Event) -> dict[str, Any]:
    """The attributes of the call that are not the key (see ``OpenTelemetry._start``). Given to the
    span in one ``set_attributes`` with the ending's: the SDK takes its lock and checks the span once
    per call, not once per attribute (the recorder's thread shares the interpreter with the callers)."""
    return {
        "dibs.namespace": event.key.namespace,
        "dibs.owner": event.owner,
        "dibs.store": event.store,
        "dibs.frontend": event.frontend,
    }


def _finish(span: Span, event: events.Finished) -> None:
    attributes = _call(event)
    attributes["dibs.outcome"] = event.outcome
    holder = event.waited_on or event.producer
    if holder is not None:
        attributes["dibs.holder"] = holder
    if event.token is not None:
        attributes["dibs.token"] = event.token
    if event.outcome == "failed":
        span.set_status(Status(StatusCode.ERROR, event.error or event.error_type or "failed"))
        if event.error_type:
            attributes["error.type"] = event.error_type
    span.set_attributes(attributes)
    span.end(_nanoseconds(event))


def _deferred(span: Span, event: events.Deferred) -> None:
    attributes = _call(event)
    attributes["dibs.deferred"] = True
    span.set_attributes(attributes)
    span.end(_nanoseconds(event))


def _busy(span: Span, event: events.KeyBusy) -> None:
    span.add_event("waiting on holder", _some(holder=event.holder, token=event.token), _nanoseconds(event))


def _holder_changed(span: Span, event: events.HolderChanged) -> None:
    span.add_event("holder changed", _some(previous=event.previous, holder=event.holder), _nanoseconds(event))


def _acquired(span: Span, event: events.LeaseAcquired) -> None:
    if event.took_over_from is not None:  # its token is set at the end, with the rest
        span.add_event(
            "took over", _some(holder=event.took_over_from, token=event.token), _nanoseconds(event)
        )


def _stored(span: Span, event: events.ArtifactStored) -> None:
    span.add_event("stored", {"dibs.token": event.token, "dibs.size": event.size}, _nanoseconds(event))


def _not_stored(span: Span, event: events.NotStored) -> None:
    span.add_event("not stored", _some(reason=event.reason, error=event.error), _nanoseconds(event))


def _found(span: Span, event: events.ArtifactFound) -> None:
    span.add_event("artifact found", _some(producer=event.producer, token=event.token), _nanoseconds(event))


def _lost(span: Span, event: events.LostLease) -> None:
    span.add_event("lease lost", _some(reason=event.reason, error=event.error), _nanoseconds(event))


def _work_failed(span: Span, event: events.WorkFailed) -> None:
    span.add_event("work failed", _some(error=event.error), _nanoseconds(event))


def _some(**attributes: Any) -> dict[str, Any]:
    """Span event attributes under ``dibs.``, without the ones that are unknown."""
    return {f"dibs.{name}": value for name, value in attributes.items() if value is not None}


def instrument(
    meter_provider: metrics.MeterProvider | None = None,
    tracer_provider: trace.TracerProvider | None = None,
    *,
    traces: bool = True,
    active_span: bool = True,
) -> Observation:
    """Publish every compute-once call of this process; ``close()`` the result to stop (the
    arguments: see :class:`OpenTelemetry`)."""
    observer = OpenTelemetry(meter_provider, tracer_provider, traces=traces, active_span=active_span)
    events.observe(observer)
    return _Instrumented(events.PROCESS, observer)


class _Instrumented(Observation):
    """What :func:`instrument` returns: closing it also records what is still queued and ends the
    spans of the calls that ended, so that a provider shut down (or flushed) right after it exports
    them: spans end on the recorder's thread, a moment after their call returned."""

    observer: OpenTelemetry

    def close(self) -> None:
        super().close()
        self.observer.flush()

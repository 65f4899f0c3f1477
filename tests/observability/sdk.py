"""The real OpenTelemetry SDK, in memory, fed by dibs's observer: what a dashboard and a trace viewer
would get, for the tests to read (tests/observability, tests/prefect/test_observed.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import dibs
from dibs.observers.otel import OpenTelemetry


class Telemetry:
    """The SDK's in-memory metric reader and span exporter, and dibs's observer writing to them."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.meters = MeterProvider(metric_readers=[self.reader])
        self.spans = InMemorySpanExporter()
        self.tracers = TracerProvider()
        self.tracers.add_span_processor(SimpleSpanProcessor(self.spans))
        self.observer = OpenTelemetry(self.meters, self.tracers)

    def points(self, name: str) -> list[Any]:
        """The data points of the metric ``name``."""
        self.observer.flush()  # measurements are recorded off the caller's path, a moment later
        data = self.reader.get_metrics_data()
        found = []
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        found.extend(metric.data.data_points)
        return found

    def sums(self, name: str, by: str) -> dict[str, float]:
        """The metric's total per value of the attribute ``by``."""
        totals: dict[str, float] = {}
        for point in self.points(name):
            which = str(point.attributes.get(by))
            totals[which] = totals.get(which, 0.0) + point.value
        return totals

    def finished_spans(self) -> list[ReadableSpan]:
        """The ``dibs.reserve`` spans that have ended."""
        self.observer.flush()  # a span's events, ending attributes and end are given a moment later
        return [span for span in self.spans.get_finished_spans() if span.name == "dibs.reserve"]


@contextlib.contextmanager
def observed() -> Iterator[Telemetry]:
    """A :class:`Telemetry` observing every call of the process until the block ends."""
    seen = Telemetry()
    try:
        with dibs.observe(seen.observer):
            yield seen
    finally:
        seen.meters.shutdown()
        seen.tracers.shutdown()

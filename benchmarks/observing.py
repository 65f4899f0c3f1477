"""8. The overhead of observing: the uncontended compute-once path, watched and not.

``Reservations.run`` on fresh keys (reserve + complete, the path every front end takes), three kinds
interleaved one operation at a time, each timed on its own:

* ``unobserved``: nobody listens (the baseline): the flow builds only the events of the Python front
  end's log lines, and each store operation checks once whether anyone listens;
* ``observed``: a process observer that does nothing, so every event is built and delivered, and every
  store operation is timed (the cost of the events themselves);
* ``metrics``: :class:`dibs.observers.otel.OpenTelemetry` with ``traces=False``: dibs's metrics alone,
  through the SDK configured as below;
* ``otel``: :class:`dibs.observers.otel.OpenTelemetry` on the real OpenTelemetry SDK configured as a
  deployment configures it, with exporters that do an exporter's work: spans handed to a
  ``BatchSpanProcessor`` (the SDK's default for production), metrics collected by a
  ``PeriodicExportingMetricReader`` every second (the default is a minute: more often, so that
  collections happen during the runs), both exported by the SDK's console exporters into
  ``/dev/null``: every span and every collection encoded (as JSON, which costs about 1.3 to 2 times
  what OTLP's protobuf encoding of a span does), on the SDK's own threads, sharing the interpreter
  with the calls as a real exporter does. Only the network is left out.
* ``otel_later``: the same with ``active_span=False``: the span is not the active one while the work
  runs, so the observer makes all of it on its recorder's thread (for comparison; the goal is ``otel``,
  the default).
* ``bare_span``: no dibs observer, only the SDK's cheapest span on the same providers: started (no
  attribute, not made the active one) when the call asks, ended when it ends, on the caller's thread.
  The floor of any observer whose span is the active one while the work runs: ``otel`` cannot cost
  less than this.

The observer is added before an operation's timer starts and removed after it stops. The goals
(issue 33), on every store's reserve + complete, medians:

* metrics alone (``metrics``) within 5 % of ``unobserved``;
* with spans, dibs's own share above the SDK's cheapest span, ``(otel - bare_span) / unobserved``,
  within 3 %: the bare span is the SDK's floor (1 to 28 % of a call, by store), measured beside it.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from typing import Any

import dibs
from benchmarks.settings import Settings
from benchmarks.stats import ratio, summarize
from benchmarks.targets import Target
from dibs.stores import open_store

KINDS = ("unobserved", "observed", "metrics", "otel", "otel_later", "bare_span")
VALUE = {"path": "s3://bucket/features/part-00000.parquet", "rows": 123456}
#: Metrics alone: at most this ratio to unobserved (median).
METRICS_GOAL = 1.05
#: With spans: dibs's share above the SDK's bare span, as a fraction of an unobserved call (median).
SPAN_SHARE_GOAL = 0.03


def _ignore(event: dibs.Event) -> None:
    return None


class _BareSpan:
    """The SDK's cheapest span per call (the ``bare_span`` kind): the floor of the span's cost."""

    kinds = frozenset({dibs.Asked, dibs.Finished})

    def __init__(self, tracer: Any) -> None:
        self._tracer = tracer
        self._open: dict[int, Any] = {}

    def __call__(self, event: dibs.Event) -> None:
        if type(event) is dibs.Asked:
            self._open[event.call] = self._tracer.start_span("dibs.reserve")
        elif type(event) is dibs.Finished:
            found = self._open.pop(event.call, None)
            if found is not None:
                found.end()


def _observers() -> tuple[dict[str, dibs.Observer | None], Callable[[], None]]:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    from dibs.observers.otel import OpenTelemetry

    sink = open(os.devnull, "w")  # noqa: SIM115 (close() closes it)
    reader = PeriodicExportingMetricReader(ConsoleMetricExporter(out=sink), export_interval_millis=1000)
    meters, tracers = MeterProvider(metric_readers=[reader]), TracerProvider()
    tracers.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter(out=sink)))

    def close() -> None:
        meters.shutdown()
        tracers.shutdown()
        sink.close()

    return {
        "unobserved": None,
        "observed": _ignore,
        "metrics": OpenTelemetry(meters, tracers, traces=False),
        "otel": OpenTelemetry(meters, tracers),
        "otel_later": OpenTelemetry(meters, tracers, active_span=False),
        "bare_span": _BareSpan(tracers.get_tracer("bench.bare")),
    }, close


def _measure_target(target: Target, settings: Settings) -> dict[str, Any]:
    run_id = uuid.uuid4().hex[:8]
    store = open_store(target.url)
    client = dibs.Reservations(store, namespace="bench.observing", ttl=60)
    observers, close = _observers()
    counter = dict.fromkeys(KINDS, 0)

    def once(kind: str) -> float:
        counter[kind] += 1
        key = f"{run_id}-{kind}-{counter[kind]}"
        observer = observers[kind]
        observation = None if observer is None else dibs.observe(observer)
        try:
            started = time.perf_counter()
            client.run(key, lambda: VALUE)
            return time.perf_counter() - started
        finally:
            if observation is not None:
                observation.close()

    samples: dict[str, list[float]] = {kind: [] for kind in KINDS}
    try:
        for kind in KINDS:  # warm-up: connections, statement caches, lazy imports
            for _ in range(settings.overhead_warmup):
                once(kind)
        for round_number in range(settings.overhead_rounds):
            for index in range(settings.overhead_batch):
                shift = (round_number + index) % len(KINDS)
                for kind in KINDS[shift:] + KINDS[:shift]:
                    samples[kind].append(once(kind))
    finally:
        close()
        store.close()
    summaries = {kind: summarize(values) for kind, values in samples.items()}
    base = summaries["unobserved"]
    return {
        "label": target.label,
        "us": {kind: summary.to_dict(1e6) for kind, summary in summaries.items()},
        "ratio": {kind: ratio(summaries[kind].median, base.median) for kind in KINDS[1:]},
        "ratio_p99": {kind: ratio(summaries[kind].p99, base.p99) for kind in KINDS[1:]},
        # dibs's own share of a call with spans: what otel costs above the SDK's bare span
        "span_share": (summaries["otel"].median - summaries["bare_span"].median) / base.median,
    }


def run(targets: list[Target], settings: Settings, log: Callable[[str], None]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for target in targets:
        results[target.name] = _measure_target(target, settings)
        us, ratios = results[target.name]["us"], results[target.name]["ratio"]
        log(
            f"observing {target.name}: unobserved {us['unobserved']['median']:.0f} us, observed "
            f"{us['observed']['median']:.0f} us ({ratios['observed']:.3f}x), metrics "
            f"{us['metrics']['median']:.0f} us ({ratios['metrics']:.3f}x), otel "
            f"{us['otel']['median']:.0f} us ({ratios['otel']:.3f}x), otel_later "
            f"{us['otel_later']['median']:.0f} us ({ratios['otel_later']:.3f}x), bare_span "
            f"{us['bare_span']['median']:.0f} us ({ratios['bare_span']:.3f}x), dibs's span share "
            f"{results[target.name]['span_share']:+.1%}"
        )
    return results

"""The Grafana dashboard queries what dibs emits, as Prometheus names it; the docs list it all.

The names come from a real run: the scenario makes dibs emit every metric through the OpenTelemetry
SDK, and OpenTelemetry's own Prometheus exporter names them (``dibs.compute.duration`` in seconds
becomes ``dibs_compute_duration_seconds_bucket`` and friends). A dashboard query naming anything else
would show nothing, silently: this test is what notices.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import REGISTRY
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import dibs
from dibs.events import EVERY_KIND
from dibs.observers.measures import METRICS
from dibs.observers.otel import OpenTelemetry
from tests.observability.scenario import emit_every_metric

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana" / "dibs-dashboard.json"
DOC = ROOT / "docs" / "observability.md"


@pytest.fixture(scope="module")
def exposition(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    """Every sample name Prometheus scrapes from dibs after the scenario, with its label names."""
    reader = PrometheusMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    url = f"sqlite:///{tmp_path_factory.mktemp('dashboard') / 'dibs.db'}"
    try:
        observer = OpenTelemetry(meters, traces=False)
        with dibs.observe(observer), dibs.Reservations(url, ttl=0.3) as client:
            emit_every_metric(client)
        observer.flush()
        text = generate_latest(REGISTRY).decode()
    finally:
        meters.shutdown()  # unregisters the reader's collector
    samples: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("dibs_"):
                samples.setdefault(sample.name, set()).update(sample.labels)
    return samples


def _queries(node: Any) -> Iterator[str]:
    """Every PromQL expression of the dashboard: panel targets and template variable queries."""
    if isinstance(node, dict):
        for name, value in node.items():
            if name in ("expr", "definition") and isinstance(value, str):
                yield value
            else:
                yield from _queries(value)
    elif isinstance(node, list):
        for item in node:
            yield from _queries(item)


_SELECTOR = re.compile(r"\{([^}]*)\}")
_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
_LABEL_VALUES = re.compile(r"label_values\(\s*(\w+)\s*,\s*(\w+)\s*\)")
_MATCHER = re.compile(r"(\w+)\s*(?:=~|!~|!=|=)")


def parse(query: str) -> tuple[set[str], set[str]]:
    """The metric names and the label names one query uses."""
    labels: set[str] = set()
    for selector in _SELECTOR.findall(query):
        labels.update(_MATCHER.findall(selector))
    for grouping in _GROUPING.findall(query):
        labels.update(name.strip() for name in grouping.split(",") if name.strip())
    for _metric, label in _LABEL_VALUES.findall(query):
        labels.add(label)
    bare = _GROUPING.sub(" ", _SELECTOR.sub(" ", query))
    bare = re.sub(r"label_values\(\s*(\w+)\s*,\s*\w+\s*\)", r"\1", bare)
    metrics = set(re.findall(r"\b(dibs_\w+)\b", bare))
    return metrics, labels


def test_every_dashboard_query_names_what_dibs_emits(exposition: dict[str, set[str]]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = list(_queries(dashboard))
    assert len(queries) >= 15
    used: set[str] = set()
    for query in queries:
        metrics, labels = parse(query)
        assert metrics, f"no dibs metric in {query!r}"
        for metric in metrics:
            assert metric in exposition, f"{metric} (in {query!r}) is not among {sorted(exposition)}"
            unknown = labels - exposition[metric] - {"le"}
            assert not unknown, f"{query!r} uses labels {unknown} that {metric} does not have"
        used |= metrics
    # and every metric dibs has is on the dashboard
    for name in METRICS:
        base = name.replace(".", "_")
        assert any(metric.startswith(base) for metric in used), f"{name} has no panel"


def test_the_parser_finds_a_misnamed_metric_or_label() -> None:
    metrics, labels = parse(
        'sum by (dibs_outcom) (rate(dibs_reservation_outcome_total{dibs_store=~"$s"}[5m]))'
    )
    assert metrics == {"dibs_reservation_outcome_total"} and labels == {"dibs_outcom", "dibs_store"}


def test_the_docs_list_every_metric_event_and_name() -> None:
    text = DOC.read_text()
    for name, metric in METRICS.items():
        assert f"`{name}`" in text, f"docs/observability.md does not list {name}"
        for attribute in metric.attributes:
            assert f"`{attribute}`" in text, f"docs/observability.md does not name the attribute {attribute}"
    every = set(dibs.Event.__subclasses__())
    assert set(EVERY_KIND) == every  # a new event kind must be added to EVERY_KIND (and documented)
    for kind in EVERY_KIND:
        assert f"`{kind.__name__}`" in text, f"docs/observability.md does not list the event {kind.__name__}"
    from prefect_dibs.events import _NAMES

    for event in (*_NAMES.values(), "dibs.reservation.took-over", "dibs.reservation.lease-lost"):
        assert f"`{event}`" in text, f"docs/observability.md does not list the Prefect event {event}"
    assert "docs/observability.md" in (ROOT / "README.md").read_text()

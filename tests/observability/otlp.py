"""An OTLP/HTTP endpoint that keeps what OpenTelemetry exporters send it: what a collector receives.

The docs' example of short-lived processes (docs/observability.md) pushes each process's metrics to
``http://127.0.0.1:4318``, a collector's default OTLP/HTTP address; the docs tests point it here
(tests/docs/substitutions.py). The requests are decoded with OpenTelemetry's own protobuf messages
(``opentelemetry-proto``, the wire format every collector reads), so what a test reads back is exactly
what left each process, and with which temporality: a collector's job from there (adding deltas up
into one series, exporting it to Prometheus) is the collector's, not dibs's.
"""

from __future__ import annotations

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality

DELTA = AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA


class Collector:
    """Listens on loopback until closed; :attr:`url` is its base address (``OTEL_EXPORTER_OTLP_ENDPOINT``)."""

    def __init__(self) -> None:
        self.requests: list[ExportMetricsServiceRequest] = []
        self._lock = threading.Lock()
        received = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                reply = b""
                if self.path == "/v1/metrics":
                    request = ExportMetricsServiceRequest.FromString(body)
                    with received._lock:
                        received.requests.append(request)
                    reply = ExportMetricsServiceResponse().SerializeToString()
                self.send_response(200)  # traces and logs are accepted, and dropped
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-collector", daemon=True)
        self._thread.start()

    def sums(self, name: str) -> list[tuple[int, dict[str, str], int, float]]:
        """Every point of the sum (counter) ``name`` received: the request that brought it (its number,
        from 0), its attributes, its temporality and its value."""
        found = []
        with self._lock:
            requests = list(self.requests)
        for number, request in enumerate(requests):
            for resource in request.resource_metrics:
                for scope in resource.scope_metrics:
                    for metric in scope.metrics:
                        if metric.name == name and metric.HasField("sum"):
                            for point in metric.sum.data_points:
                                attributes = {a.key: a.value.string_value for a in point.attributes}
                                value = point.as_double if point.HasField("as_double") else point.as_int
                                found.append((number, attributes, metric.sum.aggregation_temporality, value))
        return found

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Collector:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

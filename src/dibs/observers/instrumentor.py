"""dibs for OpenTelemetry's auto-instrumentation: ``opentelemetry-instrument python app.py``.

OpenTelemetry's ``opentelemetry-instrument`` (``pip install opentelemetry-distro``) configures the SDK
from ``OTEL_*`` environment variables, then loads every instrumentor that packages register under
the ``opentelemetry_instrumentor`` entry point: dibs registers :class:`DibsInstrumentor`, which
publishes every compute-once call of the process (:func:`dibs.observers.otel.instrument`) through
the providers it was given, so nothing needs calling by hand::

    OTEL_SERVICE_NAME=features opentelemetry-instrument python build.py

``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=dibs`` leaves dibs out. This module is loaded only by the
auto-instrumentation (it needs ``opentelemetry-instrumentation``, which ``opentelemetry-distro``
installs); an application that sets the SDK up itself calls :func:`~dibs.observers.otel.instrument`.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

# The package declares BaseInstrumentor in a way type checkers do not see (no __all__ entry).
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]

from dibs.events import Observation

__all__ = ["DibsInstrumentor"]


class DibsInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Publishes dibs's metrics and ``dibs.reserve`` spans (see :mod:`dibs.observers.otel`)."""

    _observation: Observation | None = None

    def instrumentation_dependencies(self) -> Collection[str]:
        return ()  # dibs itself: nothing else must be installed for it

    def _instrument(self, **kwargs: Any) -> None:
        from dibs.observers import otel

        self._observation = otel.instrument(kwargs.get("meter_provider"), kwargs.get("tracer_provider"))

    def _uninstrument(self, **kwargs: Any) -> None:
        observation, self._observation = self._observation, None
        if observation is not None:
            observation.close()

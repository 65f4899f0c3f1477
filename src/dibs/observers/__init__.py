"""Observers that publish the flow's events where people already look.

:mod:`dibs.observers.measures` turns events into measurements once (the metric names, units and
attributes every exporter shares); :mod:`dibs.observers.otel` sends them, and a ``dibs.reserve`` span
per call, through the OpenTelemetry API. The Airflow provider (``dibs_provider.stats``) and
``prefect_dibs.events`` publish the same through Airflow's ``Stats`` and Prefect's event feed.
docs/observability.md lists them all.

The measurements are the public part an observer of one's own builds on: :class:`Measurer` turns
events into :class:`Measurement` values under the :data:`METRICS` every exporter shares.
"""

from dibs.observers.measures import METRICS, Measurement, Measurer, Metric

__all__ = ["METRICS", "Measurement", "Measurer", "Metric"]

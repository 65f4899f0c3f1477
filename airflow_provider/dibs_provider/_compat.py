"""Airflow's exceptions and ``Stats``, from wherever the installed release keeps them.

Airflow 3.2 moved the ones the provider raises to ``airflow.sdk.exceptions``; Airflow 3.1 (the oldest
release the provider supports) has them only in ``airflow.exceptions``. ``Stats`` comes through the
common compat provider, as the official providers import it, or from Airflow itself without it.
"""

from __future__ import annotations

try:
    from airflow.sdk.exceptions import (
        AirflowNotFoundException,
        AirflowSensorTimeout,
        AirflowSkipException,
        TaskDeferred,
    )
except ImportError:  # Airflow 3.1
    from airflow.exceptions import (  # type: ignore[no-redef,attr-defined,unused-ignore]
        AirflowNotFoundException,
        AirflowSensorTimeout,
        AirflowSkipException,
        TaskDeferred,
    )

try:
    from airflow.providers.common.compat.sdk import Stats
except ImportError:  # no common compat provider (or one without Stats)
    from airflow.stats import Stats  # type: ignore[no-redef,attr-defined,unused-ignore]

__all__ = [
    "AirflowNotFoundException",
    "AirflowSensorTimeout",
    "AirflowSkipException",
    "Stats",
    "TaskDeferred",
]

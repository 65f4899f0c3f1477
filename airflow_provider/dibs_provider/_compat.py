"""Airflow's exceptions, from wherever the installed release keeps them.

Airflow 3.2 moved the ones the provider raises to ``airflow.sdk.exceptions``; Airflow 3.1 (the oldest
release the provider supports) has them only in ``airflow.exceptions``.
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

__all__ = ["AirflowNotFoundException", "AirflowSensorTimeout", "AirflowSkipException", "TaskDeferred"]

"""What the tests need from Airflow, wherever the installed release keeps it (3.1.8 to the newest).

The provider supports Airflow 3.1.8 and later; CI runs the suite on the locked (newest) release and on
the oldest one (scripts/matrix). Airflow 3.2 moved these; only the tests use them.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

from packaging.version import Version

AIRFLOW_VERSION = Version(metadata.version("apache-airflow-core"))


def dag_bag(folder: str) -> Any:
    """``DagBag(folder)``: a folder's DAGs parsed as the DAG processor parses them."""
    try:
        from airflow.dag_processing.dagbag import DagBag
    except ImportError:  # Airflow 3.1
        from airflow.models.dagbag import DagBag  # type: ignore[no-redef,attr-defined,unused-ignore]
    return DagBag(folder)


def serialize_dag(dag: Any) -> Any:
    """What the DAG processor stores for the scheduler."""
    from airflow.serialization import serialized_objects

    serialization = getattr(serialized_objects, "DagSerialization", None)
    if serialization is None:  # Airflow 3.1
        serialization = serialized_objects.SerializedDAG
    return serialization.serialize_dag(dag)


def task_runtime_providers() -> Any:
    """The registry of hooks and TaskFlow decorators that tasks see (Airflow 3.1: ProvidersManager)."""
    try:
        from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime
    except ImportError:  # Airflow 3.1
        from airflow.providers_manager import ProvidersManager

        return ProvidersManager()
    return ProvidersManagerTaskRuntime()

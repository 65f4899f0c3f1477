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


def _release() -> tuple[int, ...]:
    from packaging.version import Version

    from airflow import __version__

    return Version(__version__).release


#: Whether this Airflow keeps a trigger's arguments out of its REST API (3.3+, apache/airflow#67868):
#: before, any user who may read a task instance read its trigger's arguments, decrypted. A task may
#: hand its trigger a secret only where it does.
TRIGGER_KWARGS_PRIVATE = _release() >= (3, 3)
#: Whether this Airflow's UI opens a plugin's frame at a page of it (``/plugin/<route>/<path>?query``,
#: and follows the frame's navigation in the address bar): 3.3.2+, apache/airflow#72196.
FRAME_DEEP_LINKS = _release() >= (3, 3, 2)

__all__ = [
    "FRAME_DEEP_LINKS",
    "TRIGGER_KWARGS_PRIVATE",
    "AirflowNotFoundException",
    "AirflowSensorTimeout",
    "AirflowSkipException",
    "Stats",
    "TaskDeferred",
]

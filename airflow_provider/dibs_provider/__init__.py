"""The dibs provider for Apache Airflow 3: reserved tasks that compute once across DAG runs.

Airflow finds this package through the ``apache_airflow_provider`` entry point (see
:mod:`dibs_provider.get_provider_info`), which registers the ``dibs`` connection type, the
``@task.reserved`` decorator, the operator, the sensor and the trigger.

This module deliberately imports nothing from Airflow: Airflow loads the provider's metadata while it is
still initialising its own configuration, and an Airflow import from here would be circular.

* :mod:`dibs_provider.hooks.dibs`: :class:`DibsHook`, a ``dibs`` connection turned into a client.
* :mod:`dibs_provider.operators.reserved`: :class:`ReservedPythonOperator`,
  :class:`ReservedOperatorMixin` and :func:`reserved_operator` for any existing operator.
* :mod:`dibs_provider.decorators.reserved`: ``@task.reserved``.
* :mod:`dibs_provider.sensors.reservation`: :class:`ReservationSensor`.
* :mod:`dibs_provider.triggers.reservation`: :class:`ReservationTrigger`, what a busy task defers to.

The user guide is ``docs/airflow.md``.
"""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"

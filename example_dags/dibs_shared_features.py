"""Two DAGs on different schedules share one expensive feature build per day.

``dibs_daily_training`` runs daily and ``dibs_six_hourly_report`` every six hours. Both need the
features of the same day, built by the same reserved task: whichever run asks first builds them, runs
that ask while the build is going on defer (no worker slot) and get the result when it is stored, and
every later run gets the stored result at once. The report's four runs a day build nothing.

The report also shows the other two tools:

* ``reserved_operator(BashOperator)``: any existing operator, reserved; its return value (the last line
  of output) is the artifact.
* ``ReservationSensor``: wait for another DAG's reserved result (the day's model) without ever
  computing it; it needs the explicit key the producer uses.

Connection: ``dibs_default`` (see docs/airflow.md); without one, ``DIBS_STORE_URL`` or the embedded
SQLite store of the machine is used, which is enough to try this out with ``airflow standalone``.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import dag, task

from dibs_provider.operators.reserved import reserved_operator
from dibs_provider.sensors.reservation import ReservationSensor


# The key is derived from this function (its module and name), ``version`` and its arguments, so both
# DAGs below share it for the same ``day``. Bump ``version`` when the feature logic changes.
@task.reserved(version="1", retries=2)
def build_features(day: str) -> dict[str, Any]:
    time.sleep(5)  # stands for an hour of feature engineering
    return {"day": day, "rows": 1_000_000, "columns": ["clicks", "views", "spend"]}


@dag(
    dag_id="dibs_daily_training",
    schedule="@daily",
    start_date=dt.datetime(2026, 1, 1),
    catchup=False,
    tags=["dibs", "example"],
)
def daily_training() -> None:
    features = build_features("{{ ds }}")

    # An explicit, templated key: other DAGs can wait for it with ReservationSensor.
    @task.reserved(key="model-{{ ds }}")
    def train(features: dict[str, Any]) -> dict[str, Any]:
        return {"day": features["day"], "auc": 0.91}

    train(features)


@dag(
    dag_id="dibs_six_hourly_report",
    schedule="0 */6 * * *",
    start_date=dt.datetime(2026, 1, 1),
    catchup=False,
    tags=["dibs", "example"],
)
def six_hourly_report() -> None:
    features = build_features("{{ ds }}")

    export = reserved_operator(BashOperator)(
        task_id="export_day",
        bash_command="echo exported {{ ds }}",
        reservation_key="export-{{ ds }}",
    )

    # Pokes once, then defers until the training DAG has stored the day's model; returns the model.
    model = ReservationSensor(task_id="wait_for_model", key="model-{{ ds }}", timeout=6 * 3600)

    @task
    def report(features: dict[str, Any], exported: str, model: dict[str, Any]) -> str:
        return f"{features['rows']} rows, {exported}, auc={model['auc']}"

    report(features, export.output, model.output)


daily_training()
six_hourly_report()

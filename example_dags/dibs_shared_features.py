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

Both DAGs run on a plain manual trigger too ("Trigger" in the UI, ``airflow dags trigger``), which in
Airflow 3 has no logical date, so ``{{ ds }}`` would be undefined: the day is the ``day`` param when
given, else the run's logical date, else the day the run was triggered (see ``DAY``).

Connection: ``dibs_default`` (see docs/airflow.md); without one, ``DIBS_STORE_URL`` or the embedded
SQLite store of the machine is used, which is enough to try this out with ``airflow standalone``.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import Param, dag, task

from dibs_provider.operators.reserved import reserved_operator
from dibs_provider.sensors.reservation import ReservationSensor

#: The day a run works on: the ``day`` param if the trigger gives one, else the run's logical date, else
#: (a manual trigger without one) the day it was triggered. Every reserved key below is built from it.
DAY = "{{ params.day or (dag_run.logical_date or dag_run.run_after) | ds }}"

#: Both DAGs take the same ``day`` param; empty means the run's own day (see ``DAY``).
PARAMS = {
    "day": Param(
        None,
        type=["null", "string"],
        format="date",
        description="The day to work on (YYYY-MM-DD); empty: the run's logical date, else today.",
    )
}

#: A failed try is retried soon: the reserved tasks re-enter their own lease, or find the artifact.
DEFAULT_ARGS = {"retries": 2, "retry_delay": dt.timedelta(seconds=15)}


# The key is derived from this function (its code), ``version`` and its arguments, so both DAGs below
# share it for the same ``day``. Bump ``version`` when the feature logic changes.
@task.reserved(version="1")
def build_features(day: str) -> dict[str, Any]:
    time.sleep(5)  # stands for an hour of feature engineering
    return {"day": day, "rows": 1_000_000, "columns": ["clicks", "views", "spend"]}


@dag(
    dag_id="dibs_daily_training",
    schedule="@daily",
    start_date=dt.datetime(2026, 1, 1),
    catchup=False,
    params=PARAMS,
    default_args=DEFAULT_ARGS,
    tags=["dibs", "example"],
)
def daily_training() -> None:
    features = build_features(DAY)

    # An explicit, templated key: other DAGs can wait for it with ReservationSensor.
    @task.reserved(key=f"model-{DAY}")
    def train(features: dict[str, Any]) -> dict[str, Any]:
        return {"day": features["day"], "auc": 0.91}

    train(features)


@dag(
    dag_id="dibs_six_hourly_report",
    schedule="0 */6 * * *",
    start_date=dt.datetime(2026, 1, 1),
    catchup=False,
    params=PARAMS,
    default_args=DEFAULT_ARGS,
    tags=["dibs", "example"],
)
def six_hourly_report() -> None:
    features = build_features(DAY)

    export = reserved_operator(BashOperator)(
        task_id="export_day",
        bash_command=f"echo exported {DAY}",
        reservation_key=f"export-{DAY}",
    )

    # Pokes once, then defers until the training DAG has stored the day's model; returns the model.
    model = ReservationSensor(task_id="wait_for_model", key=f"model-{DAY}", timeout=6 * 3600)

    @task
    def report(features: dict[str, Any], exported: str, model: dict[str, Any]) -> str:
        return f"{features['rows']} rows, {exported}, auc={model['auc']}"

    report(features, export.output, model.output)


daily_training()
six_hourly_report()

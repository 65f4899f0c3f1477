"""A dynamically mapped task over partitions, each partition reserved on its own.

Every mapped instance derives its key from its own argument, so partitions are independent: a run that
finds partition 2 done and partition 3 being processed by another run uses the first, defers on the
second and processes the rest. Partitions whose content did not change (same ``partition`` and
``checksum``) are never processed twice, whatever DAG run asks.

The classic-operator form of the same thing is ``ReservedPythonOperator.partial(...).expand(...)``,
shown by ``validate``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import dag, task

from dibs_provider.operators.reserved import ReservedPythonOperator


def validate_partition(partition: str) -> bool:
    return partition.startswith("part-")


@dag(
    dag_id="dibs_mapped_partitions",
    schedule="@hourly",
    start_date=dt.datetime(2026, 1, 1),
    catchup=False,
    tags=["dibs", "example"],
    # Retries, as for any production DAG, and for a reserved task in particular: a waiter that Airflow
    # fails by mistake while it is deferred (docs/airflow.md, "A known Airflow race") retries and gets
    # the stored artifact.
    default_args={"retries": 2, "retry_delay": dt.timedelta(seconds=15)},
)
def mapped_partitions() -> None:
    @task
    def list_partitions() -> list[dict[str, str]]:
        # In real life: list the files of a bucket with their checksums.
        return [{"partition": f"part-{i}", "checksum": f"sha256:{i:04d}"} for i in range(3)]

    @task.reserved(version="1")
    def process(partition: str, checksum: str) -> dict[str, Any]:
        return {"partition": partition, "rows": 100 + len(checksum)}

    @task
    def combine(results: list[dict[str, Any]]) -> int:
        return sum(r["rows"] for r in results)

    partitions = list_partitions()
    combine(process.expand_kwargs(partitions))

    ReservedPythonOperator.partial(task_id="validate", python_callable=validate_partition).expand(
        op_kwargs=[{"partition": f"part-{i}"} for i in range(3)]
    )


mapped_partitions()

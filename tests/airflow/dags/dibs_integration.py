"""The DAG the multi-process integration test runs (tests/airflow/test_integration.py).

Three processes each run this DAG once (different logical dates, so different runs and owners) against
one shared SQLite store. The reserved task records every execution and every deferral in files of
``DIBS_IT_DIR``; the one run that acquires the key holds it until the test has seen the other two
defer, so the scenario is deterministic without any sleep-timed step.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from pathlib import Path
from typing import Any, NoReturn

from airflow.sdk import DAG, task

from dibs_provider.operators.reserved import OUTCOME_XCOM_KEY, ReservedPythonOperator


def _workdir() -> Path:
    return Path(os.environ["DIBS_IT_DIR"])


def _append(name: str, line: str) -> None:
    with open(_workdir() / name, "a") as f:
        f.write(line + "\n")


def build_features(region: str) -> dict[str, Any]:
    """The expensive task: must run exactly once across the three runs."""
    _append("executions.txt", str(os.getpid()))
    deadline = time.monotonic() + 120
    while not (_workdir() / "go").exists():  # the test says go once both other runs deferred
        if time.monotonic() > deadline:
            raise TimeoutError("the test never signalled 'go'")
        time.sleep(0.02)
    return {"region": region, "rows": 42, "built_by": os.getpid()}


class CountingReservedPythonOperator(ReservedPythonOperator):
    """Records each deferral so the test knows when both waiting runs are parked in the trigger."""

    def defer(self, **kwargs: Any) -> NoReturn:
        _append("deferrals.txt", str(os.getpid()))
        super().defer(**kwargs)


with DAG("dibs_integration", schedule=None, start_date=dt.datetime(2024, 1, 1), catchup=False):
    features = CountingReservedPythonOperator(
        task_id="build_features", python_callable=build_features, op_kwargs={"region": "eu"}
    )

    @task
    def record(value: dict[str, Any], ti: Any = None) -> None:
        outcome = ti.xcom_pull(task_ids="build_features", key=OUTCOME_XCOM_KEY)
        _append("results.jsonl", json.dumps({"pid": os.getpid(), "value": value, "outcome": outcome}))

    record(features.output)

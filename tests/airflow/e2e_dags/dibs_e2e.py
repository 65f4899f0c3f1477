"""The DAGs of the end-to-end test (tests/airflow/test_deployment.py), written as a user writes one.

Each run builds the features of ``dag_run.conf["scenario"]`` with ``@task.reserved``: runs of one
scenario share the key, so one computes and the others defer until it is stored. The expensive task
records the pid of its task process in ``executions-<scenario>.txt`` (so the test can count
computations, and SIGKILL a holder) and holds the key until the test creates ``gate-<scenario>``.
``record`` appends what its run received, and how (the ``dibs_outcome`` XCom), to
``results-<scenario>.jsonl``. The files live in ``DIBS_E2E_DIR``.

``dibs_e2e_outage`` does the same on the ``dibs_outage`` connection, a PostgreSQL server of the test's
own that it restarts while the runs wait (a long ttl: the holder's lease outlives the outage).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import time
from pathlib import Path
from typing import Any

from airflow.sdk import dag, task

from dibs_provider.operators.reserved import OUTCOME_XCOM_KEY

HOLD_AT_MOST = 300.0  # seconds: a holder never blocks longer, even if the test died


def _append(name: str, line: str) -> None:
    with open(Path(os.environ["DIBS_E2E_DIR"]) / name, "a") as out:  # O_APPEND: one line per write
        out.write(line + "\n")


def _retry_after_the_takeover(context: Any) -> None:
    """Hold a retry back while the test holds its run back (``hold-retry-<run id>`` exists).

    The test's killed holder must be taken over by a waiter, and its own retry must then find the
    taker's artifact. Which comes first otherwise depends on how fast a busy machine starts the
    waiters' tasks: a retry that asks first re-enters its own expired lease (token 1), as a retry
    should, and the takeover the test is about never happens.
    """
    ti = context["ti"]
    held = Path(os.environ["DIBS_E2E_DIR"]) / f"hold-retry-{ti.run_id}"
    deadline = time.monotonic() + HOLD_AT_MOST
    while ti.try_number > 1 and held.exists() and time.monotonic() < deadline:
        time.sleep(0.1)


# A SIGKILLed holder is taken over about 6 s after its last heartbeat. Retries as in production: the
# killed holder's run retries after the takeover (the test holds it back until then, see above) and
# finds the artifact, and a waiter that Airflow fails by mistake (its trigger fired before the
# scheduler read the executor's stale success for the deferral's exit, which the worker can report up
# to [workers] min_heartbeat_interval late: apache/airflow#67287 and #72716, docs/airflow.md) retries
# instead of failing its DAG run.
@task.reserved(ttl=6, retries=2, retry_delay=dt.timedelta(seconds=30), pre_execute=_retry_after_the_takeover)
def build_features(scenario: str) -> dict[str, Any]:
    return _build(scenario)


@task.reserved(
    conn_id="dibs_outage", ttl=90, task_id="build_features", retries=2, retry_delay=dt.timedelta(seconds=30)
)
def build_through_an_outage(scenario: str) -> dict[str, Any]:
    return _build(scenario)


def _build(scenario: str) -> dict[str, Any]:
    _append(f"executions-{scenario}.txt", str(os.getpid()))
    gate = Path(os.environ["DIBS_E2E_DIR"]) / f"gate-{scenario}"
    deadline = time.monotonic() + HOLD_AT_MOST
    while not gate.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return {"scenario": scenario, "rows": 42, "built_by": os.getpid()}


def _plain(value: Any) -> Any:
    """The outcome's lease token (a dataclass) as JSON."""
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else str(value)


@task
def record(value: dict[str, Any], ti: Any = None) -> None:
    outcome = ti.xcom_pull(task_ids="build_features", key=OUTCOME_XCOM_KEY)
    line = {"run_id": ti.run_id, "value": value, "outcome": outcome}
    _append(f"results-{value['scenario']}.jsonl", json.dumps(line, default=_plain))


@dag(dag_id="dibs_e2e", schedule=None, start_date=dt.datetime(2026, 1, 1), catchup=False)
def dibs_e2e() -> None:
    record(build_features("{{ dag_run.conf['scenario'] }}"))


@dag(dag_id="dibs_e2e_outage", schedule=None, start_date=dt.datetime(2026, 1, 1), catchup=False)
def dibs_e2e_outage() -> None:
    record(build_through_an_outage("{{ dag_run.conf['scenario'] }}"))


dibs_e2e()
dibs_e2e_outage()

"""Runs ``dag.test()`` in a fresh process: the multiprocessing (spawn) target of test_integration.

It must not import Airflow at module level: each child first points Airflow at its own home and its
own copy of a migrated metadata database (processes sharing one SQLite metadata DB would lock each
other out), and Airflow reads its configuration on import. The dibs store, in contrast, is shared:
that is the point.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any


def run_dags(
    *,
    home: str,
    template_db: str,
    dags_folder: str,
    env: dict[str, str],
    runs: list[dict[str, Any]],
    results: str,
) -> None:
    """Run each ``{"dag_id", "logical_date", "run_after"?, "conf"?}`` with ``dag.test()``; append what each
    run did to ``results``.

    A ``logical_date`` of ``None`` is a manual trigger without one (Airflow 3's default for "Trigger" in
    the UI and ``airflow dags trigger``): templates then have no ``ds``. Dates are ISO strings in UTC.
    Exits 0 when every run succeeded. Output goes to ``<home>/child.log``.
    """
    home_path = Path(home)
    home_path.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template_db, home_path / "airflow.db")
    log = open(home_path / "child.log", "w")  # noqa: SIM115 - lives as long as the process
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    for name in [n for n in os.environ if n.startswith("AIRFLOW_CONN_")]:
        del os.environ[name]
    os.environ.update(
        {
            "AIRFLOW_HOME": home,
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home_path / 'airflow.db'}",
            "AIRFLOW__CORE__DAGS_FOLDER": dags_folder,
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            **env,
        }
    )

    import datetime as dt

    from tests.airflow.compat import dag_bag

    bag = dag_bag(dags_folder)

    def utc(day: str | None) -> dt.datetime | None:
        return None if day is None else dt.datetime.fromisoformat(day).replace(tzinfo=dt.UTC)

    ok = True
    for spec in runs:
        dag_id = spec["dag_id"]
        dag = bag.dags.get(dag_id)
        if dag is None:
            raise RuntimeError(f"{dag_id} did not parse: {bag.import_errors}")
        run = dag.test(
            logical_date=utc(spec["logical_date"]),
            run_after=utc(spec.get("run_after")),
            run_conf=spec.get("conf"),
        )
        record = {
            "pid": os.getpid(),
            "dag_id": dag_id,
            "state": str(run.state),
            "logical_date": None if run.logical_date is None else run.logical_date.isoformat(),
            "tries": _tries(run),
            **run_xcoms(run),
        }
        with open(results, "a") as f:
            f.write(json.dumps(record) + "\n")
        ok = ok and record["state"] == "success"
    sys.stdout.flush()
    sys.exit(0 if ok else 3)


def _tries(run: Any) -> dict[str, int]:
    """How many tries each task instance of the run took, by ``task_id[map_index]``."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.scalars(
            select(TaskInstance).where(TaskInstance.dag_id == run.dag_id, TaskInstance.run_id == run.run_id)
        ).all()
        return {f"{ti.task_id}[{ti.map_index}]": ti.try_number for ti in rows}


def run_xcoms(run: Any) -> dict[str, Any]:
    """The run's ``dibs_outcome`` and ``return_value`` XComs, by ``task_id[map_index]``."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    found: dict[str, dict[str, Any]] = {"outcomes": {}, "values": {}}
    with create_session() as session:
        rows = session.scalars(
            select(XComModel).where(XComModel.dag_id == run.dag_id, XComModel.run_id == run.run_id)
        ).all()
        for row in rows:
            slot = {"dibs_outcome": "outcomes", "return_value": "values"}.get(row.key)
            if slot is not None:
                found[slot][f"{row.task_id}[{row.map_index}]"] = XComModel.deserialize_value(row)
    return found

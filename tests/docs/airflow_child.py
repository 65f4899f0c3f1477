"""Parses a folder of DAG files as Airflow's DAG processor does and runs DAGs with ``dag.test()``.

Run by :meth:`tests.docs.context.DocContext.run_dags` in a fresh process whose environment points
Airflow at a throw-away home and migrated metadata database:

    python -m tests.docs.airflow_child DAGS_FOLDER LOGICAL_DATE DAG_ID...

Prints, as its last line, a JSON list with one record per DAG run: ``dag_id``, ``state`` and the
run's ``dibs_outcome`` and ``return_value`` XComs by ``task_id[map_index]``.
"""

from __future__ import annotations

import datetime as dt
import json
import sys

from tests.airflow._child import run_xcoms
from tests.airflow.compat import dag_bag


def main(folder: str, logical_date: str, *dag_ids: str) -> None:
    bag = dag_bag(folder)
    if bag.import_errors:
        raise SystemExit(f"the DAG files did not parse: {bag.import_errors}")
    day = dt.datetime.fromisoformat(logical_date).replace(tzinfo=dt.UTC)
    records = []
    for dag_id in dag_ids:
        dag = bag.dags.get(dag_id)
        if dag is None:
            raise SystemExit(f"no DAG {dag_id!r} in {folder}: found {sorted(bag.dags)}")
        run = dag.test(logical_date=day)
        records.append({"dag_id": dag_id, "state": str(run.state), **run_xcoms(run)})
    sys.stdout.flush()
    print(json.dumps(records))


if __name__ == "__main__":
    main(*sys.argv[1:])

"""The deployment that ``test_deployments.py`` serves: ``python -m tests.prefect.served NAME LIMIT``.

A user's setup, nothing test-specific in the code path: a flow whose expensive task is stacked under
``@reserved`` (the store comes from ``DIBS_STORE_URL``, as in a real deployment), served with
``flow.serve``; the test triggers it with ``prefect deployment run``. The served runner starts every
flow run in a process of its own. The task counts executions in a file and blocks until a gate file
exists (so the test decides when the computation may finish); each flow run appends what it
returned to a results file.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from prefect import flow, task
from prefect_dibs import reserved
from tests.prefect.flows import _expensive

FLOW_NAME = "dibs-e2e-features"


@reserved(key="features-{day}", ttl=30)
@task
def build_features(day: str, count_file: str, gate_file: str) -> dict[str, Any]:
    return {"day": day, **_expensive(len(day), count_file, gate_file)}


@flow(name=FLOW_NAME)
def features(day: str, count_file: str, gate_file: str, results_file: str) -> dict[str, Any]:
    from prefect.runtime import flow_run

    value = build_features(day, count_file, gate_file)
    with open(results_file, "a") as out:  # O_APPEND: concurrent runs never interleave a line
        out.write(json.dumps({"flow_run_id": str(flow_run.id), "pid": os.getpid(), "value": value}) + "\n")
    return value


if __name__ == "__main__":
    features.serve(name=sys.argv[1], limit=int(sys.argv[2]))

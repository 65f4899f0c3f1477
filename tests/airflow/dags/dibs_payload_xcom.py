"""The DAG of test_integration's payload scenario: a reserved TaskFlow task returns a value larger
than the payload store's inline limit, and a downstream TaskFlow task receives it as its argument.

With ``dibs_provider.xcom.DibsXComBackend`` as Airflow's XCom backend, the reserved task's
``return_value`` XCom is a small reference and the downstream task still gets the value (resolved
through dibs). What the downstream task received is written to ``DIBS_IT_DIR/received.json``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from pathlib import Path

from airflow.sdk import DAG, task

SIZE = 300_000  # above the default 64 KiB inline limit


with DAG("dibs_payload_xcom", schedule=None, start_date=dt.datetime(2024, 1, 1), catchup=False):

    @task.reserved(key="big-export")
    def export() -> str:
        return "x" * SIZE

    @task
    def consume(value: str) -> None:
        received = {"size": len(value), "sha256": hashlib.sha256(value.encode()).hexdigest()}
        (Path(os.environ["DIBS_IT_DIR"]) / "received.json").write_text(json.dumps(received))

    consume(export())

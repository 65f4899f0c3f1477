"""End to end, the way Prefect users deploy: ``prefect server start``, a served deployment, CLI triggers.

A real Prefect server (its own home and SQLite database in a temporary folder, on a free port), the
flow of ``tests/prefect/served.py`` served by ``flow.serve`` in another process, and several
``prefect deployment run`` invocations at once. The served runner starts each flow run in a process
of its own; all of them reach the same reserved task. Exactly one computes; the others show a
``Waiting`` task run in the API until the computation is released, then return its artifact.

CI runs 3 flow runs; ``DIBS_FULL=1`` runs 8.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("prefect")

import httpx

import dibs
from tests.components import Components, free_port, run_at_once
from tests.prefect.served import FLOW_NAME
from tests.prefect.support import ROOT
from tests.services import full_size, unavailable

pytestmark = pytest.mark.slow

PREFECT = str(Path(sys.executable).with_name("prefect"))
DEPLOYMENT = "e2e"
RUNS = 8 if full_size() else 3


class Prefect:
    """A running Prefect server and the environment that points processes at it."""

    def __init__(self, components: Components, tmp_path: Path) -> None:
        self.components = components
        port = free_port()
        self.api = f"http://127.0.0.1:{port}/api"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "DIBS_STORE_URL"))}
        env.update(
            PREFECT_HOME=str(tmp_path / "prefect-home"),
            PREFECT_API_URL=self.api,
            PREFECT_SERVER_ANALYTICS_ENABLED="false",
            PREFECT_UI_ENABLED="false",
            PREFECT_RUNNER_POLL_FREQUENCY="1",
            PREFECT_LOGGING_LEVEL="INFO",
            DIBS_STORE_URL=f"sqlite:///{tmp_path / 'dibs.db'}",
            PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        )
        self.env = env
        self.server = components.start(
            "prefect-server",
            [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env,
            serves=True,
        )

    def get(self, path: str) -> Any:
        response = httpx.get(f"{self.api}{path}", timeout=30)
        return response.json() if response.status_code == 200 else None

    def post(self, path: str, body: dict[str, Any]) -> Any:
        response = httpx.post(f"{self.api}{path}", json=body, timeout=30)
        response.raise_for_status()
        return response.json()

    def healthy(self) -> bool:
        try:
            return self.get("/health") is True
        except httpx.HTTPError:
            return False


@pytest.fixture
def prefect_server(tmp_path: Path) -> Iterator[Prefect]:
    components = Components(tmp_path / "logs", ROOT)
    try:
        server = Prefect(components, tmp_path)
        try:
            components.wait_until(server.healthy, "the Prefect server to answer /api/health", bound=180)
        except pytest.fail.Exception as exc:
            unavailable(f"prefect server start did not come up: {exc}")
        yield server
    finally:
        components.stop_all()


def test_concurrent_runs_of_a_served_deployment_compute_once(prefect_server: Prefect, tmp_path: Path) -> None:
    server, components = prefect_server, prefect_server.components
    gate, count, results = tmp_path / "gate", tmp_path / "executions", tmp_path / "results.jsonl"
    components.start(
        "served", [sys.executable, "-m", "tests.prefect.served", DEPLOYMENT, str(RUNS + 2)], server.env
    )
    deployment = components.wait_until(
        lambda: server.get(f"/deployments/name/{FLOW_NAME}/{DEPLOYMENT}"), "the served deployment"
    )

    params = {
        "day": "2026-11-25",
        "count_file": str(count),
        "gate_file": str(gate),
        "results_file": str(results),
    }
    trigger = [PREFECT, "deployment", "run", f"{FLOW_NAME}/{DEPLOYMENT}", "--params", json.dumps(params)]
    run_at_once([trigger] * RUNS, server.env, ROOT)  # each CLI creates its flow run and exits

    def task_runs(state_name: str) -> list[dict[str, Any]]:
        return server.post(  # type: ignore[no-any-return]
            "/task_runs/filter",
            {
                "flows": {"name": {"any_": [FLOW_NAME]}},
                "task_runs": {"state": {"name": {"any_": [state_name]}}},
            },
        )

    # One run computes (it blocks on the gate) while every other one shows that it is waiting.
    components.wait_until(lambda: count.exists() and count.read_text().split(), "one run to start computing")
    components.wait_until(lambda: len(task_runs("Waiting")) == RUNS - 1, f"{RUNS - 1} waiting task runs")
    gate.touch()

    def finished() -> list[dict[str, Any]] | None:
        runs = server.post("/flow_runs/filter", {"deployments": {"id": {"any_": [deployment["id"]]}}})
        done = [run for run in runs if run["state_type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")]
        return runs if len(done) == RUNS else None

    runs = components.wait_until(finished, f"{RUNS} flow runs to finish")
    assert sorted(run["state_type"] for run in runs) == ["COMPLETED"] * RUNS, runs

    executions = count.read_text().split()
    assert len(executions) == 1  # one computation for all the runs
    done = [json.loads(line) for line in results.read_text().splitlines()]
    assert sorted(d["flow_run_id"] for d in done) == sorted(run["id"] for run in runs)
    assert len({d["pid"] for d in done}) == RUNS  # each flow run ran in a process of its own
    expected = {"day": "2026-11-25", "x": 10, "squared": 100, "computed_by": int(executions[0])}
    assert [d["value"] for d in done] == [expected] * RUNS
    # The run that computed ends Completed; the runs that waited for its result end Cached, as
    # Prefect's own cache hits do.
    assert len(task_runs("Completed")) == 1
    assert len(task_runs("Cached")) == RUNS - 1
    with dibs.Reservations(server.env["DIBS_STORE_URL"]) as client:
        hit = client.get_or_reserve("features-2026-11-25")
    assert isinstance(hit, dibs.Hit) and hit.value == expected
    assert hit.producer.startswith("prefect-task-run:build_features")

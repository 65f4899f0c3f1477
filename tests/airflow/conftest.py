"""Shared setup of the Airflow provider tests.

Airflow reads its configuration when it is first imported, so its environment is set here, at import
time of this conftest (before any test module of this folder imports Airflow): a throw-away
``AIRFLOW_HOME`` and no example DAGs. Each test also gets its own ``DIBS_HOME`` (so the embedded
default store never touches the user's own) and no ``DIBS_STORE_URL`` or ``AIRFLOW_CONN_*`` from
outside. No metadata database is needed except by the integration tests, which migrate their own.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_HOME = Path(tempfile.mkdtemp(prefix="dibs-airflow-tests-"))
atexit.register(shutil.rmtree, _HOME, ignore_errors=True)
os.environ["AIRFLOW_HOME"] = str(_HOME / "airflow")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(_HOME / "dags")


@pytest.fixture(autouse=True)
def _hermetic_dibs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No store or connection leaks in from the environment; the embedded default lives in tmp_path."""
    for name in [n for n in os.environ if n.startswith("AIRFLOW_CONN_")] + ["DIBS_STORE_URL"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DIBS_HOME", str(tmp_path / "dibs-home"))


@pytest.fixture
def store_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh SQLite store, also what a task without a ``dibs_default`` connection uses."""
    url = f"sqlite:///{tmp_path / 'dibs.db'}"
    monkeypatch.setenv("DIBS_STORE_URL", url)
    return url


@pytest.fixture
def client(store_url: str) -> Iterator[Any]:
    """A core client on the test store, for arranging and inspecting keys."""
    import dibs

    with dibs.Reservations(store_url, ttl=30) as reservations:
        yield reservations


class FakeTaskInstance:
    """The few task-instance attributes a reserved operator uses, with XComs kept in a dict."""

    def __init__(self, dag_id: str = "dag", run_id: str = "run_1", task_id: str = "t", map_index: int = -1):
        self.dag_id = dag_id
        self.run_id = run_id
        self.task_id = task_id
        self.map_index = map_index
        self.try_number = 1
        self.xcoms: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[key] = value


@pytest.fixture
def make_context() -> Any:
    """``make_context(run_id=..., **extra)``: a minimal task context for calling ``execute`` directly."""

    def make(
        *, dag_id: str = "dag", run_id: str = "run_1", task_id: str = "t", map_index: int = -1, **extra: Any
    ):
        ti = FakeTaskInstance(dag_id, run_id, task_id, map_index)
        context: dict[str, Any] = {"ti": ti, "task_instance": ti, "run_id": run_id, "ds": "2024-01-01"}
        context.update(extra)
        return context

    return make

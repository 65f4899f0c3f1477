"""One document's test context: its temporary directory and store, the services it names, helpers.

A :class:`DocContext` lives as long as one Markdown file's tests; invisible blocks reach it as
``docs``. Services are opened when a block first names them, so a document that never mentions
PostgreSQL runs without it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from sybil import Example

from tests.docs import airflow_db, substitutions

ROOT = Path(__file__).resolve().parents[2]
FENCED_BLOCK = re.compile(r"^[ \t]*```(?P<language>\w*)[ \t]*\n(?P<source>.*?)^[ \t]*```", re.M | re.S)


class DocContext:
    """What the snippets of ``document`` run in: see :mod:`tests.docs`."""

    def __init__(self, document: Path, workdir: Path, *, prefect_api: str | None, airflow: bool) -> None:
        self.document = document
        self.workdir = workdir
        self.store_url = f"sqlite:///{workdir / 'dibs.db'}"
        self.prefect_api = prefect_api
        self.airflow = airflow
        self.example: Example | None = None
        self.python_sources: list[str] = []  # the visible python blocks run so far, substituted
        self.skipped: str | None = None
        self._postgres_url: str | None = None
        self._collector: Any = None
        self._airflow_home: Path | None = None
        self._resources = ExitStack()

    # -- what a block runs in --------------------------------------------------------------------
    def base_env(self) -> dict[str, str]:
        """The environment of the document's commands: a temporary store and home, the venv first."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW_CONN_")}
        env.update(
            PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
            DIBS_STORE_URL=self.store_url,
            DIBS_HOME=str(self.workdir / "dibs-home"),
            PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]),
        )
        if self.prefect_api is not None:
            env.update(
                PREFECT_API_URL=self.prefect_api,
                PREFECT_LOCAL_STORAGE_PATH=str(self.workdir / "prefect-results"),
            )
        return env

    def shell_env(self) -> dict[str, str]:
        env = self.base_env()
        if self.airflow:
            env.update(self.airflow_env())
        return env

    def substitute(self, source: str) -> str:
        return substitutions.substitute(
            source,
            postgres_url=self.postgres_url,
            prefect_api=self._prefect_api,
            otlp_endpoint=lambda: self.collector().url,
            workdir=self.workdir,
        )

    def collector(self) -> Any:
        """The document's OTLP/HTTP endpoint (tests/observability/otlp.py), started when first named."""
        if self._collector is None:
            from tests.observability.otlp import Collector

            self._collector = self._resources.enter_context(Collector())
        return self._collector

    def _prefect_api(self) -> str:
        needed = "needs PREFECT in tests/docs/plugin.py: DOCUMENTS"
        assert self.prefect_api is not None, f"{self.document.name} names a Prefect server: it {needed}"
        return self.prefect_api

    def postgres_url(self) -> str:
        """The test PostgreSQL server, in a schema of this document's (dropped at the end)."""
        if self._postgres_url is None:
            from tests.backends import postgres

            self._postgres_url = self._resources.enter_context(postgres.isolated_url(self.workdir))
        return self._postgres_url

    def airflow_env(self) -> dict[str, str]:
        """A throw-away Airflow home with a migrated SQLite metadata database, for Airflow commands."""
        home = self.workdir / "airflow"
        if self._airflow_home is None:
            airflow_db.MIGRATED.copy_to(home)
            self._airflow_home = home
        return {
            **airflow_db.airflow_settings(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.workdir / "dags"),
            # `airflow connections test` is disabled unless configured (docs/airflow.md says so).
            "AIRFLOW__CORE__TEST_CONNECTION": "Enabled",
        }

    # -- helpers for invisible blocks ------------------------------------------------------------
    def previous_block(self) -> str:
        """The source of the last fenced block shown before the running one (as written, unsubstituted)."""
        assert self.example is not None
        text = self.example.document.text
        blocks = [m for m in FENCED_BLOCK.finditer(text) if m.end() <= self.example.start]
        assert blocks, f"no fenced block before line {self.example.line}"
        return blocks[-1].group("source")

    def save_previous_block(self, name: str) -> Path:
        """Write the previous block (substituted) into the working directory, as the docs ask a reader to."""
        path = self.workdir / name
        path.write_text(self.substitute(self.previous_block()))
        return path

    def run_dags(self, *dag_ids: str, logical_date: str) -> list[dict[str, Any]]:
        """The document's python blocks so far, saved as one DAG file, parsed by Airflow and each DAG
        run with ``dag.test()`` in a fresh process (Airflow configures itself on import); returns
        what each run did (``tests/docs/airflow_child.py``)."""
        dags = self.workdir / "dags"
        dags.mkdir(exist_ok=True)
        (dags / f"{self.document.stem}_dags.py").write_text("\n\n".join(self.python_sources))
        done = subprocess.run(
            [sys.executable, "-m", "tests.docs.airflow_child", str(dags), logical_date, *dag_ids],
            env=self.shell_env(),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=airflow_db.AIRFLOW_BOUND,
            check=False,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        runs: list[dict[str, Any]] = json.loads(done.stdout.splitlines()[-1])
        return runs

    # -- lifecycle -------------------------------------------------------------------------------
    def enter(self, example: Example, *, shares_namespace: bool) -> None:
        """Called before each block. Python blocks build on the ones before them (one namespace):
        after one skipped for an absent service, they skip too."""
        if shares_namespace and self.skipped is not None:
            pytest.skip(f"an earlier block of {self.document.name} was skipped: {self.skipped}")
        self.example = example

    def close(self) -> None:
        self._resources.close()

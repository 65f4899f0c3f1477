"""A migrated Airflow metadata database, prepared in the background while other tests run.

``airflow db migrate`` spends several seconds starting Airflow. The docs plugin starts it as soon as
the session has collected a page that needs Airflow; the page's commands then work on a copy
(:meth:`DocContext.airflow_env <tests.docs.context.DocContext.airflow_env>`), as the Airflow
integration tests do with their template database.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

AIRFLOW_BOUND = 300.0  # seconds for an Airflow subprocess: only ever reached when something is broken


def airflow_settings(home: Path) -> dict[str, str]:
    """Environment for Airflow with its home and SQLite metadata database in ``home``."""
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    }


class MigratedDatabase:
    """One ``airflow db migrate`` per session, started early, copied into each page's Airflow home."""

    def __init__(self) -> None:
        self._folder: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if self._process is not None or importlib.util.find_spec("airflow") is None:
            return
        self._folder = Path(tempfile.mkdtemp(prefix="dibs-docs-airflow-"))
        atexit.register(shutil.rmtree, self._folder, ignore_errors=True)
        with open(self._folder / "migrate.log", "wb") as log:
            self._process = subprocess.Popen(
                [str(Path(sys.executable).with_name("airflow")), "db", "migrate"],
                env={**os.environ, **airflow_settings(self._folder)},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        atexit.register(self._process.kill)  # a session that ends first does not wait for it

    def copy_to(self, home: Path) -> None:
        """Wait for the migration (starting it if nobody has) and copy its database into ``home``."""
        self.start()
        assert self._process is not None and self._folder is not None, "Airflow is not installed"
        try:
            status = self._process.wait(timeout=AIRFLOW_BOUND)
        except subprocess.TimeoutExpired:
            self._process.kill()
            raise
        log = (self._folder / "migrate.log").read_text(errors="replace")
        assert status == 0, f"airflow db migrate exited {status}:\n{log[-4000:]}"
        home.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self._folder / "airflow.db", home / "airflow.db")


MIGRATED = MigratedDatabase()

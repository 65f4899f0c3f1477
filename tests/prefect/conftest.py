"""Fixtures of the Prefect integration tests.

One Prefect API serves the whole session (``prefect_api``, from tests/prefect/harness.py: a
``prefect_test_harness`` server subprocess on loopback with a throw-away database, shared with the
docs' Prefect snippets); flow runs started in child processes point at it through ``PREFECT_API_URL``.
Each test gets its own SQLite dibs store, which every process of the test shares.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from tests.prefect.support import ROOT

if importlib.util.find_spec("prefect") is None:  # the test modules skip themselves too
    collect_ignore_glob = ["*.py"]


@pytest.fixture(scope="session", autouse=True)
def _prefect_server(prefect_api: str) -> str:
    """Every test here runs against the session's Prefect API (``prefect_api``: tests/prefect/harness.py)."""
    return prefect_api


@pytest.fixture
def dibs_url(tmp_path: Path) -> str:
    """A fresh SQLite dibs store, shareable by every process of the test."""
    return f"sqlite:///{tmp_path / 'dibs.db'}"


@pytest.fixture
def child_env(prefect_api: str, tmp_path: Path) -> dict[str, str]:
    """Environment for child processes running flows against the session's API."""
    env = dict(os.environ)
    env.update(
        PREFECT_API_URL=prefect_api,
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_LOGGING_LEVEL="INFO",
        # Shared by every child: Prefect's own result storage (the native-cache tests read each
        # other's cached results through it).
        PREFECT_LOCAL_STORAGE_PATH=str(tmp_path / "prefect-results"),
        PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]),
    )
    env.pop("DIBS_STORE_URL", None)
    return env


@pytest.fixture
def anyio_backend() -> str:
    """Async tests run on asyncio (Prefect's loop), through anyio's pytest plugin."""
    return "asyncio"

"""Fixtures of the Prefect integration tests.

One Prefect API serves the whole session (``prefect_test_harness`` starts a server subprocess on
loopback with a throw-away database); flow runs started in child processes point at it through
``PREFECT_API_URL``. Each test gets its own SQLite dibs store, which every process of the test shares.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.prefect.support import ROOT

if importlib.util.find_spec("prefect") is None:  # the test modules skip themselves too
    collect_ignore_glob = ["*.py"]

# Before Prefect reads its settings: no telemetry calls from the test server (they time out offline).
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


@pytest.fixture(scope="session", autouse=True)
def prefect_api() -> Iterator[str]:
    """The session's Prefect API URL (a harness server with a temporary database)."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        url = PREFECT_API_URL.value()
        assert url, "the Prefect test harness did not set an API URL"
        yield url
    from prefect_dibs import _clients

    _clients.clear_cache()


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

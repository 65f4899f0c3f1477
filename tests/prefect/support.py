"""Helpers shared by the Prefect integration tests (fixtures are in conftest.py)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
T = TypeVar("T")


def wait_until(condition: Callable[[], T | None], *, timeout: float = 90.0, what: str = "the condition") -> T:
    """Poll ``condition`` until it is truthy and return it; fail after a generous ``timeout``.

    Tests wait for *conditions*, never for a fixed time: a loaded CI machine is slower, not wrong.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.02)


def in_forked_child(check: Callable[[], bool]) -> bool:
    """Run ``check`` in a child forked from this process and return what it answered (an error in the
    child is an answer of ``False``). The child leaves at once, running none of the parent's teardown."""
    if sys.platform == "win32":  # pragma: no cover - fork is POSIX
        pytest.skip("fork is POSIX")
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child, measured by the parent
        code = 2
        try:
            code = 0 if check() else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def server_events(flow_run_ids: list[UUID], prefix: str = "dibs.") -> list[dict[str, Any]]:
    """The Prefect server's events named ``prefix...`` related to these flow runs (its REST API, as the
    UI's event feed reads them)."""
    import httpx
    from prefect.settings import PREFECT_API_URL

    query = {
        "filter": {
            "event": {"prefix": [prefix]},
            "related": {"id": [f"prefect.flow-run.{run}" for run in flow_run_ids]},
        },
        "limit": 50,
    }
    response = httpx.post(f"{PREFECT_API_URL.value()}/events/filter", json=query, timeout=30)
    response.raise_for_status()
    return list(response.json()["events"])

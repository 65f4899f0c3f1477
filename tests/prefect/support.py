"""Helpers shared by the Prefect integration tests (fixtures are in conftest.py)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

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

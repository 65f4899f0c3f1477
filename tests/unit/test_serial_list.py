"""The files that ``scripts/test`` runs alone (``tests/serial.py``) exist: a renamed or moved one would
otherwise drop out of the list silently and run beside other tests."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import pytest

from tests.serial import BESIDE, ROOT, SERIAL, runs_beside


def test_every_serial_file_exists() -> None:
    missing = sorted(path for path in SERIAL if not (ROOT / path).is_file())
    assert not missing, f"tests/serial.py names files that do not exist: {missing}; update SERIAL"


def test_the_second_lane_takes_only_serial_files() -> None:
    """A file of ``BESIDE`` that is not serial would run in part 1 anyway: the lane would say nothing."""
    assert BESIDE <= SERIAL, sorted(BESIDE - SERIAL)


def test_a_serial_file_runs_in_the_lane_its_list_gives() -> None:
    """By file: the reliability suite beside the rest, a deployment with the rest."""

    def item(path: str) -> pytest.Item:
        return cast(pytest.Item, SimpleNamespace(path=ROOT / path))

    assert runs_beside(item("tests/test_reliability.py"))
    assert not runs_beside(item("tests/airflow/test_deployment.py"))
    assert {runs_beside(item(path)) for path in SERIAL} == {True, False}

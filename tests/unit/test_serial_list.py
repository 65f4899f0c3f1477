"""The files that ``scripts/test`` runs alone (``tests/serial.py``) exist: a renamed or moved one would
otherwise drop out of the list silently and run beside other tests."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import pytest

from tests.serial import LANES, ROOT, SERIAL, lane_of


def test_every_serial_file_exists() -> None:
    missing = sorted(path for path in SERIAL if not (ROOT / path).is_file())
    assert not missing, f"tests/serial.py names files that do not exist: {missing}; update SERIAL"


def test_the_other_lanes_take_only_serial_files_each_in_one_lane() -> None:
    """A file of a lane that is not serial would run in part 1 anyway: the lane would say nothing; a
    file in two lanes would run twice."""
    for lane, files in LANES.items():
        assert files <= SERIAL, (lane, sorted(files - SERIAL))
    second, third = LANES["lane2"], LANES["lane3"]
    assert not second & third, sorted(second & third)


def test_a_serial_file_runs_in_the_lane_its_list_gives() -> None:
    """By file: the reliability suite in the second lane, the demo in the third, a deployment in the first."""

    def item(path: str) -> pytest.Item:
        return cast(pytest.Item, SimpleNamespace(path=ROOT / path))

    assert lane_of(item("tests/test_reliability.py")) == "lane2"
    assert lane_of(item("tests/test_demo.py")) == "lane3"
    assert lane_of(item("tests/airflow/test_deployment.py")) is None
    assert {lane_of(item(path)) for path in SERIAL} == {None, "lane2", "lane3"}

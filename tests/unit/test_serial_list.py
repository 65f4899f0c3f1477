"""The files that ``scripts/test`` runs alone (``tests/serial.py``) exist: a renamed or moved one would
otherwise drop out of the list silently and run beside other tests."""

from __future__ import annotations

from tests.serial import ROOT, SERIAL


def test_every_serial_file_exists() -> None:
    missing = sorted(path for path in SERIAL if not (ROOT / path).is_file())
    assert not missing, f"tests/serial.py names files that do not exist: {missing}; update SERIAL"

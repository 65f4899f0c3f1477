"""A folder payload store starts writing a large payload to disk while it is still being written
(dibs.payloads.files.WRITEBACK): every byte but the last partial stretch is handed to the hint, in
order, and a hint that fails or cannot be had changes nothing (the fsync at the end stays). A writer
whose payload is there already removes its own copy off the hand-off's path."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from dibs.payloads import files
from dibs.payloads.files import WRITEBACK, FilePayloadStore
from dibs.payloads.verify import read_verified
from tests.cli_harness import eventually


def _recording(ranges: list[tuple[int, int]], result: int = 0) -> Callable[[], object]:
    def hint(fd: int, offset: int, length: int) -> int:
        assert os.fstat(fd).st_size >= offset + length, "the bytes reach the file before the hint"
        ranges.append((offset, length))
        return result

    return lambda: hint


def test_the_write_to_disk_of_each_stretch_is_started_as_the_payload_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ranges: list[tuple[int, int]] = []
    monkeypatch.setattr(files, "_writeback", _recording(ranges))
    data = os.urandom(3 * WRITEBACK + 5)
    payload = FilePayloadStore(tmp_path).put(data)
    assert ranges == [(0, WRITEBACK), (WRITEBACK, WRITEBACK), (2 * WRITEBACK, WRITEBACK)]
    assert read_verified(FilePayloadStore(tmp_path), payload, "test") == data


@pytest.mark.parametrize("hint", ["failing", "unavailable"])
def test_a_hint_that_fails_or_is_missing_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hint: str
) -> None:
    ranges: list[tuple[int, int]] = []
    monkeypatch.setattr(files, "_writeback", _recording(ranges, -1) if hint == "failing" else lambda: None)
    fsyncs: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        fsyncs.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    data = os.urandom(2 * WRITEBACK)
    store = FilePayloadStore(tmp_path)
    payload = store.put(data)
    assert payload.sha256 == hashlib.sha256(data).hexdigest()
    assert read_verified(store, payload, "test") == data
    assert len(fsyncs) == 1  # durability is the fsync's, hint or not


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range is Linux's")
def test_the_hint_is_there_on_linux_and_harmless(tmp_path: Path) -> None:
    start = files._writeback()
    assert start is not None
    path = tmp_path / "f"
    with open(path, "wb") as stream:
        stream.write(b"x" * 4096)
        stream.flush()
        assert start(stream.fileno(), 0, 4096) == 0
    assert path.read_bytes() == b"x" * 4096


def test_a_copy_of_a_payload_already_there_is_removed_once_settled_beside_the_caller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FilePayloadStore(tmp_path)
    data = os.urandom(2 * WRITEBACK)
    first = store.put(data)
    assert store.put(data) == first
    (copy,) = (tmp_path / "partial").iterdir()  # not removed while the hand-off goes on
    assert store.path(first.sha256).exists()
    later: list[tuple[Callable[..., object], tuple[object, ...]]] = []

    def run_beside(function: Callable[..., object], *args: object) -> bool:
        later.append((function, args))  # held back: the helper thread has not run it yet
        return True

    monkeypatch.setattr(files, "run_beside", run_beside)
    store.settle()
    assert [args for _, args in later] == [([copy],)]
    for function, args in later:
        function(*args)
    assert not any((tmp_path / "partial").iterdir())
    assert read_verified(store, first, "test") == data


@pytest.mark.parametrize("by", ["the next writer", "close"])
def test_a_leftover_copy_goes_with_the_next_writer_or_close(tmp_path: Path, by: str) -> None:
    store = FilePayloadStore(tmp_path)
    data = os.urandom(1024)
    store.put(data)
    store.put(data)  # nobody publishes it (put_payload, then no complete): left
    assert any((tmp_path / "partial").iterdir())
    if by == "close":
        store.close()
    else:
        store.writer().abort()
    eventually(lambda: not any((tmp_path / "partial").iterdir()), "the copy to be removed (a helper thread)")


def test_a_leftover_copy_goes_when_the_process_exits_without_a_close(tmp_path: Path) -> None:
    # A worker that only offloads (put_payload) and exits: its copy does not wait for a later prune.
    script = (
        "import os, sys\n"
        "from dibs.payloads.files import FilePayloadStore\n"
        "store = FilePayloadStore(sys.argv[1])\n"
        "data = os.urandom(1024)\n"
        "store.put(data)\n"
        "store.put(data)\n"
        "assert any(os.scandir(os.path.join(sys.argv[1], 'partial')))\n"
    )
    command = [sys.executable, "-c", script, str(tmp_path)]
    done = subprocess.run(command, check=False, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    assert not any((tmp_path / "partial").iterdir())
    copies = [path for path in (tmp_path / "sha256").rglob("*") if path.is_file()]
    assert len(copies) == 2 and len({path.stat().st_ino for path in copies}) == 1  # one payload stays

"""The ``dibs`` command, driven as users drive it: real subprocesses on a shared SQLite store."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

DIBS = [sys.executable, "-m", "dibs"]


def dibs(*args: str, store: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    command, *rest = args
    result = subprocess.run(
        [*DIBS, command, "--store", store, *rest], capture_output=True, text=True, timeout=120, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(f"dibs {' '.join(args)} exited {result.returncode}: {result.stderr}")
    return result


@pytest.fixture
def store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def test_concurrent_runs_execute_the_command_once_and_all_print_its_output(
    store: str, tmp_path: Path
) -> None:
    log = tmp_path / "executions.log"
    script = (
        "import pathlib, time; "
        f"pathlib.Path({str(log)!r}).open('a').write('ran\\n'); "
        "time.sleep(1.5); print('features: 1234 rows'); print('checksum: abc')"
    )
    command = [
        *DIBS,
        "run",
        "--store",
        store,
        "--key",
        "features-2026-11-25",
        "--",
        sys.executable,
        "-c",
        script,
    ]
    runs = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(5)
    ]
    outputs = [run.communicate(timeout=120) for run in runs]
    assert [run.returncode for run in runs] == [0] * 5, [err for _, err in outputs]
    assert log.read_text() == "ran\n"
    assert {out for out, _ in outputs} == {"features: 1234 rows\nchecksum: abc\n"}

    later = dibs("run", "--key", "features-2026-11-25", "--", "false", store=store)
    assert later.stdout == "features: 1234 rows\nchecksum: abc\n"  # stored output, `false` never ran


def test_a_failing_command_keeps_its_status_and_frees_the_key(store: str) -> None:
    failed = dibs(
        "run", "--key", "k", "--", sys.executable, "-c", "import sys; sys.exit(3)", store=store, check=False
    )
    assert failed.returncode == 3
    shown = json.loads(dibs("show", "k", "--json", store=store).stdout)
    assert shown["status"] == "failed" and shown["failures"] == 1 and "status 3" in shown["last_error"]
    assert dibs("run", "--key", "k", "--", "echo", "second", store=store).stdout == "second\n"


def test_ls_show_release_forget_reap(store: str) -> None:
    import dibs as lib

    dibs("run", "--key", "done-key", "--", "echo", "hi", store=store)
    lib.Reservations(store, ttl=600).get_or_reserve("held-key", owner="crashed-worker")
    listing = json.loads(dibs("ls", "--json", store=store).stdout)
    assert {row["key"]: (row["status"], row["holder"]) for row in listing} == {
        "done-key": ("done", None),
        "held-key": ("held", "crashed-worker"),
    }

    table = dibs("ls", store=store).stdout
    assert table.splitlines()[0].split() == ["NAMESPACE", "KEY", "STATUS", "HOLDER", "TOKEN", "DETAIL"]
    assert "done-key" in table

    assert dibs("forget", "done-key", store=store).stdout.strip() == "forgotten"
    assert dibs("forget", "done-key", store=store, check=False).returncode == 1
    assert dibs("release", "done-key", store=store, check=False).stdout.strip() == "no lease to release"
    assert dibs("release", "held-key", store=store).stdout.strip() == "released"
    assert json.loads(dibs("show", "held-key", "--json", store=store).stdout)["status"] == "free"
    assert json.loads(dibs("reap", "--json", store=store).stdout) == {"reaped": 0}


def test_waiters_time_out_with_status_75_naming_the_holder(store: str) -> None:
    import dibs as lib

    client = lib.Reservations(store)
    client.get_or_reserve("busy", owner="etl-nightly")
    result = dibs("run", "--key", "busy", "--timeout", "0.2", "--", "echo", "x", store=store, check=False)
    assert result.returncode == 75
    assert "etl-nightly" in result.stderr
    shown = dibs("show", "busy", store=store).stdout
    assert "holder" in shown and "etl-nightly" in shown


def test_bad_input_is_reported_in_one_line(store: str, tmp_path: Path) -> None:
    result = dibs("ls", store="nope://x", check=False)
    assert result.returncode == 2 and "unknown store scheme 'nope'" in result.stderr
    assert "Traceback" not in result.stderr
    result = dibs("run", "--key", "k", store=store, check=False)
    assert result.returncode == 2 and "give the command after '--'" in result.stderr
    result = dibs("show", "bad\nkey", store=store, check=False)
    assert result.returncode == 2 and "non-printable" in result.stderr

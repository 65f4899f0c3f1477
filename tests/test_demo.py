"""``dibs demo``, run as users run it: a real subprocess, many times in a row.

It once hung after the SIGKILL of act 2 (1 run in 3 by default, every run with ``--workers 2
--work-seconds 1``) and left temporary folders and leaked semaphores behind. Each run here must exit
0 having shown both acts, leave nothing in its own ``TMPDIR``, no worker process, and nothing on
stderr. A hang fails through the pytest timeout, never through a wall-clock assertion.
``DIBS_FULL=1`` runs every configuration more times.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dibs.demo import run_demo
from tests.services import full_size

DEMO = [sys.executable, "-m", "dibs", "demo"]
# (arguments, runs in CI, runs with DIBS_FULL=1): the configuration that hung every time gets the
# most runs; four workers make three waiters race for the takeover; no arguments is the README's.
CONFIGURATIONS = [
    (["--workers", "2", "--work-seconds", "1"], 3, 20),
    (["--workers", "4", "--work-seconds", "1"], 1, 10),
    ([], 1, 5),
]
RUN_CASES = [
    pytest.param(args, run, id=f"{'-'.join(a.strip('-') for a in args) or 'defaults'}-run{run + 1}")
    for args, ci_runs, full_runs in CONFIGURATIONS
    for run in range(full_runs if full_size() else ci_runs)
]
EVENT = re.compile(r"^\s+t\+\s*\d")
# Worker processes are found through /proc (Linux, as in CI); elsewhere that one check is left out.
HAS_PROC = Path("/proc/self/cmdline").exists()


@dataclasses.dataclass
class Sandbox:
    """A TMPDIR of the demo's own, to see what it leaves behind, and the demo processes started in it."""

    folder: Path
    started: list[subprocess.Popen[str]] = dataclasses.field(default_factory=list)

    def start(self, args: list[str], command: list[str] = DEMO) -> subprocess.Popen[str]:
        demo = subprocess.Popen(
            [*command, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "TMPDIR": str(self.folder)},
            process_group=0,  # as a terminal runs a command: a signal to the group is a Ctrl-C
        )
        self.started.append(demo)
        return demo

    def processes(self) -> list[int]:
        """Processes whose command line names the folder (workers get their store URL as an argument)."""
        found = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                if str(self.folder).encode() in cmdline.read_bytes():
                    found.append(int(cmdline.parent.name))
            except OSError:
                continue  # the process ended meanwhile
        return found

    def assert_left_nothing(self, stdout: str) -> None:
        announced = re.search(r"store in (\S+) \(removed at the end\)", stdout)
        assert announced, stdout
        assert Path(announced[1]).parent == self.folder, "the demo did not use the TMPDIR it was given"
        assert list(self.folder.iterdir()) == []
        assert self.processes() == [], "worker processes outlived the demo"


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[Sandbox]:
    folder = tmp_path / "tmp"
    folder.mkdir()
    box = Sandbox(folder)
    yield box
    # Only after a failure (a hang ends in the pytest timeout): nothing outlives the test.
    for demo in box.started:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    for pid in box.processes():
        os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("args", "run"), RUN_CASES)
def test_the_demo_shows_both_acts_and_leaves_nothing_behind(
    args: list[str], run: int, sandbox: Sandbox
) -> None:
    demo = sandbox.start(args)
    stdout, stderr = demo.communicate()

    # Nothing on stderr: no traceback, no resource_tracker "leaked semaphore" warning, no warning at all.
    assert (demo.returncode, stderr) == (0, ""), stdout
    lines = stdout.splitlines()
    first_event = next(i for i, line in enumerate(lines) if EVENT.match(line))
    before = "\n".join(lines[:first_event])
    assert "Act 1" in before and "Act 2" in before and "SIGKILL" in before, "no word of what will happen"

    workers = int(args[1]) if args else 4
    act_one, act_two = stdout.split("== Act 2")
    assert re.search(r"outcome: computed once \(by worker-\d+\)", act_one)
    assert f"{workers} of {workers} workers got the artifact (one value)" in act_one
    takeover = re.search(
        r"outcome: (worker-\d+) killed halfway; (worker-\d+) took over [\d.]+s later", act_two
    )
    assert takeover and takeover[1] != takeover[2], act_two
    assert f"{workers - 1} of {workers - 1} surviving workers got the artifact (one value)" in act_two
    assert "Both acts went as they should" in lines[-1]
    sandbox.assert_left_nothing(stdout)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupted_demo_stops_its_workers_and_removes_its_folder(
    signum: signal.Signals, sandbox: Sandbox
) -> None:
    demo = sandbox.start([])
    assert demo.stdout is not None
    seen = ""
    for line in demo.stdout:  # until the first worker is waiting: processes up, a lease held
        seen += line
        if " waiting " in line:
            break
    assert sandbox.processes() or not HAS_PROC, "the demo should be running its workers now"
    if signum == signal.SIGINT:
        os.killpg(demo.pid, signum)  # what Ctrl-C in a terminal does: the whole foreground group
    else:
        demo.send_signal(signum)
    stdout, stderr = demo.communicate()

    assert demo.returncode == 128 + signum, stderr
    assert f"stopped by {'Ctrl-C (SIGINT)' if signum == signal.SIGINT else 'SIGTERM'}" in stderr
    assert "Traceback" not in stderr
    sandbox.assert_left_nothing(seen + stdout)


@pytest.mark.timeout(600)
def test_the_deadline_stops_a_demo_that_takes_too_long(sandbox: Sandbox) -> None:
    # Ten minutes of work against a 3-second deadline: the demo must give up, say where, and clean up.
    script = "from dibs.demo import run_demo; raise SystemExit(run_demo(2, 600, deadline=3))"
    demo = sandbox.start([], [sys.executable, "-c", script])
    stdout, stderr = demo.communicate()

    assert demo.returncode == 1, stderr
    # Where it was depends on how busy the machine is: still starting the workers, or in act 1.
    assert re.search(r"dibs demo: gave up after 3s .*: (while starting|in Act 1), worker-\d", stderr), stderr
    assert "removed" in stderr and "please report it" in stderr
    sandbox.assert_left_nothing(stdout)


@pytest.mark.parametrize(
    ("workers", "work_seconds", "message"),
    [
        (1, 3.0, "--workers must be at least 2 (one computes, the others wait), got 1"),
        (4, 0.1, "--work-seconds must be at least 0.5"),
        (4, float("nan"), "got nan"),
    ],
    ids=["one-worker", "too-short-to-kill-halfway", "nan"],
)
def test_bad_options_are_refused_before_anything_starts(
    workers: int, work_seconds: float, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_demo(workers, work_seconds) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("dibs demo: ") and message in err

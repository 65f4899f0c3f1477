"""The guard of ``dibs run`` signals the strays it found by pidfd, never by a number that may have
changed hands (see :mod:`dibs._cli.guard`)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from dibs._cli import guard

pytestmark = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="pidfds are Linux 5.3+ only")


def _started(pid: int) -> int:
    stat = guard._stat(str(pid))
    return -1 if stat is None else stat[3]


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_stray_that_exited_is_never_signalled_by_its_number(monkeypatch: pytest.MonkeyPatch) -> None:
    child = _sleeper()
    stray = guard.Stray.of(child.pid, _started(child.pid))
    try:
        assert stray.fd is not None and stray.fd >= 0 and stray.runs()
        child.kill()
        child.wait()  # reaped: its number is free for an unrelated process
        by_number: list[tuple[int, int]] = []
        monkeypatch.setattr(os, "kill", lambda pid, sig: by_number.append((pid, sig)))
        monkeypatch.setattr(os, "killpg", lambda pid, sig: by_number.append((pid, sig)))
        assert not stray.runs()
        stray.kill(signal.SIGKILL)  # through the pidfd: the kernel answers "gone", nothing else is hit
        assert by_number == []
    finally:
        stray.close()


def test_a_live_stray_is_stopped_through_its_pidfd() -> None:
    child = _sleeper()
    stray = guard.Stray.of(child.pid, _started(child.pid))
    try:
        stray.kill(signal.SIGTERM)
        assert child.wait(timeout=60) == -signal.SIGTERM
    finally:
        stray.close()
        if child.poll() is None:
            child.kill()
            child.wait()


def test_a_process_already_gone_when_found_is_left_alone() -> None:
    child = _sleeper()
    child.kill()
    child.wait()
    stray = guard.Stray.of(child.pid, _started(child.pid))
    assert stray.fd == -1 and not stray.runs()
    stray.kill(signal.SIGKILL)  # a no-op, not a signal to whoever has the number now
    stray.close()


def test_a_number_that_changed_hands_since_the_scan_is_left_alone() -> None:
    # The scan saw another process under this number (another start time): the pidfd opened now
    # would be the newcomer's, so nothing is signalled through it.
    child = _sleeper()
    try:
        stray = guard.Stray.of(child.pid, _started(child.pid) - 1)
        assert stray.fd == -1 and not stray.runs()
        stray.kill(signal.SIGKILL)
        assert child.poll() is None  # the newcomer runs on
    finally:
        child.kill()
        child.wait()


def test_a_stray_reparented_since_the_scan_is_still_stopped() -> None:
    # A double-forking daemon's grandchild is reparented as its parent exits: it is the same process.
    script = "import os, time\nif os.fork() == 0:\n    print(os.getpid(), flush=True); time.sleep(60)\n"
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    assert parent.stdout is not None
    grandchild = int(parent.stdout.readline())
    started = _started(grandchild)
    parent.wait()  # the grandchild is reparented now
    stray = guard.Stray.of(grandchild, started)
    try:
        assert stray.fd is not None and stray.fd >= 0 and stray.runs()
        stray.kill(signal.SIGKILL)
        for _ in range(600):
            if not stray.runs():
                break
            time.sleep(0.05)
        assert not stray.runs()
    finally:
        stray.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(grandchild, signal.SIGKILL)

"""Driving the ``dibs`` command as users do: real subprocesses, real signals, a real terminal.

Nothing here sleeps for a fixed time to let something happen: :func:`eventually` polls a condition
with a generous bound, and :class:`Dibs` reads a running command's stderr line by line so that a
test can wait for the event it needs ("waiting", a pid file) before it acts.
"""

from __future__ import annotations

import contextlib
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

DIBS = [sys.executable, "-m", "dibs"]
#: Bounds for conditions that normally hold within a second or two, on a loaded 2-core CI machine.
PATIENCE = 90.0

T = TypeVar("T")


def eventually(condition: Callable[[], T], what: str, timeout: float = PATIENCE) -> T:
    """Poll ``condition`` until it is truthy; fail naming ``what`` if it never is."""
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)
    return result


def dibs(
    *args: str, store: str | None = None, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``dibs ARGS`` to its end (``--store`` right after the command, as users type it)."""
    argv = [*DIBS, args[0], "--store", store, *args[1:]] if store else [*DIBS, *args]
    result = subprocess.run(
        argv, capture_output=True, text=True, timeout=PATIENCE * 2, check=False, env=_env(env)
    )
    if check and result.returncode != 0:
        raise AssertionError(f"dibs {' '.join(args)} exited {result.returncode}: {result.stderr}")
    return result


class Dibs:
    """A running ``dibs`` whose stderr is read line by line as it comes."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, own_group: bool = False) -> None:
        self.args = args
        self.process = subprocess.Popen(
            [*DIBS, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=_env(env),
            process_group=0 if own_group else None,
        )
        self.lines: list[str] = []
        self._ended = False
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.stdout = b""

    def _read(self) -> None:
        assert self.process.stderr is not None
        for raw in self.process.stderr:
            self._queue.put(raw.decode(errors="replace").rstrip("\n"))
        self._queue.put(None)

    def wait_for_line(self, needle: str, timeout: float = PATIENCE) -> str:
        """The first stderr line containing ``needle`` (lines before it are kept in :attr:`lines`)."""
        deadline = time.monotonic() + timeout
        for line in self.lines:
            if needle in line:
                return line
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"dibs {self.args} never said {needle!r}; it said {self.lines}"
                ) from None
            if line is None:
                self._ended = True
                raise AssertionError(
                    f"dibs {self.args} ended without saying {needle!r}; it said {self.lines}"
                )
            self.lines.append(line)
            if needle in line:
                return line

    def said(self, needle: str) -> bool:
        """Whether a stderr line so far contains ``needle`` (without waiting for more)."""
        while not self._ended:
            try:
                line = self._queue.get_nowait()
            except queue.Empty:
                break
            if line is None:
                self._ended = True
                break
            self.lines.append(line)
        return any(needle in line for line in self.lines)

    def signal(self, sig: signal.Signals) -> None:
        self.process.send_signal(sig)

    def signal_group(self, sig: signal.Signals) -> None:
        """What a terminal does on Ctrl-C: signal the whole foreground process group (``own_group``)."""
        os.killpg(self.process.pid, sig)

    def finish(self, timeout: float = PATIENCE) -> int:
        """Wait for the end; collect the rest of stdout and stderr; return the exit status."""
        assert self.process.stdout is not None
        self.stdout = self.process.stdout.read()
        status = self.process.wait(timeout)
        self._reader.join(timeout)
        while not self._ended and (line := self._queue.get()) is not None:
            self.lines.append(line)
        self._ended = True
        return status

    @property
    def stderr(self) -> str:
        return "\n".join(self.lines)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        self.process.wait(PATIENCE)


@contextlib.contextmanager
def running(*args: str, env: dict[str, str] | None = None, own_group: bool = False) -> Iterator[Dibs]:
    """A :class:`Dibs` that is killed if the test leaves before it ended."""
    proc = Dibs(*args, env=env, own_group=own_group)
    try:
        yield proc
    finally:
        if proc.process.poll() is None:
            proc.kill()


class Terminal:
    """A running ``dibs`` with stderr on a pseudo-terminal ``columns`` wide, and stdout a pipe (as in
    ``x=$(dibs ...)``) unless ``stdout_too``. :attr:`drawn` is everything the terminal received."""

    def __init__(self, *args: str, columns: int = 200, stdout_too: bool = False) -> None:
        import pty

        self.args = args
        controller, terminal = pty.openpty()
        env = _env({"COLUMNS": str(columns), "TERM": "xterm"})
        self.process = subprocess.Popen(
            [*DIBS, *args],
            stdout=terminal if stdout_too else subprocess.PIPE,
            stderr=terminal,
            stdin=subprocess.DEVNULL,
            env=env,
        )
        os.close(terminal)
        self._controller = controller
        self._drawn = bytearray()
        self._out = bytearray()
        self._lock = threading.Lock()
        self._streams = {controller: self._drawn}
        if self.process.stdout is not None:
            self._streams[self.process.stdout.fileno()] = self._out
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        streams = dict(self._streams)
        while streams:
            ready, _, _ = select.select(list(streams), [], [], 0.2)
            for fd in ready:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # the terminal's last writer closed it
                    chunk = b""
                with self._lock:
                    streams[fd] += chunk
                if not chunk:
                    del streams[fd]
                    if fd == self._controller:
                        os.close(fd)

    @property
    def drawn(self) -> str:
        with self._lock:
            return self._drawn.decode(errors="replace")

    @property
    def stdout(self) -> bytes:
        with self._lock:
            return bytes(self._out)

    def wait_for(self, text: str, timeout: float = PATIENCE) -> None:
        eventually(
            lambda: text in self.drawn or self.process.poll() is not None,
            f"{text!r} on the terminal",
            timeout,
        )
        assert text in self.drawn, f"dibs {self.args} ended without showing {text!r}: {self.drawn!r}"

    def finish(self, timeout: float = PATIENCE) -> int:
        status = self.process.wait(timeout)
        self._reader.join(timeout)
        return status

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        self.finish()


def on_terminal(*args: str, columns: int = 200, stdout_too: bool = False) -> tuple[int, bytes, str]:
    """Run ``dibs ARGS`` to its end on a :class:`Terminal`: its status, its stdout and what it drew."""
    terminal = Terminal(*args, columns=columns, stdout_too=stdout_too)
    status = terminal.finish()
    return status, terminal.stdout, terminal.drawn


def process_gone(pid: int) -> bool:
    """``pid`` no longer runs: it does not exist, or it is a zombie nobody reaped yet (it runs no code)."""
    stat = Path(f"/proc/{pid}/stat")
    if stat.parent.parent.exists() and sys.platform.startswith("linux"):
        try:
            return stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
        except (FileNotFoundError, ProcessLookupError):
            return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def posix_only() -> None:
    if os.name != "posix":
        pytest.skip("process groups and stop signals are POSIX")


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"DIBS_STORE_URL", "COLUMNS"}}
    env.setdefault("TERM", "dumb")
    return env | (extra or {})

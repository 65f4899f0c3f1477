"""COMMAND under a lease: started in its own process group, guarded, streamed, and stopped on a signal.

* **Its own process group**, so a stop reaches COMMAND and everything it started, exactly once:
  the terminal's Ctrl-C goes to ``dibs``'s group, and ``dibs`` forwards it to COMMAND's group.
* **Guarded** (:mod:`dibs._cli.guard`): if ``dibs`` is killed outright, the group dies too, so the
  command never outlives its lease.
* **No terminal input**: a group in the background of a terminal is stopped by the kernel the moment
  it reads from it, so when ``dibs``'s stdin is a terminal COMMAND reads ``/dev/null`` instead (a
  cached computation gets its inputs from its arguments, never from a prompt). Piped stdin is passed on.
* **Its stdout is the artifact**: kept whole, and streamed as it comes when there is somewhere to
  stream it. Its stderr is ``dibs``'s.
* **Stopped on a signal**: the first SIGINT/SIGTERM/SIGHUP is forwarded to the group; if the group
  is still there ``kill_after`` seconds later, or when a second stop signal comes, it gets SIGKILL.
  A stopped command's output is never stored, whatever its exit status: it may be partial.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from dibs._cli.stops import StopSignals, signal_name

__all__ = ["Command", "CommandFailed", "CommandNotStarted", "CommandStopped"]

#: How often a running command's loop wakes up to check whether a stop's grace period is over.
_TICK_SECONDS = 0.25
_POSIX = os.name == "posix"
#: How much of a command its messages quote.
_SHOWN_COMMAND = 80


_HOW_STOPPED = {"SIGINT": "interrupted", "SIGTERM": "terminated", "SIGHUP": "hung up"}


class CommandFailed(Exception):
    """COMMAND exited with a non-zero status, or a signal killed it (``status`` < 0)."""

    def __init__(self, command: list[str], status: int) -> None:
        self.command, self.status = command, status
        super().__init__(f"command {_quoted(command)} {_ending(status)}")

    @property
    def exit_status(self) -> int:
        """What ``dibs run`` exits with: COMMAND's status, or 128 + N when signal N killed it."""
        return self.status if self.status >= 0 else 128 - self.status


class CommandNotStarted(Exception):
    """COMMAND could not be started (not found, not executable)."""

    def __init__(self, command: list[str], error: OSError) -> None:
        self.command = command
        super().__init__(f"command {_quoted(command)} could not start: {error.strerror or error}")


class CommandStopped(Exception):
    """``dibs run`` received a stop signal while COMMAND ran; COMMAND was stopped with it."""

    def __init__(self, command: list[str], signum: int, status: int | None, killed: bool) -> None:
        self.command, self.signum, self.status, self.killed = command, signum, status, killed
        name = signal_name(signum)
        stopped = f"stopped by {name}: dibs run was {_HOW_STOPPED.get(name, 'stopped')}"
        if status is None:
            super().__init__(f"{stopped} before its command started")
        elif killed:
            super().__init__(
                f"{stopped}, and command {_quoted(command)} did not exit in time, so it was killed"
            )
        else:
            super().__init__(f"{stopped}, and command {_quoted(command)} {_ending(status)}")


class Command:
    """One run of COMMAND. The caller defers stop signals to :meth:`forward` for as long as it holds
    the lease (:meth:`StopSignals.deferred`), so that releasing the lease is never interrupted either.
    """

    def __init__(self, command: list[str], *, stream: IO[bytes] | None, kill_after: float) -> None:
        self.command = command
        self.stream = stream
        self.kill_after = kill_after
        self.process: subprocess.Popen[bytes] | None = None
        self.kill_at: float | None = None
        self.killed = False
        #: Where stdout goes instead of memory, when set (``dibs run --payloads``: a payload being written).
        self.sink: Callable[[bytes], object] | None = None

    def run(self, stops: StopSignals) -> bytes:
        """Run COMMAND to its end and return its stdout; raise one of this module's errors otherwise."""
        if stops.received is not None:
            raise CommandStopped(self.command, stops.received, None, killed=False)
        guard = _Guard.start(self.kill_after)
        try:
            self.process = self._start()
            guard.watch(self.process.pid)
            if stops.received is not None:  # it arrived while COMMAND started
                self.forward(stops.received, True)
            output = self._pump(self.process)
            status = self._reap(self.process)
        finally:
            guard.dismiss()
        if stops.received is not None:
            raise CommandStopped(self.command, stops.received, status, self.killed)
        if status != 0:
            raise CommandFailed(self.command, status)
        return output

    def _start(self) -> subprocess.Popen[bytes]:
        stdin = subprocess.DEVNULL if _is_terminal(sys.stdin) else None
        try:
            if _POSIX:
                return subprocess.Popen(self.command, stdout=subprocess.PIPE, stdin=stdin, process_group=0)
            return subprocess.Popen(self.command, stdout=subprocess.PIPE, stdin=stdin)
        except OSError as exc:
            raise CommandNotStarted(self.command, exc) from exc

    def _pump(self, process: subprocess.Popen[bytes]) -> bytes:
        """Read COMMAND's stdout to its end, streaming it on; wake up now and then to enforce a stop."""
        assert process.stdout is not None
        chunks: list[bytes] = []
        fd = process.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while True:
                self._enforce()
                if not selector.select(_TICK_SECONDS):
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                if self.sink is not None:
                    self.sink(chunk)
                else:
                    chunks.append(chunk)
                self._tee(chunk)
        process.stdout.close()
        return b"".join(chunks)

    def _reap(self, process: subprocess.Popen[bytes]) -> int:
        while True:
            self._enforce()
            with contextlib.suppress(subprocess.TimeoutExpired):
                return process.wait(_TICK_SECONDS)

    def _tee(self, chunk: bytes) -> None:
        if self.stream is None:
            return
        try:
            self.stream.write(chunk)
            self.stream.flush()
        except BrokenPipeError:
            # The reader went away (``dibs run ... | head``): keep the artifact whole, stop streaming,
            # and point stdout at /dev/null so that the interpreter's final flush is quiet too.
            self.stream = None
            with contextlib.suppress(OSError):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
                os.close(devnull)

    def forward(self, signum: int, first: bool) -> None:
        """A stop signal reached ``dibs``: pass it on (the first), or end it at once (the next)."""
        if self.process is None or self.process.returncode is not None:
            return
        if first:
            self._signal(signum)
            self.kill_at = time.monotonic() + self.kill_after
        else:
            self._kill()

    def _enforce(self) -> None:
        if self.kill_at is not None and not self.killed and time.monotonic() >= self.kill_at:
            self._kill()

    def _kill(self) -> None:
        self.killed = True
        self._signal(signal.SIGKILL if _POSIX else signal.SIGTERM)

    def _signal(self, signum: int) -> None:
        # Only called before the process is reaped, so its group id (= its pid) is still its own.
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if _POSIX:
                os.killpg(self.process.pid, signum)
            else:
                self.process.send_signal(signum)


class _Guard:
    """The handle on :mod:`dibs._cli.guard`; a no-op where it cannot run (no process groups)."""

    def __init__(self, process: subprocess.Popen[bytes] | None) -> None:
        self.process = process

    @classmethod
    def start(cls, grace: float) -> _Guard:
        if not _POSIX or not sys.executable:
            return cls(None)
        script = Path(__file__).with_name("guard.py")
        try:
            process = subprocess.Popen(
                [sys.executable, "-I", "-S", str(script), repr(grace)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            print(
                f"dibs: warning: could not start the guard that stops the command if dibs is killed ({exc}); "
                "if dibs is killed, the command may outlive its lease",
                file=sys.stderr,
            )
            return cls(None)
        return cls(process)

    def watch(self, group: int) -> None:
        self._send(f"{group}\n".encode())

    def dismiss(self) -> None:
        if self.process is None:
            return
        self._send(b"done")
        with contextlib.suppress(OSError):
            assert self.process.stdin is not None
            self.process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(5)
        self.process = None

    def _send(self, data: bytes) -> None:
        if self.process is None or self.process.stdin is None:
            return
        with contextlib.suppress(OSError):  # the guard died: nothing to tell it
            self.process.stdin.write(data)
            self.process.stdin.flush()


def _is_terminal(stream: IO[str] | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except ValueError:  # closed
        return False


def _quoted(command: list[str]) -> str:
    """The command as a shell would show it, on one line, shortened at a word boundary if long."""
    text = " ".join(shlex.join(command).split())
    if len(text) > _SHOWN_COMMAND:
        cut = text[:_SHOWN_COMMAND]
        text = (cut[: cut.rindex(" ")] if " " in cut else cut) + " …"
    return f'"{text}"'


def _ending(status: int) -> str:
    if status < 0:
        return f"was killed by {signal_name(-status)}"
    return f"exited with status {status}"

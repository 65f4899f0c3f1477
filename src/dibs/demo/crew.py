"""The demo's worker processes, each with its own pipes to and from the demo, under one deadline.

Nothing is shared between two workers but the store. A worker killed mid-sentence leaves at most a
partial line in its own pipe, which is dropped, and an end-of-file that says it is gone; no other
worker can be blocked by it. Reading never blocks past the deadline, and leaving the crew (normally,
on an error, on Ctrl-C) kills and reaps every worker still running.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import Any, Self

__all__ = ["Crew", "DeadlinePassed", "Event"]

# Not ``-m dibs.demo.worker``: runpy warns when the package it runs from has already imported the module.
_WORKER = "import sys; from dibs.demo.worker import main; raise SystemExit(main(sys.argv[1:]))"


@dataclasses.dataclass(frozen=True)
class Event:
    """One report of one worker.

    ``kind`` is what the worker said (ready, asking, waiting, computing, progress, done, hit),
    ``"said"`` for a line that is not a report, or ``"exited"`` when its pipe closed, with the exit
    code as ``value`` (negative: killed by that signal).
    """

    at: float  # time.time() in the worker: comparable across processes on one machine
    worker: str
    kind: str
    detail: str = ""
    value: Any = None


class DeadlinePassed(Exception):
    """The deadline came while some workers were still running."""

    def __init__(self, running: Sequence[str]) -> None:
        self.running = list(running)
        super().__init__(f"still running: {', '.join(self.running) or 'none'}")


class Crew:
    """Worker processes (see :mod:`dibs.demo.worker`) on the store at ``url``; :meth:`go` sends them a key.

    Each process starts in its own process group, so a Ctrl-C in the terminal reaches only the demo,
    which then stops the workers itself instead of every one of them printing a traceback.
    """

    def __init__(self, url: str, names: Sequence[str], work_seconds: float) -> None:
        self._command = [sys.executable, "-c", _WORKER, url]
        self._work_seconds = repr(work_seconds)
        self.names = list(names)
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._selector = selectors.DefaultSelector()
        self._partial: dict[str, bytes] = {}
        self._ready: collections.deque[Event] = collections.deque()

    def __enter__(self) -> Self:
        try:
            for name in self.names:
                proc = subprocess.Popen(
                    [*self._command, name, self._work_seconds],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    process_group=0,
                )
                self._procs[name] = proc
                assert proc.stdout is not None
                self._selector.register(proc.stdout, selectors.EVENT_READ, name)
                self._partial[name] = b""
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def go(self, key: str) -> None:
        """Every worker still running asks for ``key`` now."""
        for proc in self._procs.values():
            assert proc.stdin is not None
            with contextlib.suppress(BrokenPipeError):  # it has exited: its "exited" event says how
                proc.stdin.write(key.encode() + b"\n")
                proc.stdin.flush()

    def events(self, deadline: float) -> Iterator[Event]:
        """The workers' events as they arrive, until every pipe has closed. Breaking out of the loop
        loses nothing: the next call goes on from the next event.

        :param deadline: a :func:`time.monotonic` time; :class:`DeadlinePassed` is raised then.
        """
        while self._ready or self._selector.get_map():
            if self._ready:
                yield self._ready.popleft()
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                raise DeadlinePassed(self.running())
            for ready, _ in self._selector.select(timeout=left):
                self._read(ready.data, ready.fd, deadline)

    def _read(self, name: str, fd: int, deadline: float) -> None:
        chunk = os.read(fd, 65536)
        if chunk:
            *lines, self._partial[name] = (self._partial[name] + chunk).split(b"\n")
            self._ready.extend(_parse(name, line) for line in lines)
            return
        self._selector.unregister(fd)
        try:  # its pipe closed because it exited, so this is quick
            code = self._procs[name].wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise DeadlinePassed(self.running()) from None
        self._ready.append(Event(time.time(), name, "exited", _describe_exit(code), code))

    def running(self) -> list[str]:
        return [name for name, proc in self._procs.items() if proc.poll() is None]

    def kill(self, name: str) -> None:
        """SIGKILL one worker: no cleanup, no release, its lease left to expire."""
        self._procs[name].kill()

    def stop(self) -> None:
        """Kill and reap every worker still running and close the pipes; safe to call twice."""
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self._procs.values():
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    with contextlib.suppress(BrokenPipeError):  # stdin may hold an unsent key
                        pipe.close()
        self._selector.close()


def _describe_exit(code: int) -> str:
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


def _parse(name: str, line: bytes) -> Event:
    """A report line as an :class:`Event`; anything else a worker printed as a ``said`` event."""
    try:
        report = json.loads(line)
        return Event(float(report["at"]), name, str(report["kind"]), str(report["detail"]), report["value"])
    except (ValueError, TypeError, KeyError):
        return Event(time.time(), name, "said", line.decode(errors="replace").rstrip())

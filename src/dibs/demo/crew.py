"""The demo's worker processes, each with its own pipe back to the demo, and a deadline over them all.

Nothing is shared between two workers but the store. A worker killed mid-sentence leaves at most a
partial line in its own pipe, which is dropped, and an end-of-file that says it is gone; no other
worker can be blocked by it. Reading never blocks past the deadline, and leaving the crew (normally,
on an error, on Ctrl-C) kills and reaps every worker still running.
"""

from __future__ import annotations

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

    ``kind`` is what the worker said (asking, waiting, computing, progress, done, hit), ``"said"``
    for a line that is not a report, or ``"exited"`` when its pipe closed, with the exit code as
    ``value`` (negative: killed by that signal).
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
    """Worker processes (see :mod:`dibs.demo.worker`) that all ask for ``key`` on the store at ``url``.

    Each process starts in its own process group, so a Ctrl-C in the terminal reaches only the demo,
    which then stops the workers itself instead of every one of them printing a traceback.
    """

    def __init__(self, url: str, key: str, names: Sequence[str], work_seconds: float) -> None:
        self._args = (url, key, work_seconds)
        self.names = list(names)
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    def __enter__(self) -> Self:
        url, key, work_seconds = self._args
        try:
            for name in self.names:
                self._procs[name] = subprocess.Popen(
                    [sys.executable, "-c", _WORKER, url, key, name, repr(work_seconds)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    process_group=0,
                )
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def events(self, deadline: float) -> Iterator[Event]:
        """Every worker's events as they arrive, until all have exited.

        :param deadline: a :func:`time.monotonic` time; :class:`DeadlinePassed` is raised then.
        """
        pending = {name: b"" for name in self._procs}
        with selectors.DefaultSelector() as selector:
            for name, proc in self._procs.items():
                assert proc.stdout is not None
                selector.register(proc.stdout, selectors.EVENT_READ, name)
            while selector.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DeadlinePassed(self.running())
                for ready, _ in selector.select(timeout=left):
                    name = ready.data
                    chunk = os.read(ready.fd, 65536)
                    if chunk:
                        *lines, pending[name] = (pending[name] + chunk).split(b"\n")
                        yield from (_parse(name, line) for line in lines)
                        continue
                    selector.unregister(ready.fileobj)
                    yield self._exited(name, deadline)

    def _exited(self, name: str, deadline: float) -> Event:
        """The end of a worker whose pipe just closed (it exits right after, so this is quick)."""
        try:
            code = self._procs[name].wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise DeadlinePassed(self.running()) from None
        return Event(time.time(), name, "exited", _describe_exit(code), code)

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
            if proc.stdout is not None:
                proc.stdout.close()


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

"""Long-running components of the end-to-end tests: an Airflow scheduler, a Prefect server, ...

Each :class:`Component` is one real OS process started as a user would start it (the same command
line), in its own process group with its output in a log file, so that a test can wait for
conditions while every component is watched: :meth:`Components.wait_until` fails at once, with the
tails of the logs, when a component dies, and after a generous bound when the condition never comes.
Nothing is waited for by sleeping a fixed time and then asserting.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")

#: Seconds: an upper bound that a working system never reaches; only a broken one hits it.
BOUND = 240.0


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Component:
    """One process of a deployment (``airflow scheduler``, ``prefect server start``, ...)."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        env: dict[str, str],
        logs: Path,
        cwd: Path,
        *,
        serves: bool = False,
    ) -> None:
        self.name = name
        self.serves = serves
        self.log = logs / f"{name}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                list(argv),
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: stopping it also stops what it started
            )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, chars: int = 3000) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return f"--- {self.name} (exit code {self.proc.poll()}): {self.log}\n{text[-chars:]}"

    def send(self, sig: int) -> None:
        """Send ``sig`` to the component's whole process group (gone already: nothing to do)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)


def stop_together(components: Sequence[Component]) -> None:
    """Stop ``components`` at once: SIGTERM every process group, give them one shared grace period,
    then SIGKILL what is left, and SIGKILL the groups' stragglers (children that outlived a parent).

    Together, not one after another: each Airflow or Prefect component takes seconds to shut down
    gracefully, and stopping four in turn cost a deployment test half a minute of its teardown.
    """
    running = list(components)
    for sig, grace in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        for component in running:
            component.send(sig)
        deadline = time.monotonic() + grace
        for component in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                component.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        running = [component for component in running if component.alive()]
        if not running:
            break
    for component in components:
        component.send(signal.SIGKILL)


def run_at_once(commands: Sequence[Sequence[str]], env: dict[str, str], cwd: Path) -> list[str]:
    """Start every command at the same time (CLI triggers, say), wait for all; their outputs.

    Fails with the output of the first command that exits non-zero.
    """
    procs = [
        subprocess.Popen(
            list(argv),
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for argv in commands
    ]
    outputs = [proc.communicate(timeout=BOUND)[0] for proc in procs]
    for argv, proc, output in zip(commands, procs, outputs, strict=True):
        assert proc.returncode == 0, f"{' '.join(argv)} exited with {proc.returncode}:\n{output[-3000:]}"
    return outputs


class Components:
    """The components of one deployment under test; all are stopped at the end whatever happened."""

    def __init__(self, logs: Path, cwd: Path) -> None:
        self.logs = logs
        self.cwd = cwd
        self.started: list[Component] = []
        logs.mkdir(parents=True, exist_ok=True)

    def start(
        self, name: str, argv: Sequence[str], env: dict[str, str], *, serves: bool = False
    ) -> Component:
        """Start one component; ``serves``: the others call it (an API server), so it is stopped last."""
        component = Component(name, argv, env, self.logs, self.cwd, serves=serves)
        self.started.append(component)
        return component

    def tails(self) -> str:
        return "\n".join(component.tail() for component in self.started)

    def wait_until(self, condition: Callable[[], T | None], what: str, *, bound: float = BOUND) -> T:
        """Poll ``condition`` until it returns something truthy, and return that.

        Fails as soon as a component has exited (a crashed scheduler never makes progress), and
        after ``bound`` seconds otherwise; both failures show the components' logs.
        """
        deadline = time.monotonic() + bound
        while True:
            value = condition()
            if value:
                return value
            dead = [c.name for c in self.started if not c.alive()]
            if dead:
                pytest.fail(f"{', '.join(dead)} exited while waiting for {what}\n{self.tails()}")
            if time.monotonic() > deadline:
                pytest.fail(f"gave up after {bound:g}s waiting for {what}\n{self.tails()}")
            time.sleep(0.25)

    def stop_all(self) -> None:
        """Stop the clients together, then the servers they call together.

        Servers last: a client whose server is gone retries it before it exits, and a grace period
        can go by. Measured with Prefect 3.9.1: a served runner stopped beside its server was still
        running 27 s after SIGTERM (so the 20 s grace ran out and it was killed); stopped while the
        server still answered, it exited in 3.4 s, and the server 1.2 s later.
        """
        stop_together([component for component in self.started if not component.serves])
        stop_together([component for component in self.started if component.serves])

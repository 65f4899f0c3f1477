"""Long-lived worker processes that run benchmark tasks on command.

Starting a Python process that imports dibs and a database driver costs far more than anything
measured here, so the workers are started once and reused; each caches the clients it opened. A task
is a function of :mod:`benchmarks.tasks` called as ``fn(ctx, **kwargs)``; it may report intermediate
messages (``ctx.ready()``) before its result.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import multiprocessing.context
import time
import traceback
from multiprocessing.process import BaseProcess
from typing import Any

__all__ = ["Pool", "TaskError", "WorkerContext"]


class TaskError(RuntimeError):
    """A task raised in a worker; the message carries the worker's traceback."""


class WorkerContext:
    """What a task gets to talk back to the parent before it returns."""

    def __init__(self, conn: multiprocessing.connection.Connection, index: int) -> None:
        self._conn = conn
        self.index = index

    def ready(self, **info: Any) -> None:
        self._conn.send(("ready", time.monotonic(), info))


def _serve(conn: multiprocessing.connection.Connection, index: int) -> None:
    from benchmarks import tasks

    ctx = WorkerContext(conn, index)
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message[0] == "stop":
            tasks.close_all()
            return
        _, name, kwargs = message
        try:
            result = getattr(tasks, name)(ctx, **kwargs)
        except BaseException:  # reported to the parent, which raises it there
            conn.send(("error", traceback.format_exc()))
        else:
            conn.send(("done", result))


#: Imported once by the fork server, so that every worker starts with them already loaded.
_PRELOAD = [
    "benchmarks.tasks",
    "dibs.stores.sql",
    "dibs.stores.filesystem",
    "dibs.stores.redis",
    "dibs.stores.azure",
    "psycopg",
    "pymysql",
]


def process_context() -> multiprocessing.context.ForkServerContext | multiprocessing.context.SpawnContext:
    """``forkserver``: each worker is forked from a clean, single-threaded server process that has
    already imported dibs and the drivers (fast, and safe, unlike forking this threaded process);
    ``spawn`` where there is no fork (the workers then import everything themselves)."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(_PRELOAD)
        return context
    return multiprocessing.get_context("spawn")


class Pool:
    """``size`` spawned workers addressed by index."""

    def __init__(self, size: int) -> None:
        context = process_context()
        self._conns: list[multiprocessing.connection.Connection] = []
        self._processes: list[BaseProcess] = []
        for index in range(size):
            parent, child = context.Pipe()
            process = context.Process(
                target=_serve, args=(child, index), daemon=True, name=f"bench-worker-{index}"
            )
            process.start()
            child.close()
            self._conns.append(parent)
            self._processes.append(process)

    @property
    def size(self) -> int:
        return len(self._conns)

    def start(self, index: int, task: str, **kwargs: Any) -> None:
        """Run ``benchmarks.tasks.<task>(ctx, **kwargs)`` in worker ``index``."""
        self._conns[index].send(("call", task, kwargs))

    def receive(self, index: int, timeout: float = 300.0) -> tuple[str, Any]:
        conn = self._conns[index]
        if not conn.poll(timeout):
            raise TaskError(f"worker {index} sent nothing for {timeout:.0f}s")
        kind, *rest = conn.recv()
        if kind == "error":
            raise TaskError(f"worker {index} failed:\n{rest[0]}")
        return kind, rest[0] if kind == "done" else (rest[0], rest[1])

    def result(self, index: int, timeout: float = 300.0) -> Any:
        kind, value = self.receive(index, timeout)
        while kind != "done":
            kind, value = self.receive(index, timeout)
        return value

    def wait_ready(self, index: int, timeout: float = 300.0) -> tuple[float, dict[str, Any]]:
        kind, value = self.receive(index, timeout)
        if kind != "ready":
            raise TaskError(f"worker {index} finished before it was ready: {value!r}")
        stamp, info = value
        return stamp, info

    def run_all(self, task: str, kwargs_for: list[dict[str, Any]], timeout: float = 600.0) -> list[Any]:
        """Run ``task`` in workers 0..n-1 at once (``kwargs_for[i]`` for worker i); their results."""
        for index, kwargs in enumerate(kwargs_for):
            self.start(index, task, **kwargs)
        return [self.result(index, timeout) for index in range(len(kwargs_for))]

    def close(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.send(("stop",))
        for process in self._processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
                process.join()
        for conn in self._conns:
            conn.close()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

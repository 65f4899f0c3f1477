"""What the scale tests share: store URLs tagged so that a server can count one process's
connections, a sampler of those counts, and a way to see how many waiters a process's hub follows.

A tag is a PostgreSQL ``application_name`` or a Redis ``client_name``: the server lists every
connection with it (``pg_stat_activity``, ``CLIENT LIST``), the listening connection of the watch hub
included, so the count is what the server really sees of the process, not what dibs believes it opened.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.backends import postgres, redis, sqlite

#: The stores the scale tests run on: one of each kind of watch hub feed that a server can count.
SCALE_BACKENDS = ["postgres", "redis", "sqlite"]


@contextmanager
def tagged_url(backend: str, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """An isolated URL on ``backend`` whose connections carry a fresh tag; yields (url, tag)."""
    tag = f"dibs-scale-{uuid.uuid4().hex[:12]}"
    module: Any = {"postgres": postgres, "redis": redis, "sqlite": sqlite}[backend]
    with module.isolated_url(tmp_path) as isolated:
        option = {"postgres": "application_name", "redis": "client_name"}.get(backend)
        separator = "&" if "?" in isolated else "?"
        yield (isolated if option is None else f"{isolated}{separator}{option}={tag}"), tag


def server_connections(backend: str, tag: str) -> int | None:
    """How many connections the server has with ``tag``; ``None`` for a store without a server."""
    if backend == "postgres":
        import psycopg

        with psycopg.connect(postgres.server_url().replace("+psycopg", "", 1), autocommit=True) as admin:
            row = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (tag,))
            return int(row.fetchone()[0])  # type: ignore[index]
    if backend == "redis":
        import os

        import redis as redis_py

        client = redis_py.Redis.from_url(os.environ[redis.URL_ENV])
        try:
            return sum(1 for entry in client.client_list() if entry.get("name") == tag)
        finally:
            client.close()
    return None


class PeakSampler:
    """Samples ``measure()`` every few milliseconds in a thread and keeps the highest value."""

    def __init__(self, measure: Callable[[], int | None], every: float = 0.05) -> None:
        self._measure = measure
        self._every = every
        self._stop = threading.Event()
        self.peak = 0
        self.samples = 0
        self._thread = threading.Thread(target=self._run, name="peak-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            value = self._measure()
            if value is not None:
                self.peak = max(self.peak, value)
                self.samples += 1
            self._stop.wait(self._every)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        value = self._measure()  # one last look, after everything happened
        if value is not None:
            self.peak = max(self.peak, value)
            self.samples += 1


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    """Poll ``predicate`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.02)

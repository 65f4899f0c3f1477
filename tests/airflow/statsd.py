"""A StatsD server for the tests: a UDP socket that keeps what Airflow's ``Stats`` sends it."""

from __future__ import annotations

import collections
import socket
import threading
from typing import Self


class StatsD:
    """Listens on 127.0.0.1 (``port``); ``env`` points Airflow's StatsD metrics at it."""

    def __init__(self, prefix: str = "airflow") -> None:
        self.prefix = prefix
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._socket.bind(("127.0.0.1", 0))
        self._socket.settimeout(0.2)
        self.port = self._socket.getsockname()[1]
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._listen, name="statsd-listener", daemon=True)

    @property
    def env(self) -> dict[str, str]:
        return {
            "AIRFLOW__METRICS__STATSD_ON": "True",
            "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
            "AIRFLOW__METRICS__STATSD_PORT": str(self.port),
            "AIRFLOW__METRICS__STATSD_PREFIX": self.prefix,
        }

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._socket.close()

    def _listen(self) -> None:
        while not self._stop.is_set():
            try:
                data = self._socket.recv(65536)
            except TimeoutError:
                continue
            with self._lock:
                self._lines.extend(data.decode("utf-8", "replace").splitlines())

    def metrics(self, start: str) -> dict[str, list[tuple[float, str]]]:
        """Every value received for each name beginning with ``start`` (after the prefix), with its
        type (``c`` counter, ``ms`` timer, ``g`` gauge)."""
        found: dict[str, list[tuple[float, str]]] = collections.defaultdict(list)
        with self._lock:
            lines = list(self._lines)
        for line in lines:
            name, _, rest = line.partition(":")
            value, _, kind = rest.partition("|")
            name = name.removeprefix(f"{self.prefix}.")
            if name.startswith(start):
                found[name].append((float(value), kind.split("|")[0]))
        return dict(found)

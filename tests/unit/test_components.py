"""The end-to-end tests' component runner stops the clients before the servers they call."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.components import Components

# A component that notes in its log when SIGTERM reached it, then exits; until then it sleeps.
_NOTE_SIGTERM = """
import signal, sys, time
def stop(*_):
    print("stopped", time.monotonic(), flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def _stopped_at(log: Path) -> float:
    words = next(line for line in log.read_text().splitlines() if line.startswith("stopped")).split()
    return float(words[1])


def test_stop_all_stops_the_clients_before_the_servers(tmp_path: Path) -> None:
    components = Components(tmp_path / "logs", tmp_path)
    server = components.start("server", [sys.executable, "-c", _NOTE_SIGTERM], {}, serves=True)
    clients = [components.start(f"client-{i}", [sys.executable, "-c", _NOTE_SIGTERM], {}) for i in range(2)]
    everyone = [server, *clients]
    components.wait_until(lambda: all("ready" in c.log.read_text() for c in everyone), "the components")

    components.stop_all()

    assert not any(component.alive() for component in everyone)
    assert max(_stopped_at(client.log) for client in clients) < _stopped_at(server.log)

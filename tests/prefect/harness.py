"""The session's Prefect API, shared by the Prefect integration tests and the docs' Prefect snippets.

``prefect_test_harness`` starts a Prefect server subprocess on loopback with a throw-away database,
which takes about 15 seconds: this module is a plugin (listed in the repository's root
``conftest.py``) so that ``tests/prefect/`` and the snippets of ``docs/prefect.md`` share one server.
It imports Prefect only when the fixture is first used: environments without Prefect load it too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

# Before Prefect reads its settings: no telemetry calls from the test server (they time out offline).
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


@pytest.fixture(scope="session")
def prefect_api() -> Iterator[str]:
    """The session's Prefect API URL (a harness server with a temporary database)."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    # Prefect counts its wait in 0.1 s sleeps, not by the clock. Each xdist worker starts its own
    # server; beside two busy loops and another suite on 2 cores, 120 of those ran out before the
    # server answered (scripts/matrix, prefect-oldest). Only a server that never starts waits this out.
    with prefect_test_harness(server_startup_timeout=600):
        url = PREFECT_API_URL.value()
        assert url, "the Prefect test harness did not set an API URL"
        yield url
    from prefect_dibs import _clients

    _clients.clear_cache()

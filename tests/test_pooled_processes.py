"""Real OS processes racing on shared keys through PgBouncer with stock settings (issue 29): every key
computed exactly once, every process gets every value, no call fails.

Three topologies, each through the process's PgBouncer in front of the shared server
(tests/postgres_servers.py), the URL naming no ``?pooler=`` (the store finds out): transaction pooling
without a ``listen_url`` (the listeners cannot hear, so waiters poll), transaction pooling with one
(the listener on the server itself), and session pooling. Sizes: 4 processes x 40 keys each
(``DIBS_FULL=1``: 8 x 250, the size of tests/test_processes.py's full run).
"""

from __future__ import annotations

import multiprocessing
import time
from collections import Counter
from pathlib import Path

import pytest

from tests import workers
from tests.backends import pgbouncer, postgres
from tests.postgres_servers import session_pgbouncer
from tests.services import full_size

SPAWN = multiprocessing.get_context("spawn")

#: topology -> (pool mode, whether the URL has a listen_url to the server itself)
TOPOLOGIES = {
    "transaction": ("transaction", False),
    "transaction+listen_url": ("transaction", True),
    "session": ("session", False),
}


@pytest.mark.parametrize("topology", list(TOPOLOGIES))
def test_racing_processes_through_pgbouncer_compute_each_key_exactly_once(
    topology: str, tmp_path: Path
) -> None:
    processes, key_count = (8, 250) if full_size() else (4, 40)
    mode, listen = TOPOLOGIES[topology]
    keys = [f"partition-{i:04d}" for i in range(key_count)]
    with postgres.isolated_url(tmp_path) as direct:
        url = pgbouncer.through(session_pgbouncer(mode, postgres.server_url()), direct, listen=listen)
        start_at = time.time() + 3.0  # after every child has imported dibs
        children = [
            SPAWN.Process(
                target=workers.race_keys,
                # each worker walks the keys in its own order, so that they collide all along the way
                args=(url, keys[w:] + keys[:w], str(tmp_path), w, start_at),
            )
            for w in range(processes)
        ]
        started = time.monotonic()
        for child in children:
            child.start()
        for child in children:
            child.join(timeout=600)
            assert child.exitcode == 0, f"worker exited with {child.exitcode}"
        elapsed = time.monotonic() - started
    executions = Counter(line["key"] for line in workers.read_lines(tmp_path / "executions.jsonl"))
    assert set(executions) == set(keys)
    duplicated = {key: n for key, n in executions.items() if n != 1}
    assert not duplicated, f"computed more than once: {duplicated}"
    for worker in range(processes):
        (report,) = workers.read_lines(tmp_path / f"results-{worker}.jsonl")
        assert report["results"] == {key: f"value-of-{key}" for key in keys}
    print(f"\n{processes} processes x {key_count} keys through PgBouncer ({topology}): {elapsed:.2f}s")

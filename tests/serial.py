"""Which tests must run alone: the ``serial`` marker, applied by path (a plugin of the root conftest.py).

``scripts/test`` runs the suite in two parts: ``pytest -n N --dist loadfile -m "not serial"`` (the
single-process tests on every core, each file on one worker, in order) then ``pytest -m serial`` (one
test at a time). The serial ones are the real multi-process scenarios: processes racing, holders
SIGKILLed or SIGSTOPped past their ttl, connection counts, the demo, Airflow and Prefect deployments.
They are correct under load, but they measure handoffs and spawn many processes each: beside another
test they only get slower and noisier, and they would slow their neighbour. Marking them here, by
file, keeps the list in one place (a new file of that kind is added to ``SERIAL``); a test marked
``slow`` anywhere is serial too.

"One at a time" has one exception, a second lane: the files of ``BESIDE`` (marked ``beside`` as
well) run one after another, in a pytest of their own, beside the rest (``-m "serial and beside"``
and ``-m "serial and not beside"``, started together by scripts/_pytest.sh). They are the scenarios
that mostly wait (fault windows, leases running out, a demo's workers at work): measured on 2 cores,
the reduced reliability suite keeps about a third of a core busy and the demo half of one, so beside
them the deployments and process races lose little, and the serial part takes about the longer
lane's time instead of the sum. (Not ``pytest-xdist``'s ``--dist loadgroup``: with pytest 9 it
ignores ``xdist_group`` and spreads the tests one by one, xdist 3.8.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Test files whose every test is serial (paths relative to the repository).
SERIAL = frozenset(
    {
        "tests/test_processes.py",  # SIGKILL takeover, SIGSTOP fencing, exactly-once across processes
        "tests/test_pooled_processes.py",  # processes racing through PgBouncer, both pool modes
        "tests/test_postgres_restart.py",  # a throwaway PostgreSQL restarted under holders and waiters
        "tests/test_redis_restart.py",  # a throwaway Redis restarted under waiting processes
        "tests/test_reliability.py",  # the reliability scenarios at their reduced size
        "tests/test_waiting_scale.py",  # many waiters; counts connections (tests/scale.py)
        "tests/test_runtime_processes.py",  # forked processes sharing the runtime
        "tests/test_demo.py",  # the demo: several processes, a holder killed, repeated
        "tests/test_cli_stops.py",  # SIGINT/SIGTERM/SIGKILL to dibs run and its command's group
        "tests/test_redis_topology_races.py",  # processes racing on a cluster and across a failover
        "tests/airflow/test_deployment.py",  # api-server, scheduler, dag-processor, triggerer
        "tests/airflow/test_trigger_scale.py",  # 1,000 deferred waiters; counts connections
        "tests/airflow/test_integration.py",  # dag.test() in spawned processes, SIGTERM and kills
        "tests/prefect/test_deployments.py",  # prefect server start and a served deployment
        "tests/prefect/test_processes.py",  # flow runs in processes, SIGKILLed holders
        "tests/payloads/test_memory.py",  # a large payload across processes; peak RSS of each
        "tests/test_big_values.py",  # a large inline value across processes on each store; peak RSS
        "tests/payloads/test_faults.py",  # payload faults: writers SIGKILLed mid-upload, concurrent prune
    }
)

#: Serial files that run in the second lane, beside the others (see the module's docstring).
BESIDE = frozenset(
    {
        "tests/test_reliability.py",  # fault windows and leases running out: a third of a core
        "tests/test_demo.py",  # the demo's workers mostly sleep through their work
        "tests/test_postgres_restart.py",  # mostly the outage itself: a server down for seconds
        "tests/test_redis_restart.py",  # the same, on Redis
    }
)


def _relative(item: pytest.Item) -> str:
    try:
        return item.path.resolve().relative_to(ROOT).as_posix()
    except ValueError:  # a test outside the repository (pytest given another rootdir)
        return ""


def is_serial(item: pytest.Item) -> bool:
    """Whether ``item`` must run alone: its file is in ``SERIAL``, or it is marked ``slow``."""
    return _relative(item) in SERIAL or item.get_closest_marker("slow") is not None


def runs_beside(item: pytest.Item) -> bool:
    """Whether a serial ``item`` runs in the second lane: its file is in ``BESIDE``."""
    return _relative(item) in BESIDE


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by -m
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if is_serial(item):
            item.add_marker(pytest.mark.serial)
            if runs_beside(item):
                item.add_marker(pytest.mark.beside)

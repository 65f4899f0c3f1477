"""Which tests must run alone: the ``serial`` marker, applied by path (a plugin of the root conftest.py).

``scripts/test`` runs the suite in two parts: ``pytest -n N --dist loadfile -m "not serial"`` (the
single-process tests on every core, each file on one worker, in order) then ``pytest -m serial`` (one
test at a time). The serial ones are the real multi-process scenarios: processes racing, holders
SIGKILLed or SIGSTOPped past their ttl, connection counts, the demo, Airflow and Prefect deployments.
They are correct under load, but they measure handoffs and spawn many processes each: beside another
test they only get slower and noisier, and they would slow their neighbour. Marking them here, by
file, keeps the list in one place (a new file of that kind is added to ``SERIAL``); a test marked
``slow`` anywhere is serial too.

"One at a time" has one exception: lanes. The files of ``LANES`` (marked ``lane2`` or ``lane3`` as
well) run one after another, in a pytest of their own per lane, beside the first lane (the serial
files of no lane): ``-m "serial and not lane2 and not lane3"``, ``-m "serial and lane2"`` and
``-m "serial and lane3"``, started together by scripts/_pytest.sh. The second lane is the reliability
suite, which mostly waits (fault windows, leases running out: about a fifth of a core); the third
holds the scenarios that mostly wait too (a demo's workers at work, a store down for seconds) with two
that spawn processes (Airflow's ``dag.test()`` runs, Prefect flow runs in processes), chosen so that
the three take about as long. Measured on 2 cores in CI: two lanes took 8:50 each (the second with
the demo and the restarts), one after another they would take about 18 minutes, and the part takes
about its longest lane's time. (Not ``pytest-xdist``'s ``--dist loadgroup``: with pytest 9 it ignores
``xdist_group`` and spreads the tests one by one, xdist 3.8.)
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

#: Serial files that run in a lane of their own beside the first, by the lane's marker (see the
#: module's docstring).
LANES = {
    "lane2": frozenset(
        {
            "tests/test_reliability.py",  # fault windows and leases running out: a fifth of a core
        }
    ),
    "lane3": frozenset(
        {
            "tests/test_demo.py",  # the demo's workers mostly sleep through their work
            "tests/test_postgres_restart.py",  # mostly the outage itself: a server down for seconds
            "tests/test_redis_restart.py",  # the same, on Redis
            "tests/airflow/test_integration.py",  # dag.test() in spawned processes
            "tests/prefect/test_processes.py",  # flow runs in processes, a store restart
        }
    ),
}


def _relative(item: pytest.Item) -> str:
    try:
        return item.path.resolve().relative_to(ROOT).as_posix()
    except ValueError:  # a test outside the repository (pytest given another rootdir)
        return ""


def is_serial(item: pytest.Item) -> bool:
    """Whether ``item`` must run alone: its file is in ``SERIAL``, or it is marked ``slow``."""
    return _relative(item) in SERIAL or item.get_closest_marker("slow") is not None


def lane_of(item: pytest.Item) -> str | None:
    """The marker of the lane a serial ``item`` runs in beside the first (``None``: the first)."""
    path = _relative(item)
    return next((lane for lane, files in LANES.items() if path in files), None)


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by -m
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if is_serial(item):
            item.add_marker(pytest.mark.serial)
            lane = lane_of(item)
            if lane is not None:
                item.add_marker(getattr(pytest.mark, lane))

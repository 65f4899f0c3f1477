"""Real Airflow, real processes: ``dag.test()`` runs in spawned processes sharing one SQLite store.

Each process has its own Airflow home and metadata database (copied from one migrated template); only
the dibs store is shared. Waits are bounded polls for a condition, never sleeps followed by asserts.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("airflow")

from packaging.version import Version

import dibs
from dibs_provider.operators._stopping import KILLED_FAILURE
from tests.airflow._child import run_dags
from tests.airflow.compat import AIRFLOW_VERSION
from tests.airflow.statsd import StatsD

# Each wait below has its own bound; the item's only has to catch a hang between them (setup and
# teardown count towards it too), on a machine much busier than a quiet one.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
AIRFLOW = Path(sys.executable).with_name("airflow")
#: Seconds: only ever reached when something is broken. Each child process imports Airflow and starts
#: its execution API in process (10-20 s of CPU on a quiet 2-core machine); with two busy loops and
#: the other lanes beside them, three such processes took over 150 s to run their first task.
BOUND = 480.0


@pytest.fixture(scope="module")
def template_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One migrated Airflow metadata database that every child process copies."""
    home = tmp_path_factory.mktemp("airflow-template")
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
    }
    done = subprocess.run(
        [str(AIRFLOW), "db", "migrate"], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return home / "airflow.db"


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def wait_until(condition: Callable[[], bool], processes: list[BaseProcess], what: str, logs: Path) -> None:
    deadline = time.monotonic() + BOUND
    while not condition():
        failed = [p.exitcode for p in processes if p.exitcode not in (None, 0)]
        assert not failed, f"a child process failed (exit codes {failed}) before {what}\n{child_logs(logs)}"
        assert time.monotonic() < deadline, f"gave up waiting for {what}\n{child_logs(logs)}"
        time.sleep(0.05)


def child_logs(tmp_path: Path) -> str:
    return "\n".join(
        f"--- {log.parent.name}\n" + log.read_text()[-4000:]
        for log in sorted(tmp_path.glob("home*/child.log"))
    )


def start(
    tmp_path: Path, template_db: Path, dags: Path, env: dict[str, str], runs: list[list[dict[str, Any]]]
) -> list[BaseProcess]:
    """One spawned process per entry of ``runs`` (fresh interpreters: Airflow configures itself on import)."""
    context = multiprocessing.get_context("spawn")
    processes: list[BaseProcess] = [
        context.Process(
            target=run_dags,
            kwargs={
                "home": str(tmp_path / f"home{i}"),
                "template_db": str(template_db),
                "dags_folder": str(dags),
                "env": env,
                "runs": child_runs,
                "results": str(tmp_path / "runs.jsonl"),
            },
        )
        for i, child_runs in enumerate(runs)
    ]
    for process in processes:
        process.start()
    return processes


def test_three_dag_runs_in_three_processes_compute_once(tmp_path: Path, template_db: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    statsd = StatsD()
    env = {"DIBS_STORE_URL": f"sqlite:///{tmp_path / 'dibs.db'}", "DIBS_IT_DIR": str(work), **statsd.env}
    started = time.monotonic()
    # three runs (three logical dates, so three run ids): three owners; the first process then runs a
    # fourth, after the artifact was stored (its own first run ended with it): a hit
    runs = [[{"dag_id": "dibs_integration", "logical_date": f"2024-01-0{i}"}] for i in (1, 2, 3)]
    runs[0].append({"dag_id": "dibs_integration", "logical_date": "2024-01-04"})
    with statsd:
        processes = start(tmp_path, template_db, HERE / "dags", env, runs)
        _run_three(tmp_path, work, processes)
    elapsed = time.monotonic() - started
    print(f"three-process integration scenario took {elapsed:.1f}s")
    assert [p.exitcode for p in processes] == [0, 0, 0], child_logs(tmp_path)

    assert len(lines(work / "executions.txt")) == 1
    assert len(lines(work / "deferrals.txt")) == 2
    every = [json.loads(line) for line in lines(tmp_path / "runs.jsonl")]
    (late,) = [run for run in every if run["logical_date"].startswith("2024-01-04")]
    done = [run for run in every if run is not late]
    assert len(done) == 3 and all(run["state"] == "success" for run in every)
    outcomes = [run["outcomes"]["build_features[-1]"] for run in done]
    assert sorted(o["role"] for o in outcomes) == ["computed", "waited", "waited"]
    computed = next(o for o in outcomes if o["role"] == "computed")
    for outcome in outcomes:
        assert outcome["key"] == computed["key"] and outcome["token"] == computed["token"]
        assert outcome["producer"] == computed["owner"]
        if outcome["role"] == "waited":
            assert outcome["waited_on"] == computed["owner"] and outcome["deferrals"] == 1
    assert late["outcomes"]["build_features[-1]"]["role"] == "hit"
    values = [run["values"]["build_features[-1]"] for run in every]
    assert values[0] == values[1] == values[2] == values[3] and values[0]["rows"] == 42
    # downstream tasks of every run received the same artifact through XCom
    received = [json.loads(line)["value"] for line in lines(work / "results.jsonl")]
    assert len(received) == 4 and all(value == values[0] for value in received)
    _assert_stats(statsd)


def _assert_stats(statsd: StatsD) -> None:
    """What Airflow's Stats (StatsD) received from the four runs: one computation, two waits, one hit."""
    got = statsd.metrics("dibs.")
    counted = {name: sum(value for value, _ in points) for name, points in got.items()}
    outcomes = {name.rsplit(".", 1)[1]: n for name, n in counted.items() if ".outcomes." in name}
    assert outcomes == {"computed": 1, "waited": 2, "hit": 1}, got
    (compute_ms,) = [value for value, kind in got["dibs.compute.duration"] if kind == "ms"]
    assert len(got["dibs.wait.duration.waited"]) == 2 and len(got["dibs.handoff.duration"]) == 2
    # the producer's compute time, credited to the two waiters and the hit (each rounded to a ms)
    assert abs(counted["dibs.compute.saved_ms"] - 3 * compute_ms) <= 3
    assert len(got["dibs.store.operation.duration.acquire"]) >= 4  # every call asked at least once
    assert len(got["dibs.store.operation.duration.complete"]) == 1
    # the tasks only acquire and complete; reads are the triggers' waits (run in-process by dag.test())
    assert len(got["dibs.store.operation.duration.read"]) >= 2
    assert counted["dibs.leases.active"] == 0 and counted["dibs.waiters.active"] == 0


def _run_three(tmp_path: Path, work: Path, processes: list[BaseProcess]) -> None:
    try:
        # The run that acquired the key holds it until the two others have found it busy and deferred.
        wait_until(
            lambda: len(lines(work / "executions.txt")) >= 1 and len(lines(work / "deferrals.txt")) >= 2,
            processes,
            "one execution and two deferrals",
            tmp_path,
        )
        (work / "go").touch()
        for process in processes:
            process.join(BOUND)
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()


def test_a_task_stopped_through_on_kill_frees_its_key_at_once(tmp_path: Path, template_db: Path) -> None:
    """SIGTERM to a running task (what Airflow's supervisor sends on mark failed) reaches the task runner's
    handler, which calls on_kill: the lease is released with the failure recorded, the wrapped
    BashOperator's own on_kill stops its command, and a waiter in another process gets the key at once
    (its ttl is 600 s: only the release can hand it over within the test)."""
    work = tmp_path / "work"
    work.mkdir()
    store_url = f"sqlite:///{tmp_path / 'dibs.db'}"
    env = {"DIBS_STORE_URL": store_url, "DIBS_IT_DIR": str(work)}
    (process,) = start(tmp_path, template_db, HERE / "dags", env, [[manual("dibs_on_kill", "2026-11-25")]])
    got: list[object] = []
    try:
        wait_until((work / "started").exists, [process], "the task to start its work", tmp_path)
        with dibs.Reservations(store_url) as client:
            key = "held-until-killed"
            holder = client.status(key).live_lease
            assert holder is not None and holder.ttl == 600

            def wait_for_the_key() -> None:  # a waiter holding nothing, in this other process
                got.append(client.acquire(key, owner="waiting-run", timeout=BOUND))

            waiter = threading.Thread(target=wait_for_the_key, daemon=True)
            waiter.start()
            assert process.pid is not None
            os.kill(process.pid, signal.SIGTERM)
            waiter.join(BOUND)
            process.join(BOUND)
            (taken,) = got
            assert isinstance(taken, dibs.Acquired), taken
            assert taken.took_over_from is None  # released, not expired
            assert taken.last_failure is not None and taken.last_failure.error == KILLED_FAILURE
            assert taken.last_failure.owner == holder.owner and taken.lease.token == holder.token.fence + 1
            taken.lease.release()
    finally:
        if process.is_alive():
            process.kill()
    assert process.exitcode == 3, child_logs(tmp_path)  # the run finished, its task failed
    (run,) = (json.loads(line) for line in lines(tmp_path / "runs.jsonl"))
    assert run["state"] == "failed"
    log = (tmp_path / "home0" / "child.log").read_text()
    assert "the task was killed: released default/held-until-killed" in log
    assert "Sending SIGTERM signal to process group" in log  # then BashOperator's own on_kill ran
    # The hold loop's own release after the kill found nothing left to do, and said nothing about it.
    assert "nothing to release" not in log and "lease was lost" not in log


def manual(dag_id: str, run_after: str, **conf: str) -> dict[str, Any]:
    """A manual trigger without a logical date (Airflow 3's "Trigger" button), at ``run_after`` (UTC)."""
    return {"dag_id": dag_id, "logical_date": None, "run_after": run_after, "conf": conf or None}


def test_example_dags_run_on_a_manual_trigger_without_a_logical_date(
    tmp_path: Path, template_db: Path
) -> None:
    env = {"DIBS_STORE_URL": f"sqlite:///{tmp_path / 'dibs.db'}"}
    runs = [
        manual("dibs_daily_training", "2026-11-25T06:00:00"),
        manual("dibs_six_hourly_report", "2026-11-25T12:00:00"),
        manual("dibs_six_hourly_report", "2026-11-25T18:00:00"),
        manual("dibs_daily_training", "2026-11-25T20:00:00", day="2026-11-24"),  # a backfill, by param
        manual("dibs_mapped_partitions", "2026-11-25T06:00:00"),
        manual("dibs_mapped_partitions", "2026-11-25T07:00:00"),
    ]
    (process,) = start(tmp_path, template_db, REPO / "example_dags", env, [runs])
    process.join(BOUND)
    if process.is_alive():
        process.kill()
    assert process.exitcode == 0, child_logs(tmp_path)
    done = [json.loads(line) for line in lines(tmp_path / "runs.jsonl")]
    assert [run["dag_id"] for run in done] == [run["dag_id"] for run in runs]
    for run in done:  # every task succeeded at its first try: nothing failed to render and retried
        assert run["state"] == "success" and run["logical_date"] is None, run
        assert run["tries"] and set(run["tries"].values()) == {1}, run["tries"]
    training, report, later_report, backfill, partitions, later_partitions = done

    # One feature build per day, whichever DAG asks first; the day comes from the run (or the param).
    features = training["outcomes"]["build_features[-1]"]
    assert features["role"] == "computed" and training["values"]["build_features[-1]"]["day"] == "2026-11-25"
    for run in (report, later_report):
        assert run["outcomes"]["build_features[-1]"]["role"] == "hit"
        assert run["outcomes"]["build_features[-1]"]["key"] == features["key"]
    assert training["outcomes"]["train[-1]"]["key"] == "default/model-2026-11-25"
    assert backfill["outcomes"]["build_features[-1]"]["role"] == "computed"
    assert backfill["outcomes"]["build_features[-1]"]["key"] != features["key"]
    assert backfill["values"]["build_features[-1]"]["day"] == "2026-11-24"
    assert backfill["outcomes"]["train[-1]"]["key"] == "default/model-2026-11-24"

    # The reserved BashOperator exports the day once; the sensor returns the training DAG's model.
    assert report["outcomes"]["export_day[-1]"]["role"] == "computed"
    assert later_report["outcomes"]["export_day[-1]"]["role"] == "hit"
    assert report["values"]["export_day[-1]"] == "exported 2026-11-25"
    assert report["values"]["wait_for_model[-1]"] == training["values"]["train[-1]"]
    assert report["values"]["report[-1]"] == "1000000 rows, exported 2026-11-25, auc=0.91"

    # Mapped partitions: one key per partition, each computed once.
    for task_id in ("process", "validate"):
        names = [f"{task_id}[{i}]" for i in range(3)]
        first, second = partitions["outcomes"], later_partitions["outcomes"]
        assert len({first[n]["key"] for n in names}) == 3
        assert [first[n]["role"] for n in names] == ["computed"] * 3
        assert [second[n]["role"] for n in names] == ["hit"] * 3
        assert [second[n]["key"] for n in names] == [first[n]["key"] for n in names]
    assert partitions["values"]["combine[-1]"] == later_partitions["values"]["combine[-1]"] == 333


def test_airflow_cli_adds_and_tests_dibs_connections(tmp_path: Path, template_db: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    shutil.copyfile(template_db, home / "airflow.db")
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__TEST_CONNECTION": "Enabled",
        "AIRFLOW_CONN_DIBS_BAD": json.dumps({"conn_type": "dibs", "extra": {"ttl": 0}}),
    }

    def airflow(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(AIRFLOW), *args], env=env, capture_output=True, text=True, timeout=120, check=False
        )

    extra = json.dumps({"store_url": f"sqlite:///{tmp_path / 'cli.db'}", "namespace": "team.cli", "ttl": 45})
    added = airflow("connections", "add", "dibs_cli", "--conn-type", "dibs", "--conn-extra", extra)
    assert added.returncode == 0, added.stdout + added.stderr
    good = airflow("connections", "test", "dibs_cli")
    assert good.returncode == 0 and "Connection success" in good.stdout, good.stdout + good.stderr
    bad = airflow("connections", "test", "dibs_bad")
    if Version("3.3") <= AIRFLOW_VERSION:  # before 3.3, the CLI exits 0 after "Connection failed!"
        assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "Connection failed!" in bad.stdout, bad.stdout + bad.stderr
    assert "dibs connection 'dibs_bad': extra 'ttl' must be a number of seconds greater than 0" in bad.stdout
    # A store whose driver is missing: the hint to install the extra survives the CLI's Rich markup.
    hidden = tmp_path / "without-psycopg" / "psycopg"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text('raise ImportError("psycopg is not installed", name="psycopg")\n')
    env["PYTHONPATH"] = os.pathsep.join([str(hidden.parent), env.get("PYTHONPATH", "")])
    env["AIRFLOW_CONN_DIBS_NODRIVER"] = json.dumps(
        {"conn_type": "dibs", "extra": {"store_url": "postgresql+psycopg://dibs@127.0.0.1:1/dibs"}}
    )
    missing = airflow("connections", "test", "dibs_nodriver")
    if Version("3.3") <= AIRFLOW_VERSION:
        assert missing.returncode == 1, missing.stdout + missing.stderr
    assert "install it with: pip install 'dibs[ postgres ]'" in missing.stdout, missing.stdout


def test_a_payload_crosses_to_a_downstream_task_as_a_reference_in_xcom(
    tmp_path: Path, template_db: Path
) -> None:
    # Real Airflow, Airflow's XCom machinery: the reserved task's return_value XCom is a small
    # reference (the metadata database never gets the payload), and the downstream TaskFlow task's
    # argument is the value, resolved through dibs by the provider's XCom backend.
    work = tmp_path / "work"
    work.mkdir()
    env = {
        "DIBS_STORE_URL": f"sqlite:///{tmp_path / 'dibs.db'}",
        "DIBS_PAYLOADS_URL": (tmp_path / "payloads").as_uri(),
        "DIBS_IT_DIR": str(work),
        "AIRFLOW__CORE__XCOM_BACKEND": "dibs_provider.xcom.DibsXComBackend",
    }
    processes = start(
        tmp_path, template_db, HERE / "dags", env, [[{"dag_id": "dibs_payload_xcom", "logical_date": None}]]
    )
    for process in processes:
        process.join(BOUND)
        if process.is_alive():
            process.kill()
    assert [p.exitcode for p in processes] == [0], child_logs(tmp_path)
    (run,) = [json.loads(line) for line in lines(tmp_path / "runs.jsonl")]
    value = "x" * 300_000
    assert json.loads((work / "received.json").read_text()) == {
        "size": len(value),
        "sha256": hashlib.sha256(value.encode()).hexdigest(),
    }
    pushed = run["values"]["export[-1]"]  # as Airflow's database holds it
    reference = pushed["__dibs_artifact__"]
    assert (reference["name"], reference["size"]) == ("big-export", len(json.dumps(value)))  # as stored
    assert reference["sha256"] == hashlib.sha256(json.dumps(value).encode()).hexdigest()
    assert len(json.dumps(pushed)) < 1000

"""End to end, the way Airflow is deployed: every component a process of its own, metadata on PostgreSQL.

``airflow scheduler`` (LocalExecutor), ``airflow dag-processor``, ``airflow triggerer`` and
``airflow api-server`` (which task processes report to) run from one ``AIRFLOW_HOME`` against a fresh
PostgreSQL database created for the run and dropped after it; the dibs store is a ``dibs_default``
connection on that same PostgreSQL database. The DAG (``e2e_dags/dibs_e2e.py``) uses
``@task.reserved``; runs are triggered with ``airflow dags trigger``, as a user would, and the test
reads their progress from the metadata database.

* Concurrent DAG runs share one computation: one run computes, the others reach ``deferred`` (no
  worker slot held), resume when the artifact is stored, and all end with the same value.
* A holder whose task process is SIGKILLed is taken over by one waiter after the lease's ttl; every
  waiting run ends with the taker's value.
* The dibs store restarts, ``OUTAGE`` s down, while runs are deferred on a key (the ``dibs_outage``
  connection: a PostgreSQL server of the test's own, tests/postgres_servers.py): the triggerer's waits
  ride the outage out, the holder stores once the store is back, and every run ends with its value (issue 29).

CI runs 3 DAG runs per scenario and a 10 s outage; ``DIBS_FULL=1`` runs 6 and 30 s.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import sys
import time
import urllib.parse
import uuid
import warnings
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("airflow")

from tests.airflow import _reservations_page as page
from tests.airflow.statsd import StatsD
from tests.components import Components, free_port, run_at_once
from tests.postgres_servers import ThrowawayPostgres
from tests.services import full_size, services_required, unavailable

#: Three scenarios on one deployment of four Airflow components (the deployment's start alone took 61 s
#: of a loaded CI machine, the scenarios 228 s): past pytest-timeout's 300 s for setup, call and
#: teardown together. Each wait is bounded on its own (tests/components.py's BOUND), naming what it
#: waited for; this bound only catches a hang between them.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
AIRFLOW = str(Path(sys.executable).with_name("airflow"))
DAG_ID = "dibs_e2e"
OUTAGE_DAG_ID = "dibs_e2e_outage"
#: Seconds the outage scenario's store stays down: a managed database's failover (20-60 s on the big
#: clouds) at full size; in CI 10 s, still twice what failed every waiting task before (5 s).
OUTAGE = 30.0 if full_size() else 10.0
RUNS = 6 if full_size() else 3
TERMINAL = ("success", "failed")


def _libpq(url: str) -> str:
    """A SQLAlchemy URL (``postgresql+psycopg://...``) as psycopg's own connection string."""
    scheme, rest = url.split("://", 1)
    return f"{scheme.split('+')[0]}://{rest}"


@pytest.fixture
def metadata_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for this run's metadata (and dibs store); dropped after it."""
    base = os.environ.get("DIBS_TEST_POSTGRES_URL")
    if not base:
        unavailable("DIBS_TEST_POSTGRES_URL is not set: the Airflow deployment needs a PostgreSQL server")
    try:
        import psycopg
    except ImportError:
        unavailable("psycopg is not installed (pip install 'dibs[postgres]')")

    name = f"dibs_airflow_e2e_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg.connect(_libpq(base), autocommit=True)
    except psycopg.OperationalError as exc:
        unavailable(f"PostgreSQL at DIBS_TEST_POSTGRES_URL is unreachable: {exc}")
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield base.rsplit("/", 1)[0] + "/" + name
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Airflow:
    """One Airflow deployment: the environment of its processes and a view of its metadata."""

    def __init__(self, tmp_path: Path, metadata_url: str, outage_url: str) -> None:
        self.statsd = StatsD()  # Airflow's StatsD metrics of every component, dibs's among them
        self.work = tmp_path / "work"
        self.work.mkdir()
        self.port = free_port()
        self.metadata_url = metadata_url
        store = {"conn_type": "dibs", "extra": {"store_url": metadata_url, "namespace": "e2e"}}
        restarting = {"conn_type": "dibs", "extra": {"store_url": outage_url, "namespace": "e2e"}}
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "DIBS_STORE_URL"))}
        env.update(
            AIRFLOW_HOME=str(tmp_path / "airflow"),
            AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=metadata_url,
            # No idle pooled connections: four components and their workers would otherwise hold
            # dozens of a shared server's connections for the length of the test.
            AIRFLOW__DATABASE__SQL_ALCHEMY_POOL_ENABLED="False",
            AIRFLOW__CORE__EXECUTOR="LocalExecutor",
            AIRFLOW__CORE__PARALLELISM="8",
            AIRFLOW__CORE__DAGS_FOLDER=str(HERE / "e2e_dags"),
            AIRFLOW__CORE__LOAD_EXAMPLES="False",
            AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="False",
            AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"http://127.0.0.1:{self.port}/execution/",
            AIRFLOW__API__BASE_URL=f"http://127.0.0.1:{self.port}",
            AIRFLOW__API_AUTH__JWT_SECRET=secrets.token_hex(16),
            AIRFLOW__API__SECRET_KEY=secrets.token_hex(16),
            AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME="0.5",
            AIRFLOW_CONN_DIBS_OUTAGE=json.dumps(restarting),
            DIBS_E2E_DIR=str(self.work),
            **page.auth_environment(tmp_path / "auth"),
            PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
            **self.statsd.env,
        )
        self.env = env
        self.store = store

    def sql(self, query: str, *args: Any) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(_libpq(self.metadata_url)) as conn:
            return list(conn.execute(query, args).fetchall())

    def task_states(self, run_ids: list[str], dag_id: str = DAG_ID) -> dict[str, str | None]:
        rows = self.sql(
            "SELECT run_id, state FROM task_instance WHERE dag_id = %s AND task_id = 'build_features'"
            " AND run_id = ANY(%s)",
            dag_id,
            run_ids,
        )
        return dict(rows)

    def finished(self, run_ids: list[str], dag_id: str = DAG_ID) -> dict[str, str] | None:
        """The final state of every run, once all of them have one."""
        query = "SELECT run_id, state FROM dag_run WHERE dag_id = %s AND run_id = ANY(%s)"
        states: dict[str, str] = dict(self.sql(query, dag_id, run_ids))  # type: ignore[arg-type]
        done = len(states) == len(run_ids) and all(state in TERMINAL for state in states.values())
        return states if done else None

    def deferred_while_computing(self, run_ids: list[str], computing: int, dag_id: str = DAG_ID) -> bool:
        """``computing`` of the runs' reserved tasks are running, every other one is deferred."""
        states = sorted(self.task_states(run_ids, dag_id).values(), key=str)
        return states == ["deferred"] * (len(run_ids) - computing) + ["running"] * computing

    def trigger(self, scenario: str, run_ids: list[str], dag_id: str = DAG_ID) -> None:
        conf = json.dumps({"scenario": scenario})
        run_at_once(
            [[AIRFLOW, "dags", "trigger", dag_id, "--run-id", run_id, "--conf", conf] for run_id in run_ids],
            self.env,
            REPO,
        )

    def lines(self, name: str) -> list[str]:
        path = self.work / name
        return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def airflow(
    tmp_path: Path, metadata_url: str, restartable_postgres: ThrowawayPostgres
) -> Iterator[tuple[Airflow, Components]]:
    outage_url = restartable_postgres.url(schema=f"e2e_{uuid.uuid4().hex[:12]}", timeout="2")
    deployment = Airflow(tmp_path, metadata_url, outage_url)
    deployment.statsd.__enter__()
    components = Components(tmp_path / "logs", REPO)
    migrated = run_at_once([[AIRFLOW, "db", "migrate"]], deployment.env, REPO)
    assert migrated, "airflow db migrate printed nothing"
    try:
        components.start(
            "api-server", [AIRFLOW, "api-server", "--port", str(deployment.port)], deployment.env, serves=True
        )
        components.wait_until(lambda: page.serving(f"http://127.0.0.1:{deployment.port}"), "the API server")
        page.add_connection(f"http://127.0.0.1:{deployment.port}", "dibs_default", deployment.store)
        components.start("scheduler", [AIRFLOW, "scheduler"], deployment.env)
        components.start("dag-processor", [AIRFLOW, "dag-processor"], deployment.env)
        components.start("triggerer", [AIRFLOW, "triggerer"], deployment.env)
        try:
            components.wait_until(
                lambda: (
                    len(
                        deployment.sql(
                            "SELECT dag_id FROM serialized_dag WHERE dag_id = ANY(%s)",
                            [DAG_ID, OUTAGE_DAG_ID],
                        )
                    )
                    == 2
                ),
                "the dag-processor to parse the DAGs",
                bound=180,
            )
        except pytest.fail.Exception as exc:
            unavailable(f"the Airflow deployment did not come up: {exc}")
        yield deployment, components
    finally:
        components.stop_all()
        deployment.statsd.__exit__()


def _results(deployment: Airflow, scenario: str) -> dict[str, dict[str, Any]]:
    return {r["run_id"]: r for r in map(json.loads, deployment.lines(f"results-{scenario}.jsonl"))}


def test_concurrent_dag_runs_share_one_computation_and_survive_a_killed_holder(
    airflow: tuple[Airflow, Components], restartable_postgres: ThrowawayPostgres
) -> None:
    deployment, components = airflow

    # 1. Concurrent runs: one computes, the others defer, then resume with its artifact.
    shared = [f"share-{i}" for i in range(RUNS)]
    deployment.trigger("share", shared)
    components.wait_until(lambda: deployment.lines("executions-share.txt"), "one run to start computing")
    components.wait_until(
        lambda: deployment.deferred_while_computing(shared, computing=1),
        f"{RUNS - 1} runs to defer while one computes",
    )
    _check_what_people_see(deployment, components, shared)
    (deployment.work / "gate-share").touch()
    states = components.wait_until(lambda: deployment.finished(shared), f"{RUNS} DAG runs to finish")
    assert states == dict.fromkeys(shared, "success"), components.tails()
    (builder,) = deployment.lines("executions-share.txt")  # one computation for every run
    builder_run = _assert_one_computation(deployment, "share", shared, builder, fence=1)["run_id"]
    _forget_through_the_page(deployment)

    # 2. The holder's task process is SIGKILLed while the others are deferred: one of them takes over.
    holder_run, waiting = "kill-holder", [f"kill-{i}" for i in range(1, RUNS)]
    deployment.trigger("kill", [holder_run])
    (victim,) = components.wait_until(lambda: deployment.lines("executions-kill.txt"), "the holder")
    deployment.trigger("kill", waiting)
    components.wait_until(
        lambda: deployment.deferred_while_computing(waiting, computing=0),
        f"{RUNS - 1} runs to defer on the holder",
    )
    held_retry = deployment.work / f"hold-retry-{holder_run}"
    held_retry.touch()  # the holder's retry waits for the takeover (see the DAG)
    os.kill(int(victim), signal.SIGKILL)
    killed = time.monotonic()
    (deployment.work / "gate-kill").touch()  # the taker's computation may finish at once
    components.wait_until(
        lambda: len(deployment.lines("executions-kill.txt")) == 2, "a waiter to take over the key"
    )
    print(f"a waiter took over {time.monotonic() - killed:.1f}s after the holder was killed")

    held_retry.unlink()
    every = [holder_run, *waiting]
    states = components.wait_until(
        lambda: deployment.finished(every), f"{RUNS} runs to finish after the kill"
    )
    # The holder's run too: its retry finds the taker's artifact.
    assert states == dict.fromkeys(every, "success"), components.tails()
    dead, taker = deployment.lines("executions-kill.txt")  # the killed holder, then exactly one taker
    assert dead == victim and taker != victim
    computed = _assert_one_computation(deployment, "kill", every, taker, fence=2)
    assert computed["run_id"] in waiting  # a waiter took over, not the holder's own retry
    assert computed["outcome"]["took_over_from"] == f"{DAG_ID}/{holder_run}/build_features/-1"
    first = [run for run in shared if run != builder_run]
    _took_the_first_waits_up_as_the_next(deployment, cold=first, warm=waiting)
    retried = _retried_by_the_deferral_race(deployment, holder_run, components)
    _assert_stats(deployment.statsd, retried=len(retried))
    _ride_out_a_store_restart(deployment, components, restartable_postgres)


def _ride_out_a_store_restart(deployment: Airflow, components: Components, server: ThrowawayPostgres) -> None:
    """3. The dibs store restarts, ``OUTAGE`` s down, while one run computes and the others are deferred: the
    triggerer's waits ride the outage out (a trigger holds nothing), the holder stores once the store is
    back, and every run ends with the one computation's value."""
    runs = [f"outage-{i}" for i in range(RUNS)]
    deployment.trigger("outage", runs, OUTAGE_DAG_ID)
    components.wait_until(lambda: deployment.lines("executions-outage.txt"), "one run to start computing")
    components.wait_until(
        lambda: deployment.deferred_while_computing(runs, computing=1, dag_id=OUTAGE_DAG_ID),
        f"{RUNS - 1} runs to defer while one computes",
    )
    server.restart(OUTAGE)  # every connection cut, the server down OUTAGE s, then back on its port
    (deployment.work / "gate-outage").touch()
    states = components.wait_until(
        lambda: deployment.finished(runs, OUTAGE_DAG_ID), f"{RUNS} runs to finish after the restart"
    )
    assert states == dict.fromkeys(runs, "success"), components.tails()
    (builder,) = deployment.lines("executions-outage.txt")  # one computation, through the restart
    _assert_one_computation(deployment, "outage", runs, builder, fence=1)


def _took_the_first_waits_up_as_the_next(deployment: Airflow, *, cold: list[str], warm: list[str]) -> None:
    """The triggerer's first deferrals (the share runs': it had just started) were taken up without
    its first connection lookup: each task handed its trigger the connection it had read (dibs_default
    lives in the metadata database, where a trigger's lookup is answered by the in-process execution
    API the triggerer builds on its first request, seconds on a quiet host and a minute on a loaded
    one: docs/airflow.md). How long each took is printed beside the later, warm deferrals' (the kill
    runs'): a time, so it is reported here and never asserted (benchmarks/ holds performance goals)."""
    logs = Path(deployment.env["AIRFLOW_HOME"]) / "logs" / f"dag_id={DAG_ID}"
    for run in cold + warm:
        folder = logs / f"run_id={run}" / "task_id=build_features"
        said = [
            str(line.get("event"))
            for path in folder.glob("attempt=1.log.trigger.*.log")
            for line in _log_lines(path)
        ]
        assert any("from connection 'dibs_default', as its task read it" in line for line in said), (
            run,
            said,
        )
    first, later = _taken_up(deployment, cold, DAG_ID), _taken_up(deployment, warm, DAG_ID)
    print(
        "seconds from a task's deferral to its trigger's first look at the key: the triggerer's first "
        f"deferrals {first}, later ones {later}"
    )


def _log_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def _taken_up(deployment: Airflow, run_ids: list[str], dag_id: str) -> dict[str, float]:
    """Per run, seconds from its task's first deferral to its trigger's first look at the key (the
    trigger's log line "dibs: waiting on ...", or its store outage): how long the triggerer took to
    take the wait up. Both times are written by processes of this host."""
    logs = Path(deployment.env["AIRFLOW_HOME"]) / "logs" / f"dag_id={dag_id}"
    taken: dict[str, float] = {}
    for run in run_ids:
        folder = logs / f"run_id={run}" / "task_id=build_features"
        deferred = [
            line["timestamp"]
            for line in _log_lines(folder / "attempt=1.log")
            if str(line.get("event")).startswith("Pausing task as DEFERRED")
        ]
        looked = [
            line["timestamp"]
            for path in folder.glob("attempt=1.log.trigger.*.log")
            for line in _log_lines(path)
            if str(line.get("event")).startswith(("dibs: waiting on", "e2e/"))
        ]
        if deferred and looked:
            first = datetime.fromisoformat(min(looked)) - datetime.fromisoformat(min(deferred))
            taken[run] = round(first.total_seconds(), 2)
    return taken


def _retried_by_the_deferral_race(deployment: Airflow, holder_run: str, components: Components) -> list[str]:
    """The waiters Airflow failed while they were deferred, and retried: each by its deferral race only.

    A task process that defers exits, and the executor reports that exit as ``success``. Its
    supervisor can notice the exit up to ``[workers] min_heartbeat_interval`` (5 s) late; if the
    trigger fires meanwhile (the holder stored the artifact, or its lease expired), the scheduler has
    queued the resumed task before it reads that stale ``success``, takes it for a task killed
    externally ("state mismatch" in the audit log) and fails the try (apache/airflow#67287, queued;
    #72716, running; Airflow 3.3.2 spares only a task still ``scheduled``, #66374). Any other reason
    for a waiter's retry is a failure of this test. It reads the ``deferred`` rows that Airflow's
    execution API writes to the audit log (the locked 3.3; scripts/matrix does not run this file on
    older releases).
    """
    retried = [
        run
        for (run,) in deployment.sql(
            "SELECT run_id FROM task_instance WHERE dag_id = %s AND task_id = 'build_features'"
            " AND try_number > 1 AND run_id <> %s",
            DAG_ID,
            holder_run,
        )
    ]
    events: dict[str, list[tuple[str, str]]] = {run: [] for run in retried}
    for run, event, extra in deployment.sql(
        "SELECT run_id, event, extra FROM log WHERE dag_id = %s AND task_id = 'build_features'"
        " AND try_number = 1 AND run_id = ANY(%s) ORDER BY dttm",
        DAG_ID,
        retried,
    ):
        events[run].append((event, extra or ""))
    print(
        "waiters that Airflow failed by its deferral race (a stale executor success of their deferral's "
        f"exit, apache/airflow#67287 and #72716) and retried: {sorted(retried)}"
    )
    other = {
        run: seen
        for run, seen in events.items()
        if not any(event == "deferred" for event, _ in seen)
        or not any(event == "state mismatch" and "with state success" in extra for event, extra in seen)
    }
    assert not other, (
        "Airflow retried these waiters for another reason than its deferral race (no 'deferred', then "
        "'state mismatch' of an executor success, in the audit log of their first try)",
        other,
        components.tails(),
    )
    return retried


def _assert_stats(statsd: StatsD, *, retried: int) -> None:
    """dibs's measurements reached Airflow's StatsD from the task processes and the triggerer."""
    got = statsd.metrics("dibs.")
    counted = {name: sum(value for value, _ in points) for name, points in got.items()}
    # share: one computation, every other run waited; kill: a waiter took over. A waiter that Airflow
    # failed by its deferral race (see _retried_by_the_deferral_race) never reports its wait: its retry
    # finds the artifact and counts a hit instead (on a slow 2-core host: share-0 and kill-2, waited 1).
    assert counted.get("dibs.reservation.outcomes.computed", 0) >= 1, sorted(got)
    assert counted.get("dibs.reservation.outcomes.took_over", 0) >= 1, sorted(got)
    waited = counted.get("dibs.reservation.outcomes.waited", 0)
    hits = counted.get("dibs.reservation.outcomes.hit", 0)
    assert waited >= RUNS - 1 - retried, (waited, retried, sorted(got))
    assert waited + hits >= RUNS - 1, (waited, hits, sorted(got))
    assert counted["dibs.compute.saved_ms"] > 0 and got["dibs.wait.duration.waited"]
    # the tasks acquire, heartbeat, complete and release; reads are the deferred waits, in the triggerer
    assert got["dibs.store.operation.duration.read"] and got["dibs.store.operation.duration.acquire"]


def _check_what_people_see(deployment: Airflow, components: Components, run_ids: list[str]) -> None:
    """While one run holds the key and the others are deferred: the waiters' rendered
    ``reservation_key`` and "Reservation" link name the derived key, the API lists the dibs plugin,
    and the Reservations page, in headless Chromium, shows the key, its holder and its waiters to an
    admin, and to a viewer who cannot release it."""
    states = deployment.task_states(run_ids)
    (holder_run,) = [run for run, state in states.items() if state == "running"]
    waiting = sorted(run for run in run_ids if run != holder_run)

    def rendered_keys() -> dict[str, Any] | None:
        rows = deployment.sql(
            "SELECT run_id, rendered_fields FROM rendered_task_instance_fields WHERE dag_id = %s"
            " AND task_id = 'build_features' AND run_id = ANY(%s)",
            DAG_ID,
            waiting,
        )
        keys = {run: (fields or {}).get("reservation_key") for run, fields in rows}
        return keys if sorted(keys) == waiting and all(keys.values()) else None

    # Written when each waiter's task process deferred: the key derived at run time, not null.
    keys = components.wait_until(rendered_keys, "the waiters' rendered reservation_key")
    (key,) = set(keys.values())
    assert key.startswith("build_features/"), key

    base = f"http://127.0.0.1:{deployment.port}"
    admin = page.token(base, "admin")
    plugins = page.api(base, admin, "/api/v2/plugins")["plugins"]
    (dibs,) = [plugin for plugin in plugins if plugin["name"] == "dibs"]
    assert [app["url_prefix"] for app in dibs["fastapi_apps"]] == ["/dibs"]
    assert [view["name"] for view in dibs["external_views"]] == ["Reservations"]
    links = page.api(
        base, admin, f"/api/v2/dags/{DAG_ID}/dagRuns/{waiting[0]}/taskInstances/build_features/links"
    )
    link = links["extra_links"]["Reservation"]  # the page inside Airflow's frame, at the key
    assert link == "/plugin/dibs/dibs/?" + urllib.parse.urlencode({"conn": "dibs_default", "key": key})

    missing = page.browser_missing()
    if missing is not None:
        if services_required():
            pytest.fail(f"the Reservations page cannot be checked: {missing}", pytrace=False)
        warnings.warn(f"the Reservations page was not checked in a browser: {missing}", stacklevel=1)
        return
    seen = page.check_page(base, key=key, extra_link=link, shots=deployment.work.parent)
    task_path = f"/dags/{DAG_ID}/runs/{holder_run}/tasks/build_features"
    for user in ("admin", "viewer"):
        saw = seen[user]
        assert saw["rows"] == 1 and saw["state"] == "held", (user, saw)
        assert f"{DAG_ID} / {holder_run}" in saw["holder"], (user, saw)
        assert saw["holder_href"] == task_path, saw
        assert sorted(w.split(" / ")[1].split(" ")[0] for w in saw["waiters"]) == waiting, (user, saw)
    admin = seen["admin"]
    assert admin["release_buttons"] == 1
    # Browse → Reservations, filtered inside Airflow's frame: Airflow's address bar follows the frame.
    assert admin["filtered_url"].startswith(f"{base}/plugin/dibs/dibs/?") and "name=" in admin["filtered_url"]
    # The holder's task link lands on that task in Airflow's own window: one sidebar, no frame.
    assert admin["task_url"] == base + task_path, admin
    assert (admin["frames_after_click"], admin["sidebars_after_click"]) == (0, 1), admin
    # The waiter's "Reservation" link lands on the page inside Airflow's frame, at its key.
    assert admin["linked_url"] == base + link and admin["linked_frame"] == [
        base + link.removeprefix("/plugin/dibs")
    ]
    assert admin["linked_rows"] == 1, admin
    # In a dark browser Airflow is dark, and so is the page in its frame: light text on a dark ground.
    dark = seen["dark"]
    assert dark["airflow_dark"] and dark["theme"] == "dark", dark
    assert dark["background"] < 0.35 and dark["text"] > 0.65, dark
    viewer = seen["viewer"]
    assert viewer["status"] == 200 and viewer["release_buttons"] == 0
    assert viewer["confirm_status"] == 403 and "edit permission" in viewer["confirm_text"], viewer
    # A form's POST, and a script's with a bearer token (which needs no Origin): both refused to a
    # viewer, and the key stays held (one computation, checked after).
    assert (viewer["post_status"], viewer["bearer_status"]) == (403, 403), viewer
    for shot in (admin["screenshot"], dark["screenshot"]):
        assert shot.read_bytes().startswith(b"\x89PNG")
    status, location = seen["anonymous"]
    assert status == 303 and location.endswith("/auth/login"), seen["anonymous"]


def _forget_through_the_page(deployment: Airflow) -> None:
    """An admin forgets the stored key on the Reservations page: asked first, then done and logged
    in Airflow's audit log under the admin's name."""
    if page.browser_missing() is not None:
        return  # said (or failed) by _check_what_people_see
    (key,) = {r["outcome"]["key"] for r in _results(deployment, "share").values()}
    name = key.removeprefix("e2e/")
    base = f"http://127.0.0.1:{deployment.port}"
    seen = page.forget_through_page(base, key=name)
    assert seen["state"] == "done" and seen["confirm"] == f"Forget {key}?", seen
    # Each step inside Airflow's frame, its address bar following: confirm, then done.
    assert seen["confirm_url"].startswith(f"{base}/plugin/dibs/dibs/confirm?action=forget"), seen
    assert seen["done_url"].startswith(f"{base}/plugin/dibs/dibs/?conn=dibs_default&done="), seen
    # Refused before the real one: no Origin on a cookie's post, a stale token (a bearer's post
    # needs no Origin: it reaches the token's check).
    assert (seen["no_origin"], seen["stale"], seen["bearer_stale"]) == (403, 409, 409), seen
    # The record stays, holding nothing: free, no artifact (its fence keeps tokens rising).
    assert seen["notice"] == f"forgot {key}" and seen["after"] == ["free", ""], seen
    audit = deployment.sql("SELECT owner, extra FROM log WHERE event = 'dibs.forget'")
    assert [(owner, json.loads(extra)["key"]) for owner, extra in audit] == [("admin", key)]


def _assert_one_computation(
    deployment: Airflow, scenario: str, run_ids: list[str], builder: str, fence: int
) -> dict[str, Any]:
    """Every run received the artifact that ``builder`` computed: one run computed it (under lease
    ``fence``), every other one waited for it or, on a retry after it was stored, found it."""
    results = _results(deployment, scenario)
    assert sorted(results) == sorted(run_ids)
    expected = {"scenario": scenario, "rows": 42, "built_by": int(builder)}
    assert [r["value"] for r in results.values()] == [expected] * len(run_ids)
    (computed,) = [r for r in results.values() if r["outcome"]["role"] == "computed"]
    waited_on = {computed["outcome"]["owner"], computed["outcome"].get("took_over_from")}
    for result in results.values():
        outcome = result["outcome"]
        assert outcome["key"] == computed["outcome"]["key"] and outcome["token"] == fence, results
        assert outcome["role"] in ("computed", "waited", "hit"), results
        assert outcome["producer"] == computed["outcome"]["owner"], results
        if outcome["role"] == "waited":  # on the producer, or on the holder it took over from
            assert outcome["waited_on"] in waited_on and outcome["deferrals"] >= 1
    return computed

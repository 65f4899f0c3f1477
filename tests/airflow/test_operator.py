"""Reserved operators, called directly with a minimal context against a real SQLite store.

Deferral is exercised end to end without a triggerer: the ``TaskDeferred`` an operator raises carries
the trigger, the test runs that trigger with asyncio, and feeds its event to ``execute_complete``, as
Airflow would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

pytest.importorskip("airflow")

from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import BaseOperator

import dibs
import dibs.events
from dibs_provider._compat import FRAME_DEEP_LINKS, AirflowSkipException, TaskDeferred
from dibs_provider.operators.reserved import (
    OUTCOME_XCOM_KEY,
    ReservedPythonOperator,
    reserved_operator,
    task_owner,
)
from dibs_provider.triggers.reservation import ReservationTrigger
from tests.airflow.compat import dag_bag

KEY = "features"


class Work:
    """A callable that counts its calls (the thing that must run once)."""

    def __init__(self, result: Any = None, error: BaseException | None = None) -> None:
        self.calls = 0
        self.result = {"rows": 3} if result is None else result
        self.error = error

    def __call__(self, day: str = "2024-01-01") -> Any:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return self.result


def operator(work: Callable[..., Any], task_id: str = "t", **kwargs: Any) -> ReservedPythonOperator:
    kwargs.setdefault("reservation_key", KEY)
    return ReservedPythonOperator(task_id=task_id, python_callable=work, **kwargs)


def outcome(context: dict[str, Any]) -> dict[str, Any]:
    value: dict[str, Any] = context["ti"].xcoms[OUTCOME_XCOM_KEY]
    return value


def run_trigger(trigger: ReservationTrigger) -> dict[str, Any]:
    async def first() -> dict[str, Any]:
        payload: dict[str, Any] = (await anext(trigger.run())).payload
        return payload

    return asyncio.run(first())


def event(status: str, **fields: Any) -> dict[str, Any]:
    """A trigger event as ReservationTrigger would fire it (for paths a real trigger rarely takes)."""
    base = {"status": status, "key": "default/features", "holder": "holder", "waited_seconds": 1.0}
    return {**base, "wait_started": time.time(), "deferrals": 1, **fields}


def deferred(op: BaseOperator, context: dict[str, Any], event: Any = None) -> TaskDeferred:
    with pytest.raises(TaskDeferred) as info:
        if event is None:
            op.execute(context)
        else:
            op.execute_complete(context, event=event)  # type: ignore[attr-defined]
    return info.value


# -- the three answers ------------------------------------------------------------------------------------
def test_acquired_runs_the_work_stores_and_returns(client: dibs.Reservations, make_context: Any) -> None:
    work, context = Work(), make_context(run_id="run_1")
    assert operator(work).execute(context) == {"rows": 3}
    assert work.calls == 1
    state = client.status(KEY)
    assert state.artifact is not None and state.artifact.producer == "dag/run_1/t/-1"
    assert outcome(context) == {
        "role": "computed",
        "key": "default/features",
        "owner": "dag/run_1/t/-1",
        "waited_on": None,
        "waited_seconds": 0.0,
        "deferrals": 0,
        "token": state.artifact.fence,
        "producer": "dag/run_1/t/-1",
        "stored": True,
        "took_over_from": None,
    }


def test_hit_returns_the_artifact_and_runs_nothing(client: dibs.Reservations, make_context: Any) -> None:
    first, second = Work(), Work(result={"other": True})
    operator(first).execute(make_context(dag_id="daily", run_id="r1"))
    context = make_context(dag_id="hourly", run_id="r7")
    assert operator(second, task_id="other").execute(context) == {"rows": 3}
    assert second.calls == 0
    assert outcome(context)["role"] == "hit" and outcome(context)["producer"] == "daily/r1/t/-1"


def test_busy_defers_to_a_trigger_without_running(client: dibs.Reservations, make_context: Any) -> None:
    import structlog

    client.get_or_reserve(KEY, owner="other/run/t/-1")
    work, context = Work(), make_context()
    with structlog.testing.capture_logs() as logs:
        deferral = deferred(operator(work, dibs_conn_id="dibs_default"), context)
    (said,) = [e["event"] for e in logs if "deferring" in e["event"]]
    # The lease's attempt number is the key's, and must not read like Airflow's try number.
    assert "held by other/run/t/-1 (lease attempt 1 on this key, expires in" in said
    assert work.calls == 0 and deferral.method_name == "execute_complete"
    classpath, kwargs = deferral.trigger.serialize()
    assert classpath.endswith("ReservationTrigger")
    assert kwargs["key"] == KEY and kwargs["namespace"] == "default" and kwargs["holder"] == "other/run/t/-1"
    assert kwargs["deferrals"] == 1 and kwargs["timeout"] is None and kwargs["for_artifact"] is False


# -- every way back from a deferral ---------------------------------------------------------------------
def test_resume_done_returns_the_artifact(client: dibs.Reservations, make_context: Any) -> None:
    lease = client.get_or_reserve(KEY, owner="holder").lease  # type: ignore[union-attr]
    work, context = Work(), make_context()
    op = operator(work)
    trigger = deferred(op, context).trigger
    lease.complete({"rows": 99})
    assert op.execute_complete(context, event=run_trigger(trigger)) == {"rows": 99}
    assert work.calls == 0
    assert outcome(context)["role"] == "waited" and outcome(context)["waited_on"] == "holder"
    assert outcome(context)["deferrals"] == 1 and outcome(context)["producer"] == "holder"


def test_a_task_s_store_operations_name_airflow_on_both_sides_of_its_deferral(
    client: dibs.Reservations, make_context: Any
) -> None:
    """What the metrics say of each store operation (``dibs.frontend``): the task's asks before and
    after its deferral are Airflow's; the trigger's reads are batched with other waits (they serve no
    one call) and the direct API's complete serves none, so they name no front end (Airflow's Stats
    calls those Airflow's: in its processes, they are)."""
    operations: list[tuple[str, str]] = []

    class Operations:
        kinds = dibs.events.EVERY_KIND

        def __call__(self, event: dibs.Event) -> None:
            if isinstance(event, dibs.StoreOperation):
                operations.append((event.operation, event.frontend))

    def taken() -> list[tuple[str, str]]:
        done = list(operations)
        operations.clear()
        return done

    lease = client.get_or_reserve(KEY, owner="holder").lease  # type: ignore[union-attr]
    work, context = Work(), make_context()
    op = operator(work)
    with contextlib.closing(dibs.observe(Operations())):
        trigger = deferred(op, context).trigger
        assert set(taken()) == {("acquire", "airflow")}
        lease.complete({"rows": 99})
        assert taken() == [("complete", "")]
        event = run_trigger(trigger)
        assert {frontend for _, frontend in taken()} == {""}
        assert op.execute_complete(context, event=event) == {"rows": 99}
        assert set(taken()) == {("acquire", "airflow")}


def test_resume_free_after_a_failure_runs_the_work(client: dibs.Reservations, make_context: Any) -> None:
    lease = client.get_or_reserve(KEY, owner="holder").lease  # type: ignore[union-attr]
    work, context = Work(), make_context()
    op = operator(work)
    trigger = deferred(op, context).trigger
    lease.release(RuntimeError("holder crashed"))
    event = run_trigger(trigger)
    assert event["status"] == "free"
    assert op.execute_complete(context, event=event) == {"rows": 3}
    assert work.calls == 1
    assert outcome(context)["role"] == "computed" and outcome(context)["waited_on"] == "holder"
    assert client.status(KEY).artifact is not None


def test_resume_free_but_another_run_won_defers_again(client: dibs.Reservations, make_context: Any) -> None:
    lease = client.get_or_reserve(KEY, owner="holder").lease  # type: ignore[union-attr]
    work, context = Work(), make_context()
    op = operator(work)
    first = deferred(op, context).trigger
    lease.release("gave up")
    event = run_trigger(first)
    client.get_or_reserve(KEY, owner="faster-run")  # someone else takes the key before this task resumes
    again = deferred(op, context, event=event).trigger.serialize()[1]
    assert work.calls == 0
    assert again["holder"] == "faster-run" and again["deferrals"] == 2
    assert again["wait_started"] == first.serialize()[1]["wait_started"]  # the wait keeps its start


def test_resume_timeout_raises_wait_timeout_naming_the_holder(
    client: dibs.Reservations, make_context: Any
) -> None:
    client.get_or_reserve(KEY, owner="slow-holder")
    op = operator(Work(), reservation_wait_timeout=0.2)
    trigger = deferred(op, make_context()).trigger
    assert 0 < trigger.serialize()[1]["timeout"] <= 0.2  # what is left of the wait timeout
    with pytest.raises(dibs.WaitTimeout, match="slow-holder"):
        op.execute_complete(make_context(), event=run_trigger(trigger))


def test_resume_after_a_timeout_takes_an_artifact_stored_at_the_last_moment(
    client: dibs.Reservations, make_context: Any
) -> None:
    # The resumed task asks once more, as every dibs waiter does when its timeout passes: a result
    # stored after the trigger gave up is used, not thrown away for a WaitTimeout.
    lease = client.get_or_reserve(KEY, owner="slow-holder").lease  # type: ignore[union-attr]
    op, context = operator(Work(), reservation_wait_timeout=0.2), make_context()
    event = run_trigger(deferred(op, context).trigger)
    assert event["status"] == "timeout"
    lease.complete({"rows": 7})
    assert op.execute_complete(context, event=event) == {"rows": 7}
    assert outcome(context)["role"] == "waited" and outcome(context)["deferrals"] == 1


def test_wait_timeout_counts_the_whole_wait_across_deferrals(
    client: dibs.Reservations, make_context: Any
) -> None:
    client.get_or_reserve(KEY, owner="holder")
    ev = event("free", wait_started=time.time() - 100, deferrals=3, state="expired", last_failure=None)
    with pytest.raises(dibs.WaitTimeout, match=r"held by 'holder' \(lease attempt 1 on this key"):
        operator(Work(), reservation_wait_timeout=50).execute_complete(make_context(), event=ev)


def test_resume_error_raises_the_dibs_error(store_url: str, make_context: Any) -> None:
    ev = event("error", error_type="CorruptRecord", message="record is damaged", fields={"key": "default/k"})
    with pytest.raises(dibs.CorruptRecord, match="damaged"):
        operator(Work()).execute_complete(make_context(), event=ev)


def test_a_store_error_from_the_triggerer_fails_the_task_as_the_sensor_does(
    client: dibs.Reservations, make_context: Any
) -> None:
    # The trigger rides a store outage out for the connection's outage_patience before it reports an
    # error: the task then fails with that error, as ReservationSensor does (it used to ask again).
    client.get_or_reserve(KEY, owner="holder").lease.complete("done")  # type: ignore[union-attr]
    ev = event("error", error_type="StoreUnavailable", message="connection reset", fields={})
    work = Work()
    with pytest.raises(dibs.StoreUnavailable, match="connection reset"):
        operator(work).execute_complete(make_context(), event=ev)
    assert work.calls == 0


def test_resume_with_a_foreign_event_fails_clearly(store_url: str, make_context: Any) -> None:
    with pytest.raises(dibs.ReservationError, match="did not fire"):
        operator(Work()).execute_complete(make_context(), event={"status": "success"})


def test_not_deferrable_waits_in_the_worker(
    client: dibs.Reservations, make_context: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    lease = client.get_or_reserve(KEY, owner="holder").lease  # type: ignore[union-attr]
    waiting = threading.Event()
    work, context, result = Work(), make_context(), []
    op = operator(work, reservation_deferrable=False)
    with dibs.observe(lambda e: isinstance(e, dibs.KeyBusy) and waiting.set()):  # about to wait
        worker = threading.Thread(target=lambda: result.append(op.execute(context)))
        worker.start()
        assert waiting.wait(30)
        lease.complete({"rows": 5})
        worker.join(30)
    assert result == [{"rows": 5}] and work.calls == 0
    assert outcome(context)["role"] == "waited" and outcome(context)["waited_on"] == "holder"


# -- holding the lease ----------------------------------------------------------------------------------
def test_failure_releases_with_the_error_recorded(client: dibs.Reservations, make_context: Any) -> None:
    with pytest.raises(ValueError, match="bad day"):
        operator(Work(error=ValueError("bad day"))).execute(make_context())
    state = client.status(KEY)
    assert state.live_lease is None and state.artifact is None
    assert state.failure is not None and "ValueError: bad day" in state.failure.error
    # a waiter takes over at once instead of after the ttl
    assert isinstance(client.get_or_reserve(KEY, owner="next-run"), dibs.Acquired)


def test_skip_releases_without_counting_a_failure(client: dibs.Reservations, make_context: Any) -> None:
    with pytest.raises(AirflowSkipException):
        operator(Work(error=AirflowSkipException("nothing to do"))).execute(make_context())
    state = client.status(KEY)
    assert state.live_lease is None and state.failure is None


def test_a_retry_re_enters_its_own_lease(client: dibs.Reservations, make_context: Any) -> None:
    context = make_context(run_id="r1")
    client.get_or_reserve(KEY, owner=task_owner(context))  # try 1 took the lease, then its worker died
    work = Work()
    assert operator(work).execute(context) == {"rows": 3}  # try 2: same logical task, not busy
    assert work.calls == 1 and outcome(context)["role"] == "computed"


def test_a_fenced_out_holder_still_returns_its_value(client: dibs.Reservations, make_context: Any) -> None:
    def work() -> str:
        client.force_release(KEY)  # our lease is lost while we work...
        client.get_or_reserve(KEY, owner="new-holder")  # ...and someone else takes the key
        return "mine"

    context = make_context()
    assert operator(work).execute(context) == "mine"
    assert outcome(context)["stored"] is False
    assert client.status(KEY).lease.owner == "new-holder"  # type: ignore[union-attr]


def test_an_unstorable_result_is_returned_unshared_and_frees_the_key(
    client: dibs.Reservations, make_context: Any
) -> None:
    context = make_context()
    assert operator(Work(result={1, 2})).execute(context) == {1, 2}  # the task's own result stands
    state = client.status(KEY)
    assert state.live_lease is None and state.artifact is None
    assert state.failure is not None and "SerializationError" in state.failure.error
    assert context["ti"].xcoms["dibs_outcome"]["stored"] is False


def test_an_outcome_that_cannot_be_pushed_fails_the_task(
    client: dibs.Reservations, make_context: Any
) -> None:
    # The dibs_outcome XCom is pushed by the task itself, not by an observer (whose errors are only
    # logged): a task whose XCom backend refuses it fails, as any Airflow task would.
    context = make_context()

    def refuse(key: str, value: Any) -> None:
        raise RuntimeError("the XCom backend is down")

    context["ti"].xcom_push = refuse
    with pytest.raises(RuntimeError, match="XCom backend is down"):
        operator(Work()).execute(context)
    state = client.status(KEY)
    assert state.artifact is not None  # the work's result was stored before the push failed


# -- the store cannot be reached: the connection's policy decides, as for Reservations.run -----------------
UNREACHABLE = "postgresql+psycopg://postgres@127.0.0.1:1/dibs"  # nothing listens on port 1: refused at once


@pytest.fixture
def unreachable_conn(monkeypatch: pytest.MonkeyPatch) -> Callable[..., str]:
    """``unreachable_conn(policy, **extra)``: a dibs connection whose store refuses connections; returns
    its id."""
    pytest.importorskip(
        "psycopg", reason="the unreachable store is a PostgreSQL URL: pip install 'dibs[postgres]'"
    )

    def make(policy: str, **extra: Any) -> str:
        fields = {"store_url": UNREACHABLE, "on_store_unavailable": policy, **extra}
        monkeypatch.setenv("AIRFLOW_CONN_DIBS_DOWN", json.dumps({"conn_type": "dibs", "extra": fields}))
        return "dibs_down"

    return make


def test_store_down_at_the_first_ask_runs_unreserved_under_policy_run(
    unreachable_conn: Callable[[str], str], make_context: Any
) -> None:
    work, context = Work(), make_context()
    assert operator(work, dibs_conn_id=unreachable_conn("run")).execute(context) == {"rows": 3}
    assert work.calls == 1
    said = outcome(context)
    assert (said["role"], said["stored"], said["token"]) == ("unreserved", False, None)
    assert said["key"] == "default/features"


def test_store_down_at_the_first_ask_fails_the_task_under_policy_fail(
    unreachable_conn: Callable[[str], str], make_context: Any
) -> None:
    work = Work()
    with pytest.raises(dibs.StoreUnavailable, match=r"127\.0\.0\.1"):
        operator(work, dibs_conn_id=unreachable_conn("fail")).execute(make_context())
    assert work.calls == 0


def test_a_resumed_task_rides_a_store_outage_out_then_follows_the_policy(
    unreachable_conn: Callable[..., str], make_context: Any
) -> None:
    # A task resumed after its deferral holds nothing: the store down when it asks again is waited for
    # (the connection's outage_patience), and only then does on_store_unavailable decide.
    ev = event("free", state="expired", last_failure=None)
    work, context = Work(), make_context()
    heard: list[str] = []
    conn = unreachable_conn("run", outage_patience=0.3)
    with dibs.observe(lambda e: heard.append(e.name)):
        assert operator(work, dibs_conn_id=conn).execute_complete(context, event=ev) == {"rows": 3}
    assert work.calls == 1 and outcome(context)["role"] == "unreserved"
    assert heard[:2] == ["asked", "store_unreachable"] and "ran_unreserved" in heard


# -- keys ---------------------------------------------------------------------------------------------------
def build(day: str, region: str = "eu", ds: str | None = None, ti: Any = None) -> str:
    return f"{day}-{region}"


def derived(make_context: Any, op_kwargs: dict[str, Any], context: Any = None, **kwargs: Any) -> str:
    kwargs.setdefault("task_id", "t")
    op = ReservedPythonOperator(python_callable=build, op_kwargs=op_kwargs, **kwargs)
    return op.resolve_reservation_key(make_context(**(context or {})))


def test_a_derived_key_is_shown_where_users_look_and_derived_again_by_the_next_call(
    client: dibs.Reservations, make_context: Any
) -> None:
    # Airflow's rendered field and the task's Reservation link show the key a waiting task derived
    # (not null); the same operator object asked again with other inputs derives its key again.
    from dibs_provider.links.reservation import ReservationLink

    op = ReservedPythonOperator(task_id="t", python_callable=build, op_kwargs={"day": "d1"})
    first = op.resolve_reservation_key(make_context())
    client.get_or_reserve(first, owner="other/run/t/-1")
    deferred(op, make_context(run_id="r1"))
    assert op.reservation_key == first and first.startswith("build/")
    assert "reservation_key" in op.template_fields and op.overwrite_rtif_after_execution
    link = ReservationLink().get_link(op, ti_key=None)  # type: ignore[arg-type]
    # the Reservations page at the key, inside Airflow's frame (docs/airflow.md)
    inner = "/dibs/" if FRAME_DEEP_LINKS else ""
    assert link == f"/plugin/dibs{inner}?" + urlencode({"conn": "dibs_default", "key": first})
    assert op.execute(make_context(run_id="r2", ds="2024-05-05")) == "d1-eu"  # ds is an input of build
    assert op.reservation_key != first and op.reservation_key == derived(
        make_context, {"day": "d1"}, context={"ds": "2024-05-05"}
    )


def test_derived_keys_are_shared_by_identical_calls_only(make_context: Any) -> None:
    base = derived(make_context, {"day": "2024-01-01"})
    assert base.startswith("build/")
    assert derived(make_context, {"day": "2024-01-01", "region": "eu"}, task_id="other") == base  # defaults
    assert derived(make_context, {"day": "2024-01-01"}, context={"dag_id": "other", "run_id": "x"}) == base
    assert derived(make_context, {"day": "2024-01-02"}) != base
    assert (
        derived(make_context, {"day": "2024-01-01"}, context={"ds": "2024-02-02"}) != base
    )  # ds is an input
    assert derived(make_context, {"day": "2024-01-01"}, reservation_version="2") != base
    assert derived(make_context, {"day": "2024-01-01"}, reservation_exclude=["ds"]) == derived(
        make_context, {"day": "2024-01-01"}, reservation_exclude=["ds"], context={"ds": "2030-01-01"}
    )


def test_an_underivable_argument_asks_for_an_explicit_key(make_context: Any) -> None:
    with pytest.raises(dibs.InvalidKey, match=r"^t: cannot derive a key for build.*reservation_key="):
        derived(make_context, {"day": object()})


def test_the_key_is_templated(make_context: Any) -> None:
    op = operator(Work(), reservation_key="features-{{ ds }}")
    context = make_context(ds="2024-03-04")
    op.render_template_fields(context)  # type: ignore[arg-type]
    assert op.resolve_reservation_key(context) == "features-2024-03-04"


# -- any operator ---------------------------------------------------------------------------------------
def test_reserved_operator_wraps_an_existing_operator(
    client: dibs.Reservations, make_context: Any, tmp_path: Path
) -> None:
    ReservedBash = reserved_operator(BashOperator)
    assert (
        reserved_operator(BashOperator) is ReservedBash and "reservation_key" in ReservedBash.template_fields
    )
    runs = tmp_path / "runs.txt"
    command = f"echo ran >> {runs}; echo artifact-value"
    first, second = make_context(run_id="r1"), make_context(dag_id="other", run_id="r2")
    assert ReservedBash(task_id="a", bash_command=command).execute(first) == "artifact-value"
    assert ReservedBash(task_id="b", bash_command=command).execute(second) == "artifact-value"
    assert runs.read_text().splitlines() == ["ran"]
    assert outcome(first)["key"].startswith("default/BashOperator/")
    assert outcome(second)["role"] == "hit"


class _DeferringOperator(BaseOperator):
    def execute(self, context: Any) -> None:
        self.defer(trigger=ReservationTrigger("elsewhere"), method_name="execute")


def test_a_wrapped_operator_that_defers_is_refused_and_the_key_freed(
    client: dibs.Reservations, make_context: Any
) -> None:
    op = reserved_operator(_DeferringOperator)(task_id="d", reservation_key=KEY)
    with pytest.raises(dibs.ConfigurationError, match="deferrable=False"):
        op.execute(make_context())
    assert client.status(KEY).live_lease is None


# -- the same DAG at two paths ------------------------------------------------------------------------
_KEYED_DAG = """
from airflow.sdk import dag, task


@dag(schedule=None, dag_id="keyed")
def keyed():
    @task.reserved
    def build(day: str) -> str:
        return day.upper()  # COMMENT

    build("2026-11-25")


keyed()
"""


def _key_of_build(folder: Path, source: str, make_context: Any) -> str:
    """Parse a DAG file the way Airflow does (its module is named after the file's path) and derive the
    key of its reserved task."""
    folder.mkdir(parents=True)
    (folder / "keyed.py").write_text(source)
    bag = dag_bag(str(folder))
    assert not bag.import_errors, bag.import_errors
    op = bag.dags["keyed"].get_task("build")
    return str(op.resolve_reservation_key(make_context()))


def test_the_same_dag_source_at_two_paths_shares_one_key(tmp_path: Path, make_context: Any) -> None:
    # A versioned bundle checks each commit out to its own folder: a commit that changed only a
    # comment must not make every task compute again; a commit that changed the code must.
    first = _key_of_build(tmp_path / "bundle" / "commit-1", _KEYED_DAG, make_context)
    moved = _key_of_build(
        tmp_path / "elsewhere" / "commit-2", _KEYED_DAG.replace("COMMENT", "edited"), make_context
    )
    changed = _key_of_build(
        tmp_path / "bundle" / "commit-3", _KEYED_DAG.replace("day.upper()", "day.lower()"), make_context
    )
    assert first.startswith("keyed.build/")  # defined inside the DAG function
    assert moved == first
    assert changed != first


# -- stopping --------------------------------------------------------------------------------------------
class _WorkUntilKilled(BaseOperator):
    """Work that runs until its own ``on_kill`` stops it, then fails, as a BashOperator's command does."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.started = threading.Event()
        self.stopped = threading.Event()

    def execute(self, context: Any) -> str:
        self.started.set()
        if not self.stopped.wait(60):
            raise TimeoutError("never killed")
        raise RuntimeError("the command was terminated")

    def on_kill(self) -> None:
        self.stopped.set()


def test_on_kill_releases_the_key_at_once_and_stops_the_wrapped_work(
    client: dibs.Reservations, make_context: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import structlog

    from dibs_provider.operators._stopping import KILLED_FAILURE

    holder = reserved_operator(_WorkUntilKilled)(task_id="h", reservation_key=KEY, reservation_ttl=600)
    failures: list[BaseException] = []

    def run_holder() -> None:
        try:
            holder.execute(make_context(run_id="r1", task_id="h"))
        except BaseException as exc:
            failures.append(exc)

    # A second run's reserved task waits in its worker for the same key, holding nothing.
    waiting = threading.Event()
    finding_it_busy = dibs.observe(lambda e: isinstance(e, dibs.KeyBusy) and waiting.set())
    work, waiter_context, waiter_result = Work(), make_context(run_id="r2"), []
    waiter = operator(work, reservation_deferrable=False)

    with structlog.testing.capture_logs() as logs:
        holder_thread = threading.Thread(target=run_holder)
        holder_thread.start()
        assert holder.started.wait(30)  # the holder's work runs under its lease (ttl 600 s)
        waiter_thread = threading.Thread(target=lambda: waiter_result.append(waiter.execute(waiter_context)))
        waiter_thread.start()
        assert waiting.wait(30)
        holder.on_kill()  # what the task runner's SIGTERM handler calls, here from another thread
        holder_thread.join(30)
        waiter_thread.join(30)
    finding_it_busy.close()

    # The wrapped operator's own on_kill stopped its work, and the task failed with that work's error.
    assert [str(e) for e in failures] == ["the command was terminated"]
    # The waiter got the key at once: released with the kill recorded, not expired (its ttl is 600 s).
    assert waiter_result == [{"rows": 3}] and work.calls == 1
    result = outcome(waiter_context)
    assert result["role"] == "computed" and result["took_over_from"] is None
    assert result["waited_on"] == "dag/r1/h/-1" and result["token"] == 2
    state = client.status(KEY)
    assert state.failure is not None and state.failure.error == KILLED_FAILURE
    # Recorded so the waiter can say why, but a kill is a stop, not a failure: max_failures ignores it.
    assert state.failure.owner == "dag/r1/h/-1" and state.failure.count == 0
    # Quiet: one line says what on_kill did; the hold loop's own release afterwards says nothing.
    warnings = [
        e["event"]
        for e in logs
        if e["log_level"] in ("warning", "error")
        and "outside of the Task Runner" not in e["event"]  # Airflow's note on calling execute directly
    ]
    assert len(warnings) == 1 and "the task was killed: released default/features" in warnings[0]
    # The waiter that took the key says its last holder was stopped, not that it failed 0 times.
    (before,) = [e["event"] for e in logs if "before" in e["event"] and "default/features" in e["event"]]
    assert before == (
        f"dibs: default/features was stopped before: its last holder, 'dag/r1/h/-1', was {KILLED_FAILURE}"
    ), before


def test_on_kill_without_a_held_lease_only_stops_the_wrapped_operator(
    client: dibs.Reservations, make_context: Any
) -> None:
    op = reserved_operator(_WorkUntilKilled)(task_id="idle", reservation_key=KEY)
    op.on_kill()  # e.g. killed while deferred: nothing is held
    assert op.stopped.is_set()
    assert client.status(KEY).status == "free"

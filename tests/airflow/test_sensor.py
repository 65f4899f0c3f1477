"""ReservationSensor: pokes once, defers until the artifact exists, never computes."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

pytest.importorskip("airflow")

from airflow.sdk import PokeReturnValue

import dibs
from dibs_provider._compat import AirflowSensorTimeout, AirflowSkipException, TaskDeferred
from dibs_provider.sensors.reservation import ReservationSensor
from dibs_provider.triggers.reservation import ReservationTrigger


def run_trigger(trigger: ReservationTrigger) -> dict[str, Any]:
    async def first() -> dict[str, Any]:
        payload: dict[str, Any] = (await anext(trigger.run())).payload
        return payload

    return asyncio.run(first())


def test_returns_the_artifact_at_once_when_it_exists(client: dibs.Reservations, make_context: Any) -> None:
    client.get_or_reserve("model", owner="trainer").lease.complete({"auc": 0.9})  # type: ignore[union-attr]
    assert ReservationSensor(task_id="s", key="model").execute(make_context()) == {"auc": 0.9}


def test_defers_then_returns_the_artifact_once_stored(client: dibs.Reservations, make_context: Any) -> None:
    lease = client.get_or_reserve("model", owner="trainer").lease  # type: ignore[union-attr]
    sensor = ReservationSensor(task_id="s", key="model", timeout=600)
    with pytest.raises(TaskDeferred) as info:
        sensor.execute(make_context())
    kwargs = info.value.trigger.serialize()[1]
    assert kwargs["for_artifact"] is True and 0 < kwargs["timeout"] <= 600
    assert info.value.timeout is not None  # Airflow's own deadline as a backstop
    lease.complete({"auc": 0.8})
    event = run_trigger(info.value.trigger)
    assert sensor.execute_complete(make_context(), event=event) == {"auc": 0.8}
    assert (
        client.status("model").artifact is not None and client.status("model").artifact.producer == "trainer"
    )  # type: ignore[union-attr]


def test_a_freed_key_does_not_end_the_wait(client: dibs.Reservations, make_context: Any) -> None:
    # The producer failed: a sensor must not compute it, only keep waiting (here: until its timeout).
    client.get_or_reserve("model", owner="trainer").lease.release(RuntimeError("oom"))  # type: ignore[union-attr]
    sensor = ReservationSensor(task_id="s", key="model", timeout=0.2)
    with pytest.raises(TaskDeferred) as info:
        sensor.execute(make_context())
    event = run_trigger(info.value.trigger)
    assert event["status"] == "timeout"
    with pytest.raises(AirflowSensorTimeout, match="model"):
        sensor.execute_complete(make_context(), event=event)


def test_a_timeout_in_the_triggerer_honours_soft_fail(store_url: str, make_context: Any) -> None:
    sensor = ReservationSensor(task_id="s", key="model", timeout=60, soft_fail=True)
    # The trigger the sensor defers to, with a short timeout of its own: its timeout event, whenever
    # the machine gets to it, skips the sensor (the first poke's own time is the next test's).
    trigger = ReservationTrigger("model", for_artifact=True, timeout=0.2, wait_started=time.time())
    event = run_trigger(trigger)
    assert event["status"] == "timeout"
    with pytest.raises(AirflowSkipException):
        sensor.resume_execution("execute_complete", {"event": event}, make_context())  # type: ignore[arg-type]


@pytest.mark.parametrize("soft_fail", [True, False])
def test_a_first_poke_that_outlasts_the_timeout_honours_soft_fail(
    store_url: str, make_context: Any, soft_fail: bool
) -> None:
    """A poke slower than the whole timeout (a busy worker, a slow store) used to fail the sensor
    from ``execute``, where Airflow's own ``soft_fail`` handling does not reach: it skips now."""
    sensor = ReservationSensor(task_id="s", key="model", timeout=1, soft_fail=soft_fail)
    started_long_ago = time.time() - 10  # the first poke ended ten seconds after the sensor started
    with pytest.raises(AirflowSkipException if soft_fail else AirflowSensorTimeout, match="no artifact"):
        sensor._poke_or_defer(make_context(), wait_started=started_long_ago, deferrals=0)


def test_a_poke_during_a_store_outage_is_not_done_yet(
    make_context: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sensor holds nothing: a store that cannot be reached is "not yet" (the trigger it defers to
    rides the outage out), never a failed task. The store here refuses every connection."""
    pytest.importorskip("psycopg")
    conn = {"conn_type": "dibs", "extra": {"store_url": "postgresql+psycopg://postgres@127.0.0.1:1/x"}}
    monkeypatch.setenv("AIRFLOW_CONN_DIBS_DOWN", json.dumps(conn))
    sensor = ReservationSensor(task_id="s", key="model", dibs_conn_id="dibs_down", deferrable=False)
    assert sensor.poke(make_context()) is False
    deferring = ReservationSensor(task_id="s", key="model", dibs_conn_id="dibs_down", timeout=60)
    with pytest.raises(TaskDeferred):
        deferring.execute(make_context())


def test_classic_poke_mode(client: dibs.Reservations, make_context: Any) -> None:
    sensor = ReservationSensor(task_id="s", key="model", deferrable=False)
    assert sensor.poke(make_context()) is False
    client.get_or_reserve("model", owner="trainer").lease.complete([1])  # type: ignore[union-attr]
    poked = sensor.poke(make_context())
    assert isinstance(poked, PokeReturnValue) and poked.is_done and poked.xcom_value == [1]


def test_key_and_namespace_are_templated(make_context: Any) -> None:
    sensor = ReservationSensor(task_id="s", key="model-{{ ds }}", namespace="team.{{ params.team }}")
    context = make_context(ds="2024-05-06", params={"team": "ml"})
    sensor.render_template_fields(context)  # type: ignore[arg-type]
    assert (sensor.key, sensor.namespace) == ("model-2024-05-06", "team.ml")

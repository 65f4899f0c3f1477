"""ReservationSensor: pokes once, defers until the artifact exists, never computes."""

from __future__ import annotations

import asyncio
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


def test_timeout_honours_soft_fail(store_url: str, make_context: Any) -> None:
    sensor = ReservationSensor(task_id="s", key="model", timeout=0.2, soft_fail=True)
    with pytest.raises(TaskDeferred) as info:
        sensor.execute(make_context())
    event = run_trigger(info.value.trigger)
    with pytest.raises(AirflowSkipException):
        sensor.resume_execution("execute_complete", {"event": event}, make_context())  # type: ignore[arg-type]


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

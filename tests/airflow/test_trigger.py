"""ReservationTrigger: serialization, and run() against a real SQLite store, driven with asyncio.

Every scenario has one possible event whatever the interleaving (a key completed before or after the
trigger starts watching is ``done`` either way), so nothing here depends on timing.
"""

from __future__ import annotations

import asyncio
import json
import pickle
from typing import Any

import pytest

pytest.importorskip("airflow")

from airflow.sdk.module_loading import import_string

import dibs
from dibs import errors
from dibs_provider._compat import TaskDeferred
from dibs_provider.triggers.reservation import (
    ReservationTrigger,
    error_from_event,
    parse_event,
)


def event(status: str, **fields: Any) -> dict[str, Any]:
    """A payload shaped like the trigger's, for the mapping and validation tests."""
    base = {"status": status, "key": "default/k", "holder": None, "waited_seconds": 0.0}
    return {**base, "wait_started": 1.0, "deferrals": 1, **fields}


def first_event(trigger: ReservationTrigger, while_waiting: Any = None) -> dict[str, Any]:
    """Run the trigger to its first event, doing ``while_waiting()`` (in a thread) meanwhile."""

    async def scenario() -> dict[str, Any]:
        watching = asyncio.ensure_future(anext(trigger.run()))
        if while_waiting is not None:
            await asyncio.to_thread(while_waiting)
        event = await watching
        payload: dict[str, Any] = event.payload
        return payload

    return asyncio.run(scenario())


def test_serialize_round_trips_through_the_class_path() -> None:
    trigger = ReservationTrigger(
        "features-2024-01-01",
        namespace="team.x",
        dibs_conn_id="dibs_other",
        for_artifact=True,
        timeout=12.5,
        holder="dag/run/t/-1",
        wait_started=1700000000.0,
        deferrals=2,
    )
    classpath, kwargs = trigger.serialize()
    assert classpath == "dibs_provider.triggers.reservation.ReservationTrigger"
    rebuilt = import_string(classpath)(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)
    assert pickle.loads(pickle.dumps(kwargs)) == kwargs  # plain data only: it is stored in Airflow's DB


def test_fires_done_when_the_artifact_already_exists(client: dibs.Reservations) -> None:
    lease = client.get_or_reserve("k", owner="producer").lease  # type: ignore[union-attr]
    lease.complete({"v": 1})
    fired = first_event(ReservationTrigger("k", holder="producer", wait_started=100.0, deferrals=1))
    assert fired["status"] == "done"
    assert (fired["producer"], fired["token"], fired["key"]) == ("producer", lease.token, "default/k")
    assert (fired["wait_started"], fired["deferrals"], fired["holder"]) == (100.0, 1, "producer")
    assert "value" not in fired  # the artifact is read by the task, never carried in the event


def test_fires_done_when_the_holder_completes_while_it_watches(client: dibs.Reservations) -> None:
    lease = client.get_or_reserve("k", owner="producer").lease  # type: ignore[union-attr]
    fired = first_event(ReservationTrigger("k"), while_waiting=lambda: lease.complete([1, 2]))
    assert fired["status"] == "done" and fired["token"] == lease.token


def test_fires_free_with_the_failure_when_the_holder_releases(client: dibs.Reservations) -> None:
    lease = client.get_or_reserve("k", owner="producer").lease  # type: ignore[union-attr]
    fired = first_event(
        ReservationTrigger("k", holder="producer"),
        while_waiting=lambda: lease.release(ValueError("bad input")),
    )
    assert fired["status"] == "free" and fired["state"] == "failed"
    assert "ValueError: bad input" in fired["last_failure"]


def test_fires_free_when_the_holder_lease_expires(store_url: str) -> None:
    # A holder that never heartbeats: its short lease expires on the store's clock and the key is free.
    with dibs.Reservations(store_url, ttl=0.3) as short:
        assert isinstance(short.get_or_reserve("k", owner="crashed"), dibs.Acquired)
        fired = first_event(ReservationTrigger("k", holder="crashed"))
    assert fired["status"] == "free" and fired["state"] == "expired" and fired["last_failure"] is None


def test_fires_timeout_naming_the_holder(client: dibs.Reservations) -> None:
    client.get_or_reserve("k", owner="slow-holder")
    fired = first_event(ReservationTrigger("k", timeout=0.2))
    assert fired["status"] == "timeout" and fired["error_type"] == "WaitTimeout"
    assert fired["fields"]["holder"] == "slow-holder"
    error = error_from_event(parse_event(fired))
    assert isinstance(error, dibs.WaitTimeout) and error.holder == "slow-holder"  # type: ignore[attr-defined]
    assert "slow-holder" in str(error)


def test_for_artifact_ignores_a_free_key(client: dibs.Reservations) -> None:
    # Nobody holds the key: a task would run it, but a sensor waits for an artifact only.
    fired = first_event(ReservationTrigger("k", for_artifact=True, timeout=0.2))
    assert fired["status"] == "timeout"


def test_fires_typed_error_for_an_invalid_key(store_url: str) -> None:
    fired = first_event(ReservationTrigger("bad\x00key"))
    assert fired["status"] == "error" and fired["error_type"] == "InvalidKey"
    assert isinstance(error_from_event(parse_event(fired)), errors.InvalidKey)


def test_fires_typed_error_for_a_bad_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_DIBS_BROKEN", '{"conn_type": "dibs", "extra": {"ttl": "never"}}')
    fired = first_event(ReservationTrigger("k", dibs_conn_id="dibs_broken"))
    assert fired["status"] == "error" and fired["error_type"] == "ConfigurationError"
    error = error_from_event(parse_event(fired))
    assert isinstance(error, dibs.ConfigurationError) and "'ttl'" in str(error)


@pytest.mark.parametrize("name", errors.__all__)
def test_every_dibs_error_maps_back_to_its_class(name: str) -> None:
    error = error_from_event(parse_event(event("error", error_type=name, message="m", fields={})))
    assert type(error) is getattr(errors, name) and str(error) == "m"


def test_unknown_error_types_map_to_the_base_class() -> None:
    parsed = parse_event(event("error", error_type="os.system", message="m"))
    assert type(error_from_event(parsed)) is errors.ReservationError


@pytest.mark.parametrize(
    "payload",
    [
        None,
        "done",
        {"status": "done"},
        event("maybe"),
        event("done", deferrals="1"),
        event("free", wait_started=None),
    ],
)
def test_malformed_events_are_rejected_clearly(payload: Any) -> None:
    with pytest.raises(errors.ReservationError, match="ReservationTrigger did not fire"):
        parse_event(payload)


def _until(condition: Any, what: str, bound: float = 30.0) -> None:
    """Poll ``condition`` (from the scenario's thread) until it holds; fail after ``bound`` seconds."""
    import time

    deadline = time.monotonic() + bound
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


def test_logs_the_key_its_holder_and_expiry_at_start_and_when_the_holder_changes(store_url: str) -> None:
    # What a deferred task's log says while it waits: the key, who holds it and until when, and the new
    # holder when one takes over from an expired lease (for_artifact keeps the trigger watching).
    import structlog

    def said(*parts: str) -> list[str]:
        messages = [str(entry["event"]) for entry in list(logs)]
        return [m for m in messages if all(part in m for part in parts)]

    with (
        structlog.testing.capture_logs() as logs,
        dibs.Reservations(store_url, ttl=0.5) as short,
        dibs.Reservations(store_url, ttl=30) as other,
    ):
        first = short.get_or_reserve("k", owner="dag/run_1/t/-1")
        assert isinstance(first, dibs.Acquired)

        def take_over_then_complete() -> None:
            _until(lambda: said("waiting on default/k", "held by dag/run_1/t/-1"), "the first log line")
            _until(lambda: short.status("k").status == "expired", "the first lease to expire")
            second = other.get_or_reserve("k", owner="dag/run_2/t/-1")
            assert isinstance(second, dibs.Acquired) and second.took_over_from == "dag/run_1/t/-1"
            _until(lambda: said("now waiting on default/k", "held by dag/run_2/t/-1"), "the new holder")
            second.lease.complete({"v": 2})

        fired = first_event(ReservationTrigger("k", for_artifact=True), take_over_then_complete)

    assert fired["status"] == "done" and fired["producer"] == "dag/run_2/t/-1"
    (start,) = said("waiting on default/k", "held by dag/run_1/t/-1")
    assert "(token 1)" in start and "the lease expires at 20" in start and "unless renewed" in start
    # The store too, in the trigger's own first line: its settings may have been parsed (and logged)
    # once for every trigger that started with them, in another task's log.
    assert "waiting on default/k in " in start and "(from " in start
    (later,) = said("now waiting on default/k", "held by dag/run_2/t/-1 (token 2)")
    assert " in " not in later.split(", held by")[0]  # named once, not in every line
    assert len(said("held by")) == 2  # said once per holder, not at every read


# -- the connection a task hands its trigger -------------------------------------------------------------
def test_a_trigger_given_its_tasks_connection_never_looks_it_up(
    monkeypatch: pytest.MonkeyPatch, client: dibs.Reservations, make_context: Any
) -> None:
    # The task reads its connection and defers; the trigger waits with that very connection, even
    # once nothing would answer a lookup of it (the triggerer's first lookup of a connection kept in
    # the metadata database starts Airflow's in-process API, and stalls: docs/airflow.md).
    from dibs_provider.operators.reserved import ReservedPythonOperator

    store = {"conn_type": "dibs", "extra": {"store_url": client.store.url, "namespace": "team.x"}}
    monkeypatch.setenv("AIRFLOW_CONN_DIBS_HANDED", json.dumps(store))
    with dibs.Reservations(client.store.url, namespace="team.x") as team:
        lease = team.get_or_reserve("k", owner="producer").lease  # type: ignore[union-attr]
        task = ReservedPythonOperator(
            task_id="t", python_callable=lambda: 1, reservation_key="k", dibs_conn_id="dibs_handed"
        )
        with pytest.raises(TaskDeferred) as deferral:
            task.execute(make_context())
        trigger = deferral.value.trigger
        connection = trigger.serialize()[1]["connection"]
        assert connection["conn_type"] == "dibs" and json.loads(connection["extra"]) == store["extra"]

        monkeypatch.delenv("AIRFLOW_CONN_DIBS_HANDED")  # a lookup now fails: 'dibs_handed' is not defined
        rebuilt = import_string(trigger.serialize()[0])(**trigger.serialize()[1])
        fired = first_event(rebuilt, while_waiting=lambda: lease.complete({"v": 1}))
    assert fired["status"] == "done" and fired["key"] == "team.x/k" and fired["producer"] == "producer"


def test_a_secret_reaches_the_trigger_only_where_airflow_keeps_trigger_arguments_to_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dibs_provider.hooks import dibs as hooks

    with_password = {"conn_type": "dibs", "password": "pw-4d1b", "extra": {"store_url": "redis://db:6379/0"}}
    in_the_url = {"conn_type": "dibs", "extra": {"store_url": "redis://:pw-4d1b@db:6379/0"}}
    plain = {"conn_type": "dibs", "extra": {"store_url": "redis://db:6379/0", "namespace": "team.x"}}
    for conn_id, value in (("with_password", with_password), ("in_the_url", in_the_url), ("plain", plain)):
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(value))

    # Airflow 3.3+: trigger arguments are encrypted at rest and never shown by its API.
    monkeypatch.setattr(hooks, "TRIGGER_KWARGS_PRIVATE", True)
    assert hooks.DibsHook("with_password").for_trigger()["password"] == "pw-4d1b"  # type: ignore[index]
    # Before 3.3, any Viewer read them through the REST API: a secret stays with the connection, and
    # the trigger looks it up; a connection without one is still handed over.
    monkeypatch.setattr(hooks, "TRIGGER_KWARGS_PRIVATE", False)
    assert hooks.DibsHook("with_password").for_trigger() is None
    assert hooks.DibsHook("in_the_url").for_trigger() is None
    handed = hooks.DibsHook("plain").for_trigger()
    assert handed is not None and json.loads(handed["extra"]) == plain["extra"]
    assert hooks.DibsHook().for_trigger() == {}  # no dibs_default: the trigger falls back without a lookup

    # The trigger's own log lines never show it: repr leaves the connection out, and the trigger
    # masks its secrets as a lookup would have.
    trigger = ReservationTrigger("k", connection={"conn_type": "dibs", "password": "pw-4d1b"})
    assert "pw-4d1b" not in repr(trigger) and "<as its task read it>" in repr(trigger)


def test_the_trigger_masks_the_secrets_of_the_connection_it_was_given(store_url: str) -> None:
    try:
        from airflow.sdk._shared.secrets_masker import redact
    except ImportError:  # Airflow before 3.2 keeps the masker here
        from airflow.sdk.execution_time.secrets_masker import redact  # type: ignore[no-redef]

    from dibs_provider.hooks.dibs import DibsHook

    given = {"conn_type": "dibs", "extra": json.dumps({"store_url": store_url, "payloads_url": "file:///x"})}
    settings = asyncio.run(DibsHook("dibs_given").aget_settings(given))
    assert settings.store_url == store_url and settings.payloads_url == "file:///x"
    secret = {"conn_type": "dibs", "password": "pw-91c7e", "extra": json.dumps({"store_url": "redis://db/0"})}
    settings = asyncio.run(DibsHook("dibs_secret").aget_settings(secret))
    assert settings.store_url == "redis://:pw-91c7e@db/0"
    assert redact("connecting with pw-91c7e") == "connecting with ***"


def test_airflow_imports_the_trigger_without_dibs_which_run_imports_off_the_loop() -> None:
    # Airflow imports a trigger's class on the triggerer's event loop: importing dibs there held every
    # other trigger up for a few tenths of a second ("the async thread was blocked").
    import subprocess
    import sys

    probe = (
        "import sys, airflow.triggers.base\n"
        "import dibs_provider.triggers.reservation as t\n"
        "assert not [m for m in sys.modules if m == 'dibs' or m.startswith('dibs.')], 'dibs imported'\n"
        "print(t.ReservationTrigger('k').serialize()[0])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], check=False, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("dibs_provider.triggers.reservation.ReservationTrigger")

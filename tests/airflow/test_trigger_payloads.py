"""The triggerer never loads a payload: ReservationTrigger waits for the artifact's record only.

A task deferred on a key whose artifact lives in a payload store is run end to end, against a real
store (SQLite and PostgreSQL) and a real payload store (dibs's fsspec one, on a local file system
that records every file it opens for reading and every stat): the trigger's ``run()`` fires ``done``
with the token and producer, having opened no payload; the resumed task then gets the value (one read)
or, where references travel through XCom, the reference (no read).
"""

from __future__ import annotations

import asyncio
import importlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

pytest.importorskip("airflow")

import fsspec  # type: ignore[import-untyped]
from fsspec.implementations.local import LocalFileSystem  # type: ignore[import-untyped]

import dibs
from dibs.payloads import ReferencedArtifact
from dibs.runtime import runtime
from dibs_provider._compat import TaskDeferred
from dibs_provider.operators.reserved import ReservedPythonOperator
from dibs_provider.triggers.reservation import ReservationTrigger
from dibs_provider.xcom import is_reference, resolve

BIG = "y" * 100_000  # above the 64 KiB inline limit: kept in the payload store
KEY = "export"


class _Watched(LocalFileSystem):  # type: ignore[misc]
    """The local file system under a protocol of its own, recording the files it opens for reading
    and the ones it is asked about (a stat), so the tests see every payload access."""

    protocol = ("dibs-watched",)
    opened: ClassVar[list[str]] = []
    stated: ClassVar[list[str]] = []

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, str) and path.startswith("dibs-watched://"):
            path = path.removeprefix("dibs-watched://")
        return super()._strip_protocol(path)

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if "r" in mode:
            self.opened.append(path)
        return super()._open(path, mode, **kwargs)

    def info(self, path: Any, **kwargs: Any) -> Any:
        self.stated.append(str(path))
        return super().info(path, **kwargs)


@pytest.fixture(params=["sqlite", "postgres"])
def records(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An isolated record store, what a task without a ``dibs_default`` connection uses."""
    backend = importlib.import_module(f"tests.backends.{request.param}")
    with backend.isolated_url(tmp_path) as url:
        monkeypatch.setenv("DIBS_STORE_URL", url)
        yield url


@pytest.fixture
def watched(records: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> type[_Watched]:
    """The payload store on :class:`_Watched` for every client of the test (``DIBS_PAYLOADS_URL``)."""
    fsspec.register_implementation("dibs-watched", _Watched, clobber=True)
    monkeypatch.setenv("DIBS_PAYLOADS_URL", f"dibs-watched://{tmp_path / 'payloads'}")
    _Watched.opened.clear()
    _Watched.stated.clear()
    return _Watched


def _task(value: Any = "never", task_id: str = "t") -> ReservedPythonOperator:
    return ReservedPythonOperator(task_id=task_id, python_callable=lambda: value, reservation_key=KEY)


def _deferred(op: ReservedPythonOperator, context: Any) -> ReservationTrigger:
    with pytest.raises(TaskDeferred) as info:
        op.execute(context)
    trigger = info.value.trigger
    assert isinstance(trigger, ReservationTrigger)
    return trigger


def _first_event(
    trigger: ReservationTrigger, while_waiting: Callable[[], Any] | None = None
) -> dict[str, Any]:
    """The trigger's first event, doing ``while_waiting()`` (in a thread) once it watches the key."""

    async def scenario() -> dict[str, Any]:
        watching = asyncio.ensure_future(anext(trigger.run()))
        if while_waiting is not None:
            await asyncio.to_thread(while_waiting)
        payload: dict[str, Any] = (await watching).payload
        return payload

    return asyncio.run(scenario())


def _trigger_watching(records: str) -> bool:
    """Wait (a little) until some waiter of this process follows the store's records: the trigger has
    read the key busy and subscribed, so what follows reaches it through the watch hub."""
    with dibs.Reservations(records) as probe:
        hub = runtime().hub(probe.store)
        for _ in range(500):
            if hub is None or hub.waiters:
                return True
            time.sleep(0.01)
    return False


def _holder(records: str) -> dibs.Reservations:
    return dibs.Reservations(records, ttl=30)  # DIBS_PAYLOADS_URL: the writers' payload store


def test_the_trigger_fires_done_without_opening_the_payload_and_the_task_gets_the_value(
    watched: type[_Watched], records: str, make_context: Any
) -> None:
    with _holder(records) as holder:
        lease = holder.get_or_reserve(KEY, owner="producer").lease  # type: ignore[union-attr]
        context = make_context()
        op = _task()
        trigger = _deferred(op, context)

        def complete() -> None:
            assert _trigger_watching(records)
            lease.complete(BIG)

        fired = _first_event(trigger, complete)
        assert watched.opened == []  # the triggerer never opened the payload
        assert fired["status"] == "done"
        assert (fired["token"], fired["producer"], fired["key"]) == (
            lease.token,
            "producer",
            f"default/{KEY}",
        )
        assert "value" not in fired and len(repr(fired)) < 1000
        assert op.execute_complete(context, event=fired) == BIG  # the resumed task reads the value
        assert len(watched.opened) == 1


def test_an_artifact_already_there_is_not_opened_either(
    watched: type[_Watched], records: str, make_context: Any
) -> None:
    with _holder(records) as holder:
        holder.run(KEY, lambda: BIG)
    watched.opened.clear()
    fired = _first_event(ReservationTrigger(KEY, holder="producer"))
    assert fired["status"] == "done" and watched.opened == []
    assert _task().execute_complete(make_context(), event=fired) == BIG


def test_where_references_travel_through_xcom_neither_the_trigger_nor_the_task_opens_it(
    watched: type[_Watched], records: str, make_context: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__CORE__XCOM_BACKEND", "dibs_provider.xcom.DibsXComBackend")
    with _holder(records) as holder:
        lease = holder.get_or_reserve(KEY, owner="producer").lease  # type: ignore[union-attr]
        context = make_context()
        op = _task()
        trigger = _deferred(op, context)
        fired = _first_event(trigger, lambda: lease.complete(BIG))
    assert fired["status"] == "done"
    returned = op.execute_complete(context, event=fired)
    assert is_reference(returned) and watched.opened == []
    assert resolve(returned) == BIG and len(watched.opened) == 1  # the downstream reader reads it


def test_a_sensor_style_wait_for_a_missing_payload_does_not_fire_done(
    watched: type[_Watched], records: str, tmp_path: Path
) -> None:
    """The record-only wait still checks the payload is there whole: a missing one is a miss."""
    with _holder(records) as holder:
        holder.run(KEY, lambda: BIG)
    for payload in (tmp_path / "payloads").rglob("*"):
        if payload.is_file():
            payload.unlink()
    fired = _first_event(ReservationTrigger(KEY, for_artifact=True, timeout=0.5))
    assert fired["status"] == "timeout" and watched.opened == []


def test_record_only_waiters_share_the_hub_of_the_loading_clients(
    watched: type[_Watched], records: str
) -> None:
    """The trigger reads through the unread twin of its client's store, which follows the same
    records: one watch hub (one feed, one listening connection) for both."""
    from dibs.payloads import unread

    with _holder(records) as client:
        twin = unread(client.store, "size")
        assert twin is not client.store
        assert runtime().hub(twin) is runtime().hub(client.store)


def test_without_a_payload_store_the_trigger_and_the_task_work_as_before(
    store_url: str, make_context: Any
) -> None:
    with dibs.Reservations(store_url, ttl=30) as holder:
        lease = holder.get_or_reserve(KEY, owner="producer").lease  # type: ignore[union-attr]
        context = make_context()
        op = _task()
        trigger = _deferred(op, context)
        fired = _first_event(trigger, lambda: lease.complete({"rows": 7}))
    assert fired["status"] == "done" and fired["token"] == lease.token and fired["producer"] == "producer"
    assert op.execute_complete(context, event=fired) == {"rows": 7}


def test_the_core_record_only_wait_hands_back_the_record(watched: type[_Watched], records: str) -> None:
    with _holder(records) as client:
        client.run(KEY, lambda: BIG)
        watched.opened.clear()
        hit = client.wait(KEY, decode=False)
        assert hit is not None and isinstance(hit.value, ReferencedArtifact) and watched.opened == []
        assert (hit.token, hit.size) == (hit.value.fence, len(BIG) + 2)  # a JSON string
        assert client.decode(hit.key, hit.value) == BIG and len(watched.opened) == 1

"""A reserved task's value kept in the payload store: its ``return_value`` XCom is a small reference,
resolved into the value through dibs (the provider's XCom backend, or ``resolve``). The end-to-end
scenario with Airflow's own XCom machinery is in test_integration."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("airflow")

import dibs
from dibs_provider.operators.reserved import ReservedPythonOperator
from dibs_provider.xcom import DibsXComBackend, is_reference, resolve

BIG = "y" * 100_000  # above the 64 KiB inline limit


@pytest.fixture
def payloads(store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = (tmp_path / "payloads").as_uri()
    monkeypatch.setenv("DIBS_PAYLOADS_URL", url)
    return url


def _task(value: Any, task_id: str = "t", key: str = "export") -> ReservedPythonOperator:
    return ReservedPythonOperator(task_id=task_id, python_callable=lambda: value, reservation_key=key)


class _Stored:
    """What Airflow hands ``deserialize_value``: the serialized XCom as its ``value``."""

    def __init__(self, value: Any) -> None:
        self.value = DibsXComBackend.serialize_value(value)


def test_a_large_value_is_returned_as_a_reference_by_the_computing_task_and_a_hit(
    payloads: str, make_context: Any
) -> None:
    computed = _task(BIG).execute(make_context(run_id="r1"))
    hit = _task("never", task_id="other").execute(make_context(dag_id="other", run_id="r2"))
    for returned in (computed, hit):
        assert is_reference(returned) and len(json.dumps(returned)) < 1000
        assert resolve(returned) == BIG
        assert DibsXComBackend.deserialize_value(_Stored(returned)) == BIG  # what a downstream task gets
    assert computed == hit


def test_small_values_and_other_xcoms_are_left_as_they_are(payloads: str, make_context: Any) -> None:
    assert _task({"rows": 3}).execute(make_context()) == {"rows": 3}  # inline: the value itself
    assert resolve({"rows": 3}) == {"rows": 3}
    assert DibsXComBackend.deserialize_value(_Stored([1, "a"])) == [1, "a"]


def test_without_a_payload_store_the_value_is_returned(store_url: str, make_context: Any) -> None:
    assert _task(BIG).execute(make_context()) == BIG


def test_a_reference_to_a_replaced_artifact_is_refused_not_answered_with_another_value(
    payloads: str, make_context: Any, client: dibs.Reservations
) -> None:
    returned = _task(BIG).execute(make_context(run_id="r1"))
    client.forget("export")
    with pytest.raises(dibs.ReservationError, match=r"default/export.*no artifact.*replaced or forgotten"):
        resolve(returned)
    client.run("export", lambda: "z" * 100_000)  # recomputed with other bytes
    with pytest.raises(dibs.ReservationError, match="the artifact of token"):
        resolve(returned)

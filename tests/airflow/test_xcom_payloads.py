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
    """A payload store, and Airflow's XCom backend set to the provider's (which resolves references)."""
    url = (tmp_path / "payloads").as_uri()
    monkeypatch.setenv("DIBS_PAYLOADS_URL", url)
    monkeypatch.setenv("AIRFLOW__CORE__XCOM_BACKEND", "dibs_provider.xcom.DibsXComBackend")
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


def test_without_the_backend_that_resolves_references_the_value_is_returned(
    payloads: str, make_context: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Airflow's own backend would hand downstream tasks the reference, a plain dict, without a word.
    monkeypatch.delenv("AIRFLOW__CORE__XCOM_BACKEND")
    assert _task(BIG).execute(make_context(run_id="r1")) == BIG  # computed
    assert _task("never", task_id="other").execute(make_context(dag_id="o", run_id="r2")) == BIG  # hit


def test_a_value_airflow_looks_inside_is_returned_not_referenced(payloads: str, make_context: Any) -> None:
    """Airflow counts the items of a value that downstream tasks are mapped over, and pushes the keys
    of a ``multiple_outputs`` one: a reference would be one item, or no keys."""
    from airflow.sdk import DAG, task

    rows = [BIG[:70_000], "b"]
    with DAG("mapped", schedule=None):
        mapped_over = _task(rows, key="mapped")
        task(lambda row: None, task_id="each").expand(row=mapped_over.output)
    assert _task(rows, key="mapped").execute(make_context(run_id="r0")) != rows  # a reference, alone
    assert mapped_over.execute(make_context(dag_id="mapped", run_id="r1")) == rows
    outputs = {"table": BIG}
    split = _task(outputs, task_id="split", key="split")
    split.multiple_outputs = True
    assert split.execute(make_context(run_id="r2")) == outputs


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

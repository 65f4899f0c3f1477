"""A reserved task's value kept in the payload store: its ``return_value`` XCom is a small reference,
resolved into the value through dibs (the provider's XCom backend, or ``resolve``). The end-to-end
scenario with Airflow's own XCom machinery is in test_integration."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import pytest

pytest.importorskip("airflow")

import fsspec  # type: ignore[import-untyped]
from fsspec.implementations.local import LocalFileSystem  # type: ignore[import-untyped]

import dibs
from dibs.payloads import PayloadDamaged, PayloadUnavailable
from dibs_provider.operators.reserved import ReservedPythonOperator
from dibs_provider.xcom import REFERENCE_FIELD, DibsXComBackend, is_reference, resolve

BIG = "y" * 100_000  # above the 64 KiB inline limit


@pytest.fixture
def payloads(store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A payload store, and Airflow's XCom backend set to the provider's (which resolves references)."""
    url = (tmp_path / "payloads").as_uri()
    monkeypatch.setenv("DIBS_PAYLOADS_URL", url)
    monkeypatch.setenv("AIRFLOW__CORE__XCOM_BACKEND", "dibs_provider.xcom.DibsXComBackend")
    return url


class _CountingFileSystem(LocalFileSystem):  # type: ignore[misc]
    """The local file system under a protocol of its own, recording every file it opens for reading:
    dibs's fsspec payload store on it is a real payload store whose reads the tests can see."""

    protocol = ("dibs-counting",)
    reads: ClassVar[list[str]] = []

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, str) and path.startswith("dibs-counting://"):
            path = path.removeprefix("dibs-counting://")
        return super()._strip_protocol(path)

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if "r" in mode:
            self.reads.append(path)
        return super()._open(path, mode, **kwargs)


@pytest.fixture
def counted(payloads: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The payload store on :class:`_CountingFileSystem`; returns the list of payload reads."""
    fsspec.register_implementation("dibs-counting", _CountingFileSystem, clobber=True)
    monkeypatch.setenv("DIBS_PAYLOADS_URL", f"dibs-counting://{tmp_path / 'counted'}")
    _CountingFileSystem.reads.clear()
    return _CountingFileSystem.reads


def _payload_file(tmp_path: Path, returned: Any, folder: str = "counted") -> Path:
    """The one copy of the returned reference's payload (``<root>/sha256/<digest>/<stamp>``)."""
    (copy,) = (tmp_path / folder / "sha256" / returned[REFERENCE_FIELD]["sha256"]).iterdir()
    return copy


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


def test_a_hit_returns_the_reference_without_reading_the_payload(
    counted: list[str], make_context: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    computed = _task(BIG).execute(make_context(run_id="r1"))
    assert is_reference(computed)
    counted.clear()
    hit = _task("never", task_id="other").execute(make_context(dag_id="other", run_id="r2"))
    assert hit == computed
    assert counted == []  # only stat'ed: the payload was never opened in the worker
    assert resolve(hit) == BIG and len(counted) == 1  # the downstream reader reads (and checks) it
    # Where the task returns the value itself (no resolving backend), a hit does read it: what the
    # check above would see if a hit loaded its payload.
    monkeypatch.delenv("AIRFLOW__CORE__XCOM_BACKEND")
    counted.clear()
    assert _task("never", task_id="third").execute(make_context(dag_id="third", run_id="r3")) == BIG
    assert len(counted) == 1


def test_a_truncated_payload_makes_the_hit_a_miss_that_computes_again(
    counted: list[str], make_context: Any, tmp_path: Path
) -> None:
    calls: list[str] = []

    def produce() -> str:
        calls.append("ran")
        return BIG

    def task(task_id: str) -> ReservedPythonOperator:
        return ReservedPythonOperator(task_id=task_id, python_callable=produce, reservation_key="export")

    returned = task("t").execute(make_context(run_id="r1"))
    payload = _payload_file(tmp_path, returned)
    payload.write_bytes(payload.read_bytes()[: len(BIG) // 2])
    counted.clear()
    again = task("other").execute(make_context(dag_id="other", run_id="r2"))
    assert calls == ["ran", "ran"] and counted == []
    assert again[REFERENCE_FIELD]["token"] == returned[REFERENCE_FIELD]["token"] + 1  # a new artifact
    # Written whole again, as a new copy beside the truncated one (which a collection removes), and
    # the one every reader takes: the latest.
    latest = max(payload.parent.iterdir(), key=lambda path: path.name)
    assert latest != payload and latest.stat().st_size == len(BIG.encode()) + 2  # a JSON string


def test_a_payload_damaged_at_its_size_is_refused_by_the_reader_then_computed_again(
    counted: list[str], make_context: Any, tmp_path: Path
) -> None:
    returned = _task(BIG).execute(make_context(run_id="r1"))
    payload = _payload_file(tmp_path, returned)
    payload.write_bytes(payload.read_bytes().replace(b"y", b"z"))  # same size, other bytes
    hit = _task("never", task_id="other").execute(make_context(dag_id="other", run_id="r2"))
    assert hit == returned  # the cheap check passes: present, right size
    with pytest.raises(PayloadUnavailable, match=r"does not match its recorded SHA-256.*clear the upstream"):
        resolve(hit)  # never the damaged bytes
    assert not payload.exists()  # removed by the reader that found it damaged
    again = _task(BIG, task_id="third").execute(make_context(dag_id="third", run_id="r3"))
    assert again[REFERENCE_FIELD]["token"] == returned[REFERENCE_FIELD]["token"] + 1  # computed again
    assert resolve(again) == BIG


def test_work_that_asks_for_its_own_key_is_refused_when_hits_stay_unread(
    payloads: str, make_context: Any
) -> None:
    """A task returning references reads hits through an unread twin of its client's store: the key it
    holds there is still its key for any client on the same records, so asking for it from inside its
    own work is refused at once instead of waiting for itself."""
    from dibs_provider.hooks.dibs import DibsHook

    seen: list[BaseException] = []

    def work() -> str:
        with DibsHook().get_client() as client:
            try:
                client.acquire("export", timeout=5)
            except BaseException as exc:
                seen.append(exc)
        return BIG

    returned = ReservedPythonOperator(task_id="t", python_callable=work, reservation_key="export").execute(
        make_context(run_id="r1")
    )
    assert is_reference(returned)
    assert len(seen) == 1 and isinstance(seen[0], dibs.ConfigurationError)
    assert "asked for from inside its own work" in str(seen[0])


class _ResettingFileSystem(_CountingFileSystem):
    """The counting file system whose reads fail as a reset connection does while ``resetting``."""

    protocol = ("dibs-resetting",)
    resetting: ClassVar[bool] = False

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, str) and path.startswith("dibs-resetting://"):
            path = path.removeprefix("dibs-resetting://")
        return super()._strip_protocol(path)

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        opened = super()._open(path, mode, **kwargs)
        if "r" in mode and self.resetting:

            def reset(*args: Any, **kwargs: Any) -> bytes:
                raise ConnectionResetError(104, "Connection reset by peer")

            opened.read = reset
        return opened


def test_a_payload_that_could_not_be_read_is_kept_only_damaged_ones_are_removed(
    payloads: str, make_context: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fsspec.register_implementation("dibs-resetting", _ResettingFileSystem, clobber=True)
    monkeypatch.setenv("DIBS_PAYLOADS_URL", f"dibs-resetting://{tmp_path / 'resetting'}")
    returned = _task(BIG).execute(make_context(run_id="r1"))
    payload = _payload_file(tmp_path, returned, "resetting")
    monkeypatch.setattr(_ResettingFileSystem, "resetting", True)
    with pytest.raises(PayloadUnavailable, match="cannot be read") as refused:
        resolve(returned)
    assert not isinstance(refused.value, PayloadDamaged)
    assert payload.exists()  # the bytes are good: a reset connection says nothing about them
    monkeypatch.setattr(_ResettingFileSystem, "resetting", False)
    assert resolve(returned) == BIG

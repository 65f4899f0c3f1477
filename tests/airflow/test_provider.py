"""The provider as Airflow sees it: discovery, the connection form, ``@task.reserved``, example DAGs, CLI."""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("airflow")

from airflow.sdk import DAG, task
from packaging.version import Version

from dibs.keys import derive_key
from dibs_provider.decorators.reserved import reserved_task
from dibs_provider.get_provider_info import get_provider_info
from dibs_provider.operators.reserved import OUTCOME_XCOM_KEY
from tests.airflow.compat import AIRFLOW_VERSION, dag_bag, serialize_dag, task_runtime_providers

REPO = Path(__file__).resolve().parents[2]


def test_provider_info_is_valid_and_names_the_distribution() -> None:
    import jsonschema

    from airflow import providers_manager

    schema = json.loads((Path(providers_manager.__file__).parent / "provider_info.schema.json").read_text())
    info = get_provider_info()
    jsonschema.validate(info, schema)
    (entry_point,) = [
        ep for ep in metadata.entry_points(group="apache_airflow_provider") if ep.dist.name == "dibs"
    ]  # type: ignore[union-attr]
    assert info["package-name"] == entry_point.dist.name == "dibs"  # type: ignore[union-attr]


def test_connection_form_fields_take_empty_and_the_settings_rules_and_refuse_the_rest() -> None:
    import jsonschema

    (connection,) = get_provider_info()["connection-types"]
    fields = connection["conn-fields"]

    def valid(name: str, value: object) -> bool:
        return bool(jsonschema.Draft202012Validator(fields[name]["schema"]).is_valid(value))

    for name, field in fields.items():
        assert field["label"] and field["description"], name
        assert valid(name, None), f"{name}: empty must mean its default"
    for seconds in ("ttl", "heartbeat_interval", "wait_timeout", "max_lease_age", "max_age"):
        assert valid(seconds, 0.5) and not valid(seconds, 0) and not valid(seconds, "60"), seconds
    assert fields["ttl"]["schema"]["default"] == 60
    assert valid("max_failures", 3) and not valid("max_failures", 0) and not valid("max_failures", 1.5)
    assert valid("namespace", "team.features") and not valid("namespace", "team..features")
    assert fields["namespace"]["schema"]["default"] == "default"
    assert valid("on_store_unavailable", "run") and not valid("on_store_unavailable", "skip")
    assert valid("store_url", "redis://cache:6379/0") and not valid("store_url", 6379)
    assert get_provider_info() == get_provider_info() and (
        get_provider_info()["connection-types"][0]["conn-fields"] is not fields
    ), "each call builds its own dict"


def test_providers_manager_discovers_connection_type_form_and_decorator() -> None:
    from airflow.providers_manager import ProvidersManager

    manager, runtime = ProvidersManager(), task_runtime_providers()
    assert "dibs" in manager.providers
    hook = runtime.hooks["dibs"]
    assert hook is not None and hook.hook_class_name == "dibs_provider.hooks.dibs.DibsHook"
    assert hook.connection_id_attribute_name == "dibs_conn_id"
    if Version("3.2") <= AIRFLOW_VERSION or importlib.util.find_spec("flask_appbuilder"):
        # (Airflow 3.1 builds the connection form only when Flask-AppBuilder is installed.)
        assert {"extra__dibs__store_url", "extra__dibs__ttl", "extra__dibs__namespace"} <= set(
            manager.connection_form_widgets
        )
        assert "host" in manager.field_behaviours["dibs"]["hidden_fields"]
    assert runtime.taskflow_decorators["reserved"] is reserved_task
    assert task.reserved is reserved_task  # type: ignore[attr-defined]


def test_decorator_maps_its_short_arguments_to_the_operator() -> None:
    with DAG("d", schedule=None, start_date=dt.datetime(2024, 1, 1)) as dag:

        @task.reserved(  # type: ignore[attr-defined,misc]
            key="k-{{ ds }}",
            conn_id="dibs_x",
            namespace="team.x",
            ttl=5,
            version="2",
            exclude=["client"],
            wait_timeout=30,
            deferrable=False,
            retries=3,
        )
        def build(day: str) -> str:
            return day

        build("2024-01-01")
        build.override(task_id="other", key="explicit")("2024-01-02")

    op = dag.task_dict["build"]
    assert (op.reservation_key, op.dibs_conn_id, op.reservation_namespace, op.reservation_ttl) == (
        "k-{{ ds }}",
        "dibs_x",
        "team.x",
        5,
    )
    assert (op.reservation_version, op.reservation_exclude, op.reservation_wait_timeout) == (
        "2",
        ("client",),
        30,
    )
    assert op.reservation_deferrable is False and op.retries == 3
    assert "reservation_key" in op.template_fields and "op_kwargs" in op.template_fields
    assert dag.task_dict["other"].reservation_key == "explicit"


def shared(day: str, region: str = "eu") -> dict[str, str]:
    return {"day": day, "region": region}


def test_decorated_task_runs_reserved_and_shares_the_core_key(store_url: str, make_context: Any) -> None:
    with DAG("d", schedule=None, start_date=dt.datetime(2024, 1, 1)) as dag:
        reserved_task(shared, version="3")("2024-01-01")
    context = make_context()
    assert dag.task_dict["shared"].execute(context) == {"day": "2024-01-01", "region": "eu"}
    outcome = context["ti"].xcoms[OUTCOME_XCOM_KEY]
    assert outcome["role"] == "computed"
    # the same key as the core's own decorator / derive_key: plain Python and Airflow share results
    assert outcome["key"] == "default/" + derive_key(shared, ("2024-01-01",), {}, version="3")


def test_mapped_decorated_task_keeps_its_reservation_arguments() -> None:
    with DAG("d", schedule=None, start_date=dt.datetime(2024, 1, 1)) as dag:

        @task.reserved(version="1", ttl=7)  # type: ignore[attr-defined,misc]
        def process(partition: str) -> str:
            return partition

        process.expand(partition=["a", "b"])
    mapped = dag.task_dict["process"]
    assert mapped.partial_kwargs["version"] == "1" and mapped.partial_kwargs["ttl"] == 7  # type: ignore[attr-defined]


def test_example_dags_parse_and_serialize() -> None:
    bag = dag_bag(str(REPO / "example_dags"))
    assert bag.import_errors == {}
    assert {"dibs_daily_training", "dibs_six_hourly_report", "dibs_mapped_partitions"} <= set(bag.dag_ids)
    for dag in bag.dags.values():
        serialize_dag(dag)  # what the DAG processor stores for the scheduler
    report = bag.dags["dibs_six_hourly_report"]
    assert {"build_features", "export_day", "wait_for_model"} <= set(report.task_dict)


def test_the_hook_names_its_default_connection() -> None:
    """The hook declares ``dibs_default``, the connection it uses when given none. Airflow's connection-form
    metadata (``GET /ui/connections/hook_meta``) cannot carry it yet: Airflow 3.0 to 3.3 write
    ``default_conn_name=None`` for every hook. If a later Airflow reads it, it must read ours."""
    from airflow.api_fastapi.core_api.services.ui.connections import HookMetaService

    from dibs_provider.hooks.dibs import DibsHook

    assert DibsHook.default_conn_name == "dibs_default" and DibsHook.conn_name_attr == "dibs_conn_id"
    (meta,) = [m for m in HookMetaService.hook_meta_data() if m.connection_type == "dibs"]
    assert meta.hook_class_name == "dibs_provider.hooks.dibs.DibsHook"
    assert meta.default_conn_name in (None, DibsHook.default_conn_name)

"""The Reservations page's parts that need no API server: owners as task instances, connections found
in the environment, a real SQLite store's keys joined to their waiters and filtered, the task's link,
the plugin's registration and the page's escaping. The page itself, served by a real API server and
read in Chromium, is checked by test_deployment.py."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest

pytest.importorskip("airflow")

from airflow.sdk import Connection

import dibs
from dibs_provider._compat import FRAME_DEEP_LINKS
from dibs_provider.get_provider_info import get_provider_info
from dibs_provider.hooks.dibs import settings_from_connection
from dibs_provider.links.reservation import ReservationLink
from dibs_provider.plugins._keys import KeyRow, Source, TaskRef, Waiter, _env_conn_type, _fill
from dibs_provider.plugins.reservations import DibsReservationsPlugin


def test_a_reserved_task_owner_is_a_task_instance_with_its_pages() -> None:
    ref = TaskRef.parse("etl/manual__2026-01-01T00:00:00+00:00/build.features/3")
    assert ref == TaskRef("etl", "manual__2026-01-01T00:00:00+00:00", "build.features", 3)
    assert ref.run_url == "/dags/etl/runs/manual__2026-01-01T00%3A00%3A00%2B00%3A00"
    assert ref.task_url == ref.run_url + "/tasks/build.features/mapped/3"
    assert ref.label == "build.features[3]"
    unmapped = TaskRef.parse("etl/r1/t/-1")
    assert unmapped is not None and unmapped.task_url == "/dags/etl/runs/r1/tasks/t"


@pytest.mark.parametrize("owner", [None, "", "host-42:pid-7", "a/b/c/not-a-number", "/run/t/-1", "a/b"])
def test_other_owners_have_no_task_instance(owner: str | None) -> None:
    assert TaskRef.parse(owner) is None


@pytest.mark.parametrize(
    ("value", "conn_type"),
    [
        (json.dumps({"conn_type": "dibs", "extra": {"store_url": "sqlite:////x.db"}}), "dibs"),
        ("dibs://?store_url=redis%3A%2F%2Fcache", "dibs"),
        ("postgresql://u@db/x", "postgresql"),
        ("{not json", None),
    ],
)
def test_environment_connections_are_recognised_by_type(value: str, conn_type: str | None) -> None:
    assert _env_conn_type(value) == conn_type


def _waiter(key: str, run_id: str) -> Waiter:
    return Waiter("dibs_default", None, key, TaskRef("etl", run_id, "t", -1), 1, 1.0)


def _rows(store_url: str, waiters: list[Waiter], **filters: Any) -> list[KeyRow]:
    settings = settings_from_connection(
        Connection(conn_id="dibs_default", conn_type="dibs", extra=json.dumps({"store_url": store_url}))
    )
    source = Source(["dibs_default"], settings.display_url, "default")
    _fill(source, settings, waiters, **{"state": None, "name": None, "key": None, **filters})
    assert source.error is None
    return source.rows


def test_a_store_s_keys_are_joined_to_the_tasks_waiting_on_them(
    client: dibs.Reservations, store_url: str
) -> None:
    client.get_or_reserve("features-held", owner="etl/r1/t/-1")
    done = client.get_or_reserve("features-done", owner="etl/r0/t/-1").lease  # type: ignore[union-attr]
    time.sleep(0.05)  # the producer's compute time is at least this
    done.complete({"rows": 42})
    failed = client.get_or_reserve("model-failed", owner="etl/r2/t/-1").lease  # type: ignore[union-attr]
    failed.release(ValueError("bad input"))
    waiters = [_waiter("features-held", "r3"), _waiter("features-held", "r4"), _waiter("never-seen", "r5")]

    rows = {row.name: row for row in _rows(store_url, waiters)}
    held = rows["features-held"]
    assert (held.status, held.holder, held.token) == ("held", "etl/r1/t/-1", 1)
    assert held.holder_task == TaskRef("etl", "r1", "t", -1)
    assert held.expires_in is not None and 0 < held.expires_in <= 30
    assert sorted(w.task.run_id for w in held.waiters) == ["r3", "r4"]
    assert rows["features-done"].status == "done" and rows["features-done"].producer == "etl/r0/t/-1"
    assert rows["features-done"].size is not None and rows["features-done"].size > 0
    stored = client.status("features-done").artifact
    assert stored is not None and stored.compute_seconds is not None and stored.compute_seconds >= 0.05
    assert rows["features-done"].compute_seconds == stored.compute_seconds
    assert held.compute_seconds is None  # no artifact yet
    assert rows["model-failed"].status == "failed" and "ValueError: bad input" in str(
        rows["model-failed"].failure
    )
    # A key a task waits on but the store has no record of (yet) is shown too, with its waiter.
    assert rows["never-seen"].status == "free" and [w.task.run_id for w in rows["never-seen"].waiters] == [
        "r5"
    ]
    assert [r.name for r in rows.values()][:1] == ["features-held"]  # held keys first

    assert [r.name for r in _rows(store_url, waiters, state="done")] == ["features-done"]
    waited = _rows(store_url, waiters, state="waited-on")
    assert [r.name for r in waited] == ["features-held", "never-seen"]
    assert [r.name for r in _rows(store_url, waiters, name="FEATURES")] == ["features-held", "features-done"]
    assert [r.name for r in _rows(store_url, waiters, name="*-failed")] == ["model-failed"]
    assert [r.name for r in _rows(store_url, waiters, key="features")] == []  # a key is exact


@pytest.mark.parametrize("keys", [1_000, 3_000])
def test_the_page_reads_a_bounded_number_of_records_whatever_the_namespace_size(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, keys: int
) -> None:
    """The page pages through the store, filtered by status there, until it has its rows: it never
    lists the namespace whole (issue 30). Rows counted, not timed: as many at 3,000 keys as at 1,000."""
    from dibs.stores.sql import SQLStore
    from dibs_provider.plugins._keys import MAX_ROWS
    from tests.test_admin_reads import NAMESPACE, _grow

    url = f"sqlite:///{tmp_path / 'page.db'}"
    store = SQLStore(url)
    _grow(store, keys)
    dibs.Reservations(store, namespace=NAMESPACE, ttl=600).get_or_reserve("held-1", owner="etl/r1/t/-1")
    store.close()
    returned: list[int] = []
    admin_rows = SQLStore._admin_rows

    def counting(self: SQLStore, statement: Any, values: dict[str, Any], **options: Any) -> Any:
        rows = admin_rows(self, statement, values, **options)
        returned.append(len(rows))
        return rows

    monkeypatch.setattr(SQLStore, "_admin_rows", counting)
    monkeypatch.setattr(SQLStore, "list", lambda *args: pytest.fail("the page listed the whole namespace"))
    settings = settings_from_connection(
        Connection(conn_id="dibs_default", conn_type="dibs", extra=json.dumps({"store_url": url}))
    )
    source = Source(["dibs_default"], settings.display_url, NAMESPACE)
    _fill(source, settings, [_waiter("held-1", "r2")], state=None, name=None, key=None)
    assert source.error is None and source.truncated and len(source.rows) == MAX_ROWS
    assert source.rows[0].name == "held-1" and len(source.rows[0].waiters) == 1
    # The held page, and the newest done keys: as many as the page lacks, and one more to know.
    assert sum(returned) == 1 + MAX_ROWS
    returned.clear()
    _fill(source, settings, [], state="failed", name=None, key=None)
    assert source.rows == [] and sum(returned) == 0


def test_the_page_shows_the_newest_done_keys_and_under_a_name_filter_the_first_by_name(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past its rows, the page shows the keys that finished last, not the first by name; a name
    filter searches in key order."""
    from dibs_provider.plugins import _keys

    monkeypatch.setattr(_keys, "MAX_ROWS", 3)
    url = f"sqlite:///{tmp_path / 'newest.db'}"
    client = dibs.Reservations(url)
    for i in range(8):  # day-0 finished first, day-7 last
        client.run(f"day-{i}", lambda: 1)
    client.get_or_reserve("day-2", owner="etl/r1/t/-1", refresh=True)  # done before, computed again
    client.close()
    settings = settings_from_connection(
        Connection(conn_id="dibs_default", conn_type="dibs", extra=json.dumps({"store_url": url}))
    )
    source = Source(["dibs_default"], settings.display_url, settings.namespace)
    _fill(source, settings, [], state="done", name=None, key=None)
    assert source.truncated and [r.name for r in source.rows] == ["day-4", "day-5", "day-6"]
    _fill(source, settings, [], state=None, name=None, key=None)
    assert source.truncated and [r.name for r in source.rows] == ["day-2", "day-5", "day-6"]
    assert source.rows[0].status == "held"
    _fill(source, settings, [], state="done", name="day-", key=None)
    assert source.truncated and [r.name for r in source.rows] == ["day-0", "day-1", "day-3"]


def test_the_task_link_opens_the_page_at_its_key() -> None:
    class Task:
        reservation_key = "build/ab12"
        dibs_conn_id = "dibs_other"
        reservation_namespace = None

    # Inside Airflow's frame (its navigation), at the key: Airflow 3.3.2+ opens the frame there; before,
    # the page's script reads the query from the address around its frame.
    inner = "/dibs/" if FRAME_DEEP_LINKS else ""
    link = ReservationLink().get_link(Task(), ti_key=None)  # type: ignore[arg-type]
    assert link == f"/plugin/dibs{inner}?conn=dibs_other&key=build%2Fab12"
    Task.reservation_key = None  # type: ignore[assignment]
    assert ReservationLink().get_link(Task(), ti_key=None) == ""  # type: ignore[arg-type]


def test_the_plugin_is_registered_as_official_providers_do() -> None:
    info = get_provider_info()
    (plugin,) = info["plugins"]
    assert plugin["plugin-class"] == "dibs_provider.plugins.reservations.DibsReservationsPlugin"
    assert info["extra-links"] == ["dibs_provider.links.reservation.ReservationLink"]
    assert DibsReservationsPlugin.name == plugin["name"] == "dibs"
    (view,) = DibsReservationsPlugin.external_views
    assert (view["href"], view["url_route"], view["category"]) == ("/dibs/", "dibs", "browse")
    from importlib.metadata import entry_points

    (entry,) = [e for e in entry_points(group="airflow.plugins") if e.name == "dibs"]
    assert entry.load() is DibsReservationsPlugin


def test_the_page_shows_an_artifact_s_compute_time_as_dibs_ls_does() -> None:
    from dibs_provider.plugins._app import _render

    timed = KeyRow(
        namespace="default",
        name="timed",
        status="done",
        size=12_000,
        artifact_age=7200.0,
        producer="etl-1",
        compute_seconds=250.0,
    )
    quick = KeyRow(
        namespace="default",
        name="quick",
        status="done",
        size=10,
        artifact_age=5.0,
        producer="etl-2",
        compute_seconds=0.42,
    )
    old = KeyRow(namespace="default", name="old", status="done", size=10, artifact_age=5.0, producer="etl-3")
    held = KeyRow(namespace="default", name="held", status="held", holder="someone")
    html = _render(
        "reservations.html",
        sources=[Source(["dibs_default"], "sqlite:///x", "default", rows=[timed, quick, old, held])],
        readable=set(),
        states=("held",),
        state="",
        name="",
        key="",
        conn="",
        done="",
        can_edit=False,
        user="viewer",
    ).body.decode()
    cells = re.findall(r'<tr data-key="([^"]+)">.*?<td class="compute">(.*?)</td>', html, re.S)
    # Precise when short, rounded when long; "-" for an artifact stored before compute times were kept.
    assert cells == [("timed", "4m 10s"), ("quick", "0.4s"), ("old", "-"), ("held", "")]
    assert "<th>Compute time</th>" in html


def test_the_page_escapes_what_the_store_holds() -> None:
    from dibs_provider.plugins._app import _render, create_app

    paths = {getattr(route, "path", None) for route in create_app().routes}
    assert {"/", "/confirm", "/keys/{action}"} <= paths
    evil = KeyRow(namespace="default", name="<script>alert(1)</script>", status="failed", failure="<b>x</b>")
    hidden = TaskRef("secret_dag", "r9", "t", -1)
    shown = TaskRef("open_dag", "r1", "t", -1)
    held = KeyRow(
        namespace="default",
        name="k",
        status="held",
        holder="secret_dag/r9/t/-1",
        holder_task=hidden,
        waiters=(Waiter("dibs_default", None, "k", shown, 1, None),),
    )
    html = _render(
        "reservations.html",
        sources=[Source(["dibs_default"], "sqlite:///x", "default", rows=[evil, held])],
        readable={"open_dag"},
        states=("held",),
        state="",
        name="",
        key="",
        conn="",
        done="",
        can_edit=True,
        user="admin",
    ).body.decode()
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<b>x</b>" not in html and html.count("Forget…") == 1 and html.count("Release…") == 1
    # DAG-level access: a holder in a DAG this user cannot read is not named; a readable waiter is.
    assert "secret_dag" not in html and "r9" not in html and "a task of a DAG you cannot read" in html
    assert 'href="/dags/open_dag/runs/r1/tasks/t"' in html


def test_a_state_changing_request_needs_the_page_s_origin_unless_a_bearer_token_names_its_user() -> None:
    from fastapi import HTTPException
    from starlette.requests import Request

    from dibs_provider.plugins._app import _same_origin

    def request(**headers: str) -> Request:
        scope = {
            "type": "http",
            "method": "POST",
            "scheme": "http",
            "server": ("airflow.example", 8080),
            "path": "/dibs/keys/release",
            "query_string": b"",
            "headers": [(name.encode(), value.encode()) for name, value in headers.items()],
        }
        return Request(scope)

    host = "airflow.example:8080"
    _same_origin(request(host=host, origin=f"http://{host}"))  # the page's own form
    # A script's bearer token: no page of another site can make a browser send one, so no Origin is
    # needed (who may release is checked all the same, as for the form: test_deployment.py).
    _same_origin(request(host=host, authorization="Bearer eyJ.x.y"))
    for refused in ({}, {"origin": "https://evil.example"}, {"authorization": "Basic YWRtaW46eA=="}):
        with pytest.raises(HTTPException) as info:
            _same_origin(request(host=host, **refused))
        assert info.value.status_code == 403


def test_a_key_breaks_only_after_its_slashes_and_stays_escaped() -> None:
    from dibs_provider.plugins._app import _breakable

    assert str(_breakable("build_features/4d6f74a1c09e5b23")) == "build_features/<wbr>4d6f74a1c09e5b23"
    assert str(_breakable("<b>/x")) == "&lt;b&gt;/<wbr>x"

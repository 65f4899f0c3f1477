"""The SQL store's per-key statements are planned on the primary key, whatever the table's statistics.

A table that was never analysed (autovacuum off, as on this project's own machines, or a table just
created) has no statistics: PostgreSQL then planned heartbeats and completes through the namespace
index, reading every row of the namespace for each of them (issue 30: 2.94 million rows read for 223
reserve + complete calls; 30,000 keys took over ten minutes to fill). The plan that does it is made
while the table is nearly empty, where both indexes cost the same and the namespace's won, and then
kept (psycopg prepares a statement on the server after five runs, whose plan PostgreSQL may keep as
a generic one). Every statement that names one key
must find its row by the primary key, whatever else it checks: checked with ``EXPLAIN``, as a generic
plan and as a custom one, on the empty table and again with 30,000 rows in one namespace, never
analysed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dibs.keys import Key
from dibs.stores import open_store
from dibs.stores.sql import SQLStore
from dibs.stores.sql.statements import Prepared
from tests.backends import postgres

ROWS = 30_000


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLStore]:
    with postgres.isolated_url(tmp_path) as url:
        opened = open_store(url)
        assert isinstance(opened, SQLStore)
        try:
            opened.read(Key("plans", "warm-up"))  # the table is created now, empty
            with opened.engine.begin() as conn:
                conn.exec_driver_sql(f"ALTER TABLE {_table(opened)} SET (autovacuum_enabled = false)")
            yield opened
        finally:
            opened.close()


def _table(store: SQLStore) -> str:
    return str(store.engine.dialect.identifier_preparer.format_table(store.t))


def _fill(store: SQLStore) -> None:
    """:data:`ROWS` free keys in one namespace, never analysed."""
    _insert_never_analysed(
        store,
        "key_hash, namespace, name, version, fence, attempts, failure_count",
        "md5(i::text) || md5(i::text), 'plans', 'k' || i, 1, 1, 0, 0",
    )


def _insert_never_analysed(store: SQLStore, columns: str, values: str) -> None:
    """:data:`ROWS` rows of ``values`` (SQL of ``i``, 1 to :data:`ROWS`) into ``columns``; the table
    must never have been analysed after it."""
    with store.engine.begin() as conn:
        conn.exec_driver_sql(
            f"INSERT INTO {_table(store)} ({columns}) SELECT {values} FROM generate_series(1, {ROWS}) AS i"
        )
        analysed = conn.exec_driver_sql(
            "SELECT last_analyze, last_autoanalyze FROM pg_stat_user_tables "
            f"WHERE relid = '{_table(store)}'::regclass"
        ).one()
    assert analysed == (None, None), "the table must never have been analysed"


def _plans(store: SQLStore, statement: Prepared, values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The statement's custom plan (its values known) and its generic plan (prepared, values unknown:
    what a server-side prepared statement runs), each as ``EXPLAIN``'s JSON."""
    from psycopg import sql as psycopg_sql  # there when the PostgreSQL store is (tests.backends.postgres)

    names: list[str] = []

    def numbered(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    sql = re.sub(r"%\((\w+)\)s", numbered, statement.sql)
    types = ", ".join(_SQL_TYPES[type(values[name])] for name in names)
    # EXPLAIN takes no parameters: the arguments are written into it as literals.
    arguments = psycopg_sql.SQL(", ").join(psycopg_sql.Literal(values[name]) for name in names)
    plans: dict[str, Any] = {}
    with store._cursor() as cursor:
        cursor.execute(f"PREPARE dibs_plan_check ({types}) AS {sql}")
        try:
            for kind in ("custom", "generic"):
                cursor.execute(f"SET plan_cache_mode = force_{kind}_plan")
                cursor.execute(
                    psycopg_sql.SQL("EXPLAIN (FORMAT JSON) EXECUTE dibs_plan_check({})").format(arguments)
                )
                plans[kind] = _root(cursor.fetchone()[0])
        finally:
            cursor.execute("DEALLOCATE dibs_plan_check")
            cursor.execute("RESET plan_cache_mode")
    return plans


#: The SQL type of each parameter of a prepared statement, by its value's Python type.
_SQL_TYPES = {str: "text", int: "bigint", float: "double precision", bytes: "bytea"}


def _root(document: Any) -> dict[str, Any]:
    plan = document if isinstance(document, list) else json.loads(document)
    return dict(plan[0]["Plan"])


def _indexes(plan: dict[str, Any]) -> set[str]:
    found = {plan["Index Name"]} if "Index Name" in plan else set()
    for child in plan.get("Plans", ()):
        found |= _indexes(child)
    return found


def _statements(store: SQLStore) -> dict[str, tuple[Prepared, dict[str, Any]]]:
    key = Key("plans", "k17")
    holding = {
        "p_key_hash": key.digest,
        "p_fence": 1,
        "p_lease_id": "x" * 32,
        "p_namespace": key.namespace,
        "p_name": key.name,
    }
    artifact = {
        "p_serializer": "json",
        "p_payload": b"1",
        "p_size": 1,
        "p_checksum": "sha256:0",
        "p_compute_seconds": 0.0,
    }
    return {
        "read": (store._read_state, {"p_key_hash": key.digest}),
        "heartbeat": (store._heartbeat, {**holding, "p_ttl": 60.0}),
        "complete": (store._complete, {**holding, **artifact}),
        "release": (store._release, holding),
    }


@pytest.mark.parametrize("rows", ["empty", "filled"])
def test_per_key_statements_use_the_primary_key_on_a_table_never_analysed(store: SQLStore, rows: str) -> None:
    if rows == "filled":
        _fill(store)
    primary = f"{store.table_name}_pkey"
    for name, (statement, values) in _statements(store).items():
        for kind, plan in _plans(store, statement, values).items():
            used = _indexes(plan)
            assert used == {primary}, (
                f"{name} ({kind} plan) goes through {sorted(used) or 'a sequential scan'}"
            )


def test_the_plan_check_sees_another_index_when_a_statement_uses_it(store: SQLStore) -> None:
    """Guards the test above: a statement that selects by namespace alone is planned on its index
    (or scans), so the check can tell the primary key from another way in."""
    _fill(store)
    by_namespace = Prepared.__new__(Prepared)
    by_namespace.sql = f"SELECT key_hash FROM {_table(store)} WHERE namespace = %(p_namespace)s"
    by_namespace.parameters = lambda values: values  # type: ignore[method-assign]
    for plan in _plans(store, by_namespace, {"p_namespace": "plans"}).values():
        assert f"{store.table_name}_pkey" not in _indexes(plan)


def _scans(plan: dict[str, Any]) -> set[str]:
    """The node types of a plan that read a table without an index (a sequential scan)."""
    found = {plan["Node Type"]} if plan["Node Type"] == "Seq Scan" else set()
    for child in plan.get("Plans", ()):
        found |= _scans(child)
    return found


def _admin_statements(store: SQLStore) -> dict[str, tuple[Prepared, dict[str, Any], str]]:
    """The reads a person makes (dibs.stores.sql.admin), their values, and the index each must use."""
    admin, table = store._admin, store.table_name
    one = {"p_namespace": "plans", "p_limit": 11}
    after = {**one, "p_after_name": "k17"}
    everywhere = {"p_limit": 11, "p_after_namespace": "plans", "p_after_name": "k17"}
    found: dict[str, tuple[Prepared, dict[str, Any], str]] = {
        "page": (
            admin.page(namespace=True, state=None, after=False),
            {**one, "p_after_name": ""},
            f"{table}_keys",
        ),
        "page after": (admin.page(namespace=True, state=None, after=True), after, f"{table}_keys"),
        "page everywhere": (admin.page(namespace=False, state=None, after=True), everywhere, f"{table}_keys"),
        "held": (admin.leases(namespace=True, expired=False), one, f"{table}_leases"),
        "expired": (admin.leases(namespace=True, expired=True), one, f"{table}_leases"),
        "artifacts": (admin.latest(namespace=True, kind="artifact"), one, f"{table}_artifacts"),
        "failures": (admin.latest(namespace=True, kind="failure"), one, f"{table}_failures"),
    }
    for state in ("held", "expired", "done", "failed", "free"):
        found[f"page of {state}"] = (admin.page(namespace=True, state=state, after=True), after, "")
    return found


@pytest.mark.parametrize("rows", ["empty", "filled"])
def test_admin_reads_use_their_indexes_on_a_table_never_analysed(store: SQLStore, rows: str) -> None:
    """``dibs top``, ``dibs ls`` and the Reservations page read through the indexes made for them,
    never a scan of the table, whatever its statistics (issue 30)."""
    if rows == "filled":
        _fill(store)
    for name, (statement, values, index) in _admin_statements(store).items():
        for kind, plan in _plans(store, statement, values).items():
            used = _indexes(plan)
            if name in ("page", "page after", "page of done", "page of free") and (
                kind == "generic" or rows == "empty"
            ):
                continue  # run unprepared (SQLStore.list_page): planned at each run for the table then
            if rows == "empty" and kind == "custom" and name == "page everywhere":
                # An empty table, read whole for the values at hand: made again at every call, it
                # is never kept for a filled table (the generic plan, which is, must use the index).
                continue
            assert not _scans(plan), f"{name} ({kind} plan) scans the table: {plan}"
            if index:
                assert index in used, f"{name} ({kind} plan) goes through {sorted(used)}, not {index}"
            else:
                assert used, f"{name} ({kind} plan) uses no index"
    counts = store._admin.counts(namespace=True)
    for kind, plan in _plans(store, counts, {"p_namespace": "plans", "p_limit": 1000}).items():
        assert not _scans(plan), f"counts ({kind} plan) scans the table: {plan}"


@pytest.fixture
def mysql_store(tmp_path: Path) -> Iterator[SQLStore]:
    from tests.backends import mysql

    with mysql.isolated_url(tmp_path) as url:
        opened = open_store(url)
        assert isinstance(opened, SQLStore)
        try:
            yield opened
        finally:
            opened.close()


def test_admin_reads_use_their_indexes_on_mysql(mysql_store: SQLStore) -> None:
    """MySQL/MariaDB have no partial indexes: the same reads go through the composite ones, never a
    scan of the table. A page is narrowed to its namespace by an index and then sorted: the keys'
    index holds a name's first 500 characters (a TEXT column), which the server does not use for the
    order (docs/scaling.md says so)."""
    store = mysql_store
    store.read(Key("plans", "warm-up"))
    rows = [
        {"key_hash": Key("plans", f"k{i}").digest, "namespace": "plans", "name": f"k{i}", "version": 1}
        for i in range(3000)
    ]
    with store.engine.begin() as conn:
        conn.execute(
            store.t.insert(), [{**row, "fence": 1, "attempts": 0, "failure_count": 0} for row in rows]
        )
    for name, (statement, values, index) in _admin_statements(store).items():
        if name == "page everywhere":  # every namespace, sorted: a scan on MySQL (docs/scaling.md)
            continue
        with store._cursor() as cursor:
            cursor.execute("EXPLAIN " + statement.sql, statement.parameters(values))
            columns = [column[0] for column in cursor.description]
            rows = [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
        used = {row["key"] for row in rows if row.get("table") and not str(row["table"]).startswith("<")}
        assert all(row["type"] != "ALL" for row in rows if row.get("table") == store.table_name), (name, rows)
        assert None not in used, (name, rows)
        if index and not name.startswith("page"):  # a page: any index on the namespace, then sorted
            assert used == {index}, (name, rows)


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(node for child in plan.get("Plans", ()) for node in _nodes(child))]


@pytest.mark.parametrize("rows", ["empty", "filled"])
def test_a_page_of_one_namespace_is_read_in_order_not_gathered_and_sorted(store: SQLStore, rows: str) -> None:
    """Without statistics PostgreSQL guessed that a namespace holds 0.5 % of the table and planned a
    page as "every row of the namespace through a bitmap, then sort": 1 s a page at 1,000,000 keys
    (issue 30's benchmark). A page of every key, or of done keys, walks the keys' index in
    order from the cursor (no sort); a page of held, expired or failed keys sorts only the namespace's
    rows of the leases' or failures' index, the namespace in that index's condition."""
    if rows == "filled":
        _fill(store)
    admin, table = store._admin, store.table_name
    # Free keys (released without a failure) have no index: guessed rare, they may be gathered and
    # sorted, which reads what walking the keys would when there are none (docs/scaling.md).
    assert admin.walks("free")
    for state in (None, "done"):
        assert admin.walks(state)
        statement = admin.page(namespace=True, state=state, after=False)
        values = {"p_limit": 11, "p_namespace": "plans", "p_after_name": ""}
        for kind, plan in _plans(store, statement, values).items():
            if kind == "generic" or rows == "empty":
                continue  # run unprepared, so planned for the table as it is at each run
            nodes = _nodes(plan)
            assert not [n for n in nodes if n["Node Type"] in ("Sort", "Bitmap Heap Scan", "Seq Scan")], (
                f"page of {state} ({kind} plan) is not read in order: {plan}"
            )
            assert f"{table}_keys" in _indexes(plan), plan
    for state, index in (("held", "leases"), ("expired", "leases"), ("failed", "failures")):
        assert not admin.walks(state)
        statement = admin.page(namespace=True, state=state, after=False)
        for kind, plan in _plans(store, statement, {"p_namespace": "plans", "p_limit": 11}).items():
            conditions = [
                str(n.get("Index Cond", ""))
                for n in _nodes(plan)
                if n.get("Index Name") == f"{table}_{index}"
            ]
            assert any("namespace" in c for c in conditions), f"page of {state} ({kind} plan): {plan}"
            assert f"{table}_keys" not in _indexes(plan), (
                f"page of {state} ({kind} plan) walks the keys: {plan}"
            )


def _removal_statements(store: SQLStore) -> dict[str, tuple[Prepared, dict[str, Any]]]:
    """PostgreSQL's removal batches (dibs.stores.sql.removal), with their values."""
    removal = store._set_removal
    one = {"p_namespace": "plans", "p_limit": 1000}
    after = {**one, "p_after_name": "k17"}
    everywhere = {"p_limit": 1000, "p_after_namespace": "plans", "p_after_name": "k17"}
    found: dict[str, tuple[Prepared, dict[str, Any]]] = {}
    for kind in ("prune", "reap"):
        older = {"p_older": 0.0} if kind == "prune" else {}
        found[kind] = (removal.batch(kind, namespace=True, after=False), {**one, **older})
        found[f"{kind} after"] = (removal.batch(kind, namespace=True, after=True), {**after, **older})
        found[f"{kind} everywhere"] = (
            removal.batch(kind, namespace=False, after=True),
            {**everywhere, **older},
        )
    return found


def _window(plan: dict[str, Any]) -> dict[str, Any]:
    """The part of a removal batch's plan that chooses its rows (the CTE ``ahead``)."""
    for child in plan.get("Plans", ()):
        if child.get("Subplan Name") == "CTE ahead":
            return dict(child)
    raise AssertionError(f"no CTE ahead in {plan}")


def _node_types(plan: dict[str, Any]) -> set[str]:
    return {node["Node Type"] for node in _nodes(plan)}


@pytest.mark.parametrize("rows", ["empty", "filled"])
def test_removal_batches_walk_the_keys_index_on_a_table_never_analysed(store: SQLStore, rows: str) -> None:
    """A prune or reap batch (dibs.stores.sql.removal) chooses its rows by walking the keys' index from
    its cursor, never a scan of the table, whatever the table's statistics, and changes them by their
    place in the table (a TID scan). Its statement is never prepared (SQLStore._removal_batch): each
    run is planned for the table as it is then, so only custom plans are made; on the empty table a
    scan of its few pages is as good as the TID scan, and only the choice of rows is checked there."""
    if rows == "filled":
        _fill(store)
    keys = f"{store.table_name}_keys"
    for name, (statement, values) in _removal_statements(store).items():
        plan = _plans(store, statement, values)["custom"]
        window = _window(plan)
        assert not _scans(window) and keys in _indexes(window), f"{name} chooses its rows by {window}"
        if rows == "filled":
            assert not _scans(plan), f"{name} scans the table: {plan}"
            assert "Tid Scan" in _node_types(plan), f"{name} changes its rows by {plan}"


def test_a_dry_run_page_walks_the_keys_in_order_on_a_table_never_analysed(store: SQLStore) -> None:
    """``dibs prune --dry-run`` (SQLStore.prunable_page) reads its candidates by walking the keys'
    index from its cursor, whatever the statistics: the conditions once made the planner gather the
    whole namespace through a bitmap and sort it, for every page. (Run unprepared, like the removal
    batches: only custom plans are made, for the table as it is; on an empty table any plan will do.)"""
    _fill(store)
    admin, keys = store._admin, f"{store.table_name}_keys"
    one = {"p_namespace": "plans", "p_after_name": "", "p_limit": 1001, "p_older": 0.0}
    everywhere = {"p_after_namespace": "plans", "p_after_name": "k17", "p_limit": 1001, "p_older": 0.0}
    for name, statement, values in (
        ("one namespace", admin.removable(namespace=True, kind="prune", after=False), one),
        ("one namespace after", admin.removable(namespace=True, kind="prune", after=True), one),
        ("every namespace", admin.removable(namespace=False, kind="prune", after=True), everywhere),
    ):
        plan = _plans(store, statement, values)["custom"]
        gathered = [n for n in _nodes(plan) if n["Node Type"] in ("Sort", "Bitmap Heap Scan", "Seq Scan")]
        assert not gathered and keys in _indexes(plan), f"{name}: {plan}"


def _fill_finished(store: SQLStore) -> None:
    """:data:`ROWS` keys in one namespace, each done (an artifact made at its own time) and every
    tenth failed before, as a year of daily partitions leaves them; never analysed."""
    _insert_never_analysed(
        store,
        "key_hash, namespace, name, version, fence, attempts, failure_count, serializer, payload, size,"
        " checksum, created_at, failure_at",
        "md5(i::text) || md5(i::text), 'plans', 'k' || i, 1, 1, 1,"
        " CASE WHEN mod(i, 10) = 0 THEN 1 ELSE 0 END, 'json', '\\x31'::bytea, 1, 'sha256:0',"
        " 1.0e9 + i, CASE WHEN mod(i, 10) = 0 THEN 1.0e9 + i - 0.5 END",
    )


@pytest.mark.parametrize("kind", ["artifact", "failure"])
def test_the_latest_are_read_newest_first_from_their_index_not_gathered_and_sorted(
    store: SQLStore, kind: str
) -> None:
    """``dibs top`` and the Reservations page read the namespace's newest artifacts (and failures)
    with ``Store.latest``. On a table never analysed, PostgreSQL guessed 89 finished rows in the
    namespace and planned "all of them through a bitmap, then the top ones sorted": 58 ms at 100,000
    keys, growing with the history. It must walk the artifacts' (failures') index backwards from the
    newest and stop at the limit, whatever the statistics: no sort, no bitmap."""
    _fill_finished(store)
    statement = store._admin.latest(namespace=True, kind=kind)
    index = f"{store.table_name}_{'artifacts' if kind == 'artifact' else 'failures'}"
    for plan_kind, plan in _plans(store, statement, {"p_namespace": "plans", "p_limit": 16}).items():
        gathered = [n for n in _nodes(plan) if n["Node Type"] in ("Sort", "Bitmap Heap Scan", "Seq Scan")]
        walked = [n for n in _nodes(plan) if n.get("Index Name") == index]
        assert not gathered and walked, f"latest {kind} ({plan_kind} plan): {plan}"
        assert all(n["Scan Direction"] == "Backward" for n in walked), plan
    # The rows themselves (the fill's key hashes are not the keys' digests, so Store.latest would
    # skip them as unreadable): the newest three, in order.
    rows = store._admin_rows(statement, {"p_namespace": "plans", "p_limit": 3})
    names = [row["name"] for row in rows]
    step = 1 if kind == "artifact" else 10
    assert names == [f"k{ROWS - step * i}" for i in range(3)]

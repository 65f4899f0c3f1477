"""``dibs top`` and ``dibs ls`` read what they show, not the namespace's history (issue 30).

Counted, never timed: a SQL store's admin reads are wrapped to count the rows they return, and
:meth:`Store.list` (which reads every key) is made to fail. ``top`` on 5,000 finished keys reads as
many rows as on 500; ``ls --limit`` pages through a namespace with a cursor and meets every key once.
"""

from __future__ import annotations

import importlib
import json
import logging
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import dibs
from dibs._cli.top import LEASES, RECENT, render, snapshot
from dibs.keys import Key
from dibs.stores.sql import SQLStore
from tests.cli_harness import dibs as run_dibs

NAMESPACE = "history"


def _grow(store: SQLStore, count: int) -> None:
    """``count`` finished keys, inserted as rows copied from one that dibs wrote (the store's API
    would take seconds per thousand)."""
    client = dibs.Reservations(store, namespace=NAMESPACE)
    client.run("template", lambda: 1)
    with store.engine.begin() as conn:
        template = dict(conn.execute(sa.select(store.t).where(store.t.c.name == "template")).mappings().one())
        rows = []
        for i in range(count - 1):
            key = Key(NAMESPACE, f"day-{i:06d}")
            created = template["created_at"] - 86_400.0 * (i + 1)  # one a day, back in time
            rows.append({**template, "key_hash": key.digest, "name": key.name, "created_at": created})
        conn.execute(sa.insert(store.t), rows)


@pytest.fixture
def counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, list[int]]]:
    """A SQLite store's URL, and the number of rows each admin read of this process returned."""
    returned: list[int] = []
    admin_rows = SQLStore._admin_rows

    def counting(
        self: SQLStore, statement: Any, values: dict[str, Any], **options: Any
    ) -> list[dict[str, Any]]:
        rows = admin_rows(self, statement, values, **options)
        returned.append(len(rows))
        return rows

    monkeypatch.setattr(SQLStore, "_admin_rows", counting)
    yield f"sqlite:///{tmp_path / 'history.db'}", returned


def _top_reads(url: str, returned: list[int], monkeypatch: pytest.MonkeyPatch) -> tuple[int, dict[str, Any]]:
    """How many rows one ``top`` snapshot read, and the snapshot."""
    monkeypatch.setattr(SQLStore, "list", lambda *args: pytest.fail("top listed the whole namespace"))
    returned.clear()
    with dibs.Reservations(url, namespace=NAMESPACE) as client:
        doc = snapshot(client)
    return sum(returned), doc


@pytest.mark.parametrize("keys", [500, 5_000])
def test_top_reads_a_bounded_number_of_records_whatever_the_namespace_size(
    counted: tuple[str, list[int]], monkeypatch: pytest.MonkeyPatch, keys: int
) -> None:
    url, returned = counted
    store = SQLStore(url)
    _grow(store, keys)
    client = dibs.Reservations(store, namespace=NAMESPACE, ttl=600)
    for name in ("held-1", "held-2"):
        client.get_or_reserve(name, owner="worker")
    failing = client.get_or_reserve("broken", owner="flaky")
    assert isinstance(failing, dibs.Acquired)
    failing.lease.release("ValueError: no rows")
    store.close()

    read, doc = _top_reads(url, returned, monkeypatch)
    # The counts' one row, and at most what the screen shows: the same at 500 keys and at 5,000.
    assert read <= 1 + 2 * LEASES + 2 * RECENT
    assert read == 1 + 2 + 0 + RECENT + 1
    assert doc["counts"] == {"held": 2, "expired": 0, "done": keys, "failed": 1}
    assert [row["key"] for row in doc["held"]] == [f"{NAMESPACE}/held-1", f"{NAMESPACE}/held-2"]
    newest = [row["key"] for row in doc["recent_artifacts"]]
    assert newest == [f"{NAMESPACE}/template", *(f"{NAMESPACE}/day-{i:06d}" for i in range(RECENT - 1))]


def test_counts_stop_at_their_cap_and_top_says_at_least(tmp_path: Path) -> None:
    """Counting is bounded too: past the cap, the screen says how many at least."""
    url = f"sqlite:///{tmp_path / 'cap.db'}"
    store = SQLStore(url)
    _grow(store, 30)
    assert store.count_states(NAMESPACE, up_to=25)["done"] == 25
    assert store.count_states(NAMESPACE)["done"] == 30
    store.close()
    with dibs.Reservations(url, namespace=NAMESPACE) as client:
        doc = {**snapshot(client), "counted_up_to": 30}
    assert "done 30+" in render(doc, None)


def _ls(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_dibs("ls", "-n", NAMESPACE, *args, store=url)


def test_ls_pages_with_a_cursor_and_meets_every_key_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ls.db'}"
    store = SQLStore(url)
    _grow(store, 25)
    dibs.Reservations(store, namespace=NAMESPACE, ttl=600).get_or_reserve("held-1", owner="worker")
    store.close()
    everything = [row["key"] for row in json.loads(_ls(url, "--json").stdout)]
    assert len(everything) == 26 and everything == sorted(everything)

    seen: list[str] = []
    after: list[str] = []
    for _ in range(10):
        result = _ls(url, "--jsonl", "--limit", "7", *after)
        lines = [json.loads(line) for line in result.stdout.splitlines()]
        if lines and "after" in lines[-1]:
            seen.extend(row["key"] for row in lines[:-1])
            assert len(lines) == 8 and f"--after {lines[-1]['after']}" in result.stderr
            after = ["--after", lines[-1]["after"]]
        else:
            seen.extend(row["key"] for row in lines)
            assert "more keys follow" not in result.stderr
            break
    assert seen == everything

    held = [row["key"] for row in json.loads(_ls(url, "--json", "--state", "held").stdout)]
    assert held == ["held-1"]
    table = _ls(url, "--state", "done", "--limit", "3").stdout.splitlines()
    assert table[0].split()[:3] == ["NAMESPACE", "KEY", "STATUS"] and len(table) == 4
    pruned = run_dibs("prune", "-n", NAMESPACE, "--older-than", "0", "--json", store=url)
    assert json.loads(pruned.stdout) == {"pruned": 25} and pruned.stderr == ""  # no progress off a terminal
    bad = run_dibs("ls", "--after", "not-a-cursor", store=url, check=False)
    assert bad.returncode != 0 and "is not a listing cursor" in bad.stderr, bad.stderr


@pytest.fixture(params=["sqlite", "postgres", "mysql"])
def sql_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An isolated URL on each SQL database."""
    module = importlib.import_module(f"tests.backends.{request.param}")
    with module.isolated_url(tmp_path) as url:
        yield url


def test_prune_and_reap_remove_by_batches_keeping_every_fence(
    sql_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One statement per batch of keys, not one per key; progress told per batch; every pruned key
    keeps its row and fence (its next holder gets token 2). PostgreSQL decides in the statement
    (dibs.stores.sql.removal: one per window of keys, no row read); the others read a batch of
    candidates, then change it."""
    from dibs.stores.sql.store import REMOVAL_BATCH

    store = SQLStore(sql_url)
    in_sql = store.dialect == "postgresql"
    keys = 2 * REMOVAL_BATCH + 500
    _grow(store, keys)
    statements: list[int] = []
    read: list[int] = []
    if in_sql:
        removal_batch = SQLStore._removal_batch

        def batch(self: SQLStore, statement: Any, values: dict[str, Any]) -> dict[str, Any]:
            done = removal_batch(self, statement, values)
            statements.append(int(done["changed"]))
            return done

        monkeypatch.setattr(SQLStore, "_removal_batch", batch)
        monkeypatch.setattr(SQLStore, "_removal_rows", lambda *a: pytest.fail("PostgreSQL read rows"))
    else:
        change_rows, removal_rows = SQLStore._change_rows, SQLStore._removal_rows

        def counting(self: SQLStore, change: str, pairs: Any, older_than: float) -> int:
            changed = change_rows(self, change, pairs, older_than)
            if pairs:
                statements.append(changed)
            return changed

        def reading(self: SQLStore, statement: Any, values: dict[str, Any]) -> list[dict[str, Any]]:
            rows = removal_rows(self, statement, values)
            read.append(len(rows))
            return rows

        monkeypatch.setattr(SQLStore, "_change_rows", counting)
        monkeypatch.setattr(SQLStore, "_removal_rows", reading)
    told: list[int] = []
    client = dibs.Reservations(store, namespace=NAMESPACE, ttl=600)
    held = client.get_or_reserve("held-now", owner="worker")
    assert isinstance(held, dibs.Acquired)
    assert client.prune(0.0, progress=told.append) == keys  # everything old but the live lease
    assert statements == [REMOVAL_BATCH, REMOVAL_BATCH, 500]
    assert read == ([] if in_sql else [REMOVAL_BATCH, REMOVAL_BATCH, 500])  # the candidates only
    assert told == [REMOVAL_BATCH, 2 * REMOVAL_BATCH, keys]
    assert store.count_states(NAMESPACE) == {"held": 1, "expired": 0, "done": 0, "failed": 0}
    with store.engine.connect() as conn:  # no row was deleted: each is a tombstone with its fence
        rows = conn.execute(
            sa.select(store.t.c.fence, store.t.c.attempts).where(store.t.c.name != "held-now")
        )
        assert (
            sorted(set(rows)) == [(1, 0)]
            and conn.execute(sa.select(sa.func.count()).select_from(store.t)).scalar() == keys + 1
        )
    again = client.get_or_reserve("day-000001", owner="next")
    assert isinstance(again, dibs.Acquired) and again.lease.token == 2
    again.lease.release()
    statements.clear()
    assert client.reap() == 1  # the released key, holding nothing, becomes a tombstone
    # PostgreSQL walks every key (three windows; the first holds the released one); the others read
    # the one candidate and change it.
    assert statements == ([1, 0, 0] if in_sql else [1])
    assert client.prune(0.0) == 0 and client.reap() == 0
    held.lease.release()
    store.close()


def test_a_store_that_scans_answers_top_from_one_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``top`` on a store without indexes (memory; files before their index is built) reads the
    namespace once per refresh, not once per part of the screen, and shows what the five separate
    reads show."""
    from dibs.stores.memory import MemoryStore

    store = MemoryStore()
    assert store.scans and not SQLStore(f"sqlite:///{tmp_path / 'any.db'}").scans
    client = dibs.Reservations(store, namespace=NAMESPACE, ttl=600)
    for i in range(12):
        client.run(f"day-{i:02d}", lambda: 1)
    client.get_or_reserve("held-1", owner="worker")
    failing = client.get_or_reserve("broken", owner="flaky")
    assert isinstance(failing, dibs.Acquired)
    failing.lease.release("ValueError: no rows")
    separately = {
        "counts": store.count_states(NAMESPACE),
        "held": store.leases(NAMESPACE, expired=False, limit=LEASES),
        "artifacts": store.latest(NAMESPACE, "artifact", limit=RECENT),
        "failures": store.latest(NAMESPACE, "failure", limit=RECENT),
    }
    listings: list[str | None] = []
    listed = MemoryStore.list

    def counting(self: MemoryStore, namespace: str | None = None) -> Any:
        listings.append(namespace)
        return listed(self, namespace)

    monkeypatch.setattr(MemoryStore, "list", counting)
    doc = snapshot(client)
    assert listings == [NAMESPACE]
    assert doc["counts"] == separately["counts"] == {"held": 1, "expired": 0, "done": 12, "failed": 1}
    assert [row["key"] for row in doc["held"]] == [str(s.key) for s in separately["held"]]
    assert [row["key"] for row in doc["recent_artifacts"]] == [str(s.key) for s in separately["artifacts"]]
    assert [row["key"] for row in doc["recent_failures"]] == [str(s.key) for s in separately["failures"]]


def test_prune_leaves_a_damaged_row_as_it_is(sql_url: str) -> None:
    """A row dibs cannot read (at another key's address; with half a lease; with failures counted but
    none recorded) is not pruned: removal skips what it cannot read, as a listing does, and leaves it
    to be looked at."""
    store = SQLStore(sql_url)
    _grow(store, 3)
    with store.engine.begin() as conn:
        template = dict(conn.execute(sa.select(store.t).where(store.t.c.name == "template")).mappings().one())
        foreign = {**template, "name": "foreign"}  # its key_hash is the template's key's, not its own
        foreign["key_hash"] = Key(NAMESPACE, "elsewhere").digest
        half = {**template, "key_hash": Key(NAMESPACE, "half").digest, "name": "half", "owner": "someone"}
        counted = {**template, "key_hash": Key(NAMESPACE, "counted").digest, "name": "counted"}
        counted["failure_count"] = 2  # failures counted, none recorded
        conn.execute(sa.insert(store.t), [foreign, half, counted])

    def damaged() -> list[Any]:
        with store.engine.connect() as conn:
            names = store.t.c.name.in_(["foreign", "half", "counted"])
            return list(conn.execute(sa.select(store.t).where(names).order_by(store.t.c.name)))

    before = damaged()
    assert store.prune(NAMESPACE, 0.0) == 3  # the template and its two copies
    assert damaged() == before
    store.close()


def _in_process(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``dibs ARGV`` run in this process (so that the store's reads are counted): status, out, err."""
    from dibs.cli import main

    logger = logging.getLogger("dibs")  # main routes dibs's log to its console: put it back after
    kept = (list(logger.handlers), logger.level, logger.propagate)
    capsys.readouterr()
    try:
        status = main(list(argv))
    finally:
        logger.handlers[:], logger.level, logger.propagate = kept
    out, err = capsys.readouterr()
    return status, out, err


def test_prune_dry_run_reads_the_candidates_page_by_page(
    counted: tuple[str, list[int]], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``prune --dry-run`` asks the store for what prune would clear (Store.prunable_page), never for
    the namespace: of 3,000 finished keys, one a day back in time (the oldest 2,999 days), the ten
    older than 2,990 days are the rows it reads, streamed as found."""
    url, returned = counted
    store = SQLStore(url)
    _grow(store, 3000)
    store.close()
    monkeypatch.setattr(SQLStore, "list", lambda *args: pytest.fail("the dry run listed the namespace"))
    returned.clear()
    argv = ["prune", "--store", url, "-n", NAMESPACE, "--older-than", "2990d", "--dry-run", "--json"]
    status, out, _err = _in_process(capsys, *argv)
    doomed = json.loads(out)["would_prune"]
    assert status == 0 and doomed == [f"{NAMESPACE}/day-{i:06d}" for i in range(2989, 2999)]
    assert sum(returned) == len(doomed)  # the page's rows: nothing else of the namespace
    status, out, _err = _in_process(capsys, *argv[:-1])  # the table
    assert out.splitlines()[-1] == "would prune 10 record(s) older than 2990d 0h (dry run: nothing removed)"
    assert len(out.splitlines()) == 1 + 10 + 1  # header, the keys, the sum
    returned.clear()
    _in_process(capsys, "prune", "--store", url, "-n", NAMESPACE, "--older-than", "0", "--dry-run")
    assert returned == [1001, 1001, 1000]  # every key a candidate: pages of 1,000 and one to see more


def test_a_readable_name_is_looked_up_from_its_prefix(
    counted: tuple[str, list[int]], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``show``, ``forget`` and ``ls PATTERN`` find the keys a name names by pages from just before
    its prefix, and stop past it: what they read grows with the keys the prefix names, not with the
    namespace (3,000 keys here)."""
    url, returned = counted
    store = SQLStore(url)
    _grow(store, 3000)
    client = dibs.Reservations(store, namespace=NAMESPACE)
    names = ["slow_compute@1/0140aa", "slow_compute@1/0150bb", "slow_compute@2/0160cc", "slow_computer"]
    for name in names:
        client.run(name, lambda: 1)
    store.close()
    monkeypatch.setattr(SQLStore, "list", lambda *args: pytest.fail("the lookup listed the namespace"))

    def run(*argv: str) -> tuple[int, str, str]:
        returned.clear()
        return _in_process(capsys, argv[0], "--store", url, "-n", NAMESPACE, *argv[1:])

    status, out, _err = run("show", "slow_compute@2", "--json")
    assert status == 0 and json.loads(out)["key"] == f"{NAMESPACE}/slow_compute@2/0160cc"
    # The names after the prefix "slow_compute@2" up to the first past it ("slow_computer"), and the
    # few a first page of 16 reads beyond: never the namespace.
    assert sum(returned) <= 16 + 1
    status, out, err = run("forget", "slow_compute")
    assert status != 0 and "names 3 keys" in err, err
    assert sum(returned) <= 16 + 1
    status, out, _err = run("ls", "slow_compute", "--json")
    assert [row["key"] for row in json.loads(out)] == names[:3]
    assert sum(returned) <= 16 + 1
    status, out, _err = run("ls", "slow_comp*", "--json")
    assert [row["key"] for row in json.loads(out)] == names
    assert sum(returned) <= 16 + 1
    status, out, _err = run("show", "day-00299[8]", "--json")  # a glob whose prefix names nine keys
    assert status == 0 and json.loads(out)["key"] == f"{NAMESPACE}/day-002998"  # the one of them there
    assert sum(returned) <= 16 + 1


def test_a_store_that_scans_streams_every_page_from_one_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dibs ls`` and ``prune --dry-run`` on a store without indexes read its listing once, however
    many pages they print (a page at a time re-read the whole namespace for each: 105 records/s at
    100,000 keys on files), and give the pages a page at a time gives."""
    from dibs.stores.filesystem import FileStore

    store = FileStore(str(tmp_path / "files"))
    client = dibs.Reservations(store, namespace=NAMESPACE, ttl=600)
    for i in range(25):
        client.run(f"day-{i:02d}", lambda: 1)
    client.get_or_reserve("held-1", owner="worker")
    one_at_a_time = []
    after: str | None = None
    while True:
        page = store.list_page(NAMESPACE, after=after, limit=7)
        one_at_a_time.append([s.key for s in page.states])
        if page.after is None:
            break
        after = page.after
    listings: list[str | None] = []
    listed = FileStore.list

    def counting(self: FileStore, namespace: str | None = None) -> Any:
        listings.append(namespace)
        return listed(self, namespace)

    monkeypatch.setattr(FileStore, "list", counting)
    streamed = [[s.key for s in page.states] for page in store.list_pages(NAMESPACE, limit=7)]
    assert streamed == one_at_a_time and len(streamed) == 4
    assert listings == [NAMESPACE]
    doomed = [s.key for page in store.prunable_pages(NAMESPACE, 0.0, limit=7) for s in page.states]
    assert listings == [NAMESPACE, NAMESPACE]
    assert len(doomed) == 25 and Key(NAMESPACE, "held-1") not in doomed


def test_pages_that_grow_read_little_for_a_lookup_that_ends_soon(tmp_path: Path) -> None:
    """A store that finds pages without a scan is asked for pages from ``first`` doubling to ``limit``."""
    url = f"sqlite:///{tmp_path / 'grow.db'}"
    store = SQLStore(url)
    _grow(store, 100)
    sizes = [len(page.states) for page in store.list_pages(NAMESPACE, limit=40, first=5)]
    assert sizes == [5, 10, 20, 40, 25]
    store.close()


def test_a_store_written_before_the_page_hook_is_read_through_its_own_overrides(tmp_path: Path) -> None:
    """A store that overrides ``list_page`` and ``prunable_page`` itself (the hooks before
    :meth:`Store.page`), built on the page helpers' keywords, is read through its overrides by
    ``list_pages``, ``prunable_pages`` and a payload-referencing store around it, not by a scan."""
    from dibs.payloads import ReferencingStore, open_payload_store
    from dibs.stores import pages
    from dibs.stores.memory import MemoryStore

    class Legacy(MemoryStore):
        calls: list[str]

        @property
        def scans(self) -> bool:  # finds its pages itself
            return False

        def list_page(
            self,
            namespace: str | None,
            *,
            state: str | None = None,
            after: str | None = None,
            limit: int = 100,
        ) -> pages.Page:
            self.calls.append("list_page")
            return pages.page_of(self.list(namespace), state=state, after=after, limit=limit)

        def prunable_page(
            self, namespace: str | None, older_than: float, *, after: str | None = None, limit: int = 100
        ) -> pages.Page:
            self.calls.append("prunable_page")
            return pages.page_of(
                self.list(namespace), after=after, limit=limit, keep=lambda s: s.status == "done"
            )

    store = Legacy()
    store.calls = []
    client = dibs.Reservations(store, namespace=NAMESPACE, ttl=600)
    for i in range(9):
        client.run(f"day-{i}", lambda: 1)
    client.get_or_reserve("held", owner="worker")

    listed = [s.key.name for page in store.list_pages(NAMESPACE, state="done", limit=4) for s in page.states]
    assert listed == [f"day-{i}" for i in range(9)] and store.calls == ["list_page"] * 3
    store.calls.clear()
    doomed = [s.key.name for page in store.prunable_pages(NAMESPACE, 0.0, limit=5) for s in page.states]
    assert doomed == [f"day-{i}" for i in range(9)] and store.calls == ["prunable_page"] * 2
    store.calls.clear()
    wrapped = ReferencingStore(store, open_payload_store((tmp_path / "payloads").as_uri()))
    held = wrapped.list_page(NAMESPACE, state="held")
    assert [s.key.name for s in held.states] == ["held"] and store.calls == ["list_page"]


def test_a_page_of_what_prune_would_clear_takes_no_state() -> None:
    """Prune chooses by age and by what a record holds, not by status: a query asking for both is
    refused, naming both, before any store reads anything."""
    from dibs.errors import ConfigurationError
    from dibs.stores import pages

    with pytest.raises(ConfigurationError, match=r"older_than=60\.0.*state='done'"):
        pages.Query("ns", state="done", older_than=60.0)

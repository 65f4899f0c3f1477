"""What PgBouncer, and the choices dibs makes to work behind it, cost (issue 29): every figure a ratio
against a baseline measured in the same run, interleaved with it.

``python -m benchmarks.pooling [--ops 400] [--rounds 30] [--out benchmarks/results/issue29]``

On the PostgreSQL server of the benchmarks (``DIBS_BENCH_POSTGRES_URL``, else ``DIBS_TEST_POSTGRES_URL``,
else loopback), in a fresh schema, and through PgBouncer 1.18 with stock settings started here in
front of it (``scripts/install-pgbouncer.sh``; skipped, and said so, without it):

1. **The store's settings, on the server itself.** ``store.acquire`` + ``store.complete`` of a fresh
   key, three stores interleaved operation by operation: the URL as it is (``lock_timeout`` sent at
   connect, psycopg's prepared statements: the baseline), ``?pooler=session`` (nothing sent at
   connect, statements still prepared: what dropping the startup option costs per call) and
   ``?pooler=transaction`` (nothing at connect, no prepared statements: what ``prepare_threshold=None``
   costs).
2. **Where else a lock bound could go.** The store's own two statements (its read-or-insert and its
   ``complete``) on one psycopg connection each, interleaved: in autocommit as the store sends them
   (the baseline), the same without prepared statements, and each statement in a transaction that
   sets the bound first (``BEGIN; SET LOCAL lock_timeout; ...; COMMIT``, what a pooler would pass
   on), once as four round trips and once pipelined (psycopg's pipeline mode: one network round trip,
   four statements for the server).
3. **Through PgBouncer.** Section 1's operation directly (the baseline), through transaction pooling
   and through session pooling (each URL without ``?pooler=``: the store finds out, and stops
   preparing), and through session pooling with ``?pooler=session`` (preparing).
4. **Hand-off.** The holder (this process) completes a fresh key 50-250 ms after one waiter process
   began to wait in ``Reservations.acquire``; from the ``complete`` call to the waiter's return.
   Directly (``LISTEN`` on the server: the baseline), through session pooling (``LISTEN`` through
   PgBouncer), through transaction pooling with ``?listen_url=`` (``LISTEN`` on the server), and
   through transaction pooling without it (the listener hears nothing, says so once, and waiters poll).

Nothing here is a threshold: the machine may be busy, so compare ratios of one run, not runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import dibs
from benchmarks import handoff
from benchmarks.pool import Pool
from benchmarks.settings import SMOKE
from benchmarks.stats import ratio, summarize
from benchmarks.targets import Target, _service_url
from dibs.records import Granted, checksum, new_lease_id
from dibs.stores import AcquireRequest, NewArtifact
from dibs.stores.sql import SQLStore

PAYLOAD = dibs.JSONSerializer().dumps({"path": "s3://bucket/features/part-00000.parquet", "rows": 123456})
DIGEST = checksum(PAYLOAD)
NAMESPACE = "bench.pooling"


def _timed(kinds: dict[str, Callable[[str], None]], ops: int, warmup: int = 20) -> dict[str, list[float]]:
    """Each kind's operation on fresh keys, interleaved one operation at a time (order alternating)."""
    run_id = uuid.uuid4().hex[:8]
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    names = list(kinds)
    for number in range(warmup + ops):
        for kind in names if number % 2 == 0 else reversed(names):
            key = f"{run_id}-{kind}-{number}"
            started = time.perf_counter()
            kinds[kind](key)
            if number >= warmup:
                times[kind].append(time.perf_counter() - started)
    return times


def _table(times: dict[str, list[float]], baseline: str) -> list[dict[str, Any]]:
    rows = []
    for kind, values in times.items():
        summary = summarize(values)
        rows.append(
            {
                "kind": kind,
                "n": summary.n,
                "p50_us": summary.median * 1e6,
                "p99_us": summary.p99 * 1e6,
                "ratio": ratio(summary.median, summarize(times[baseline]).median),
            }
        )
    return rows


def _store_op(store: SQLStore) -> Callable[[str], None]:
    def op(name: str) -> None:
        key = dibs.Key(NAMESPACE, name)
        outcome = store.acquire(key, AcquireRequest("bench", 60.0))
        assert isinstance(outcome, Granted)
        store.complete(key, outcome.lease.token, NewArtifact("json", PAYLOAD, DIGEST))

    return op


def _with_query(url: str, **query: str) -> str:
    return url + ("&" if "?" in url else "?") + "&".join(f"{name}={value}" for name, value in query.items())


def store_settings(url: str, ops: int) -> dict[str, Any]:
    """Section 1 (see the module docstring)."""
    kinds = {
        "server (lock_timeout at connect, prepared)": url,
        "pooler=session (nothing at connect, prepared)": _with_query(url, pooler="session"),
        "pooler=transaction (nothing at connect, not prepared)": _with_query(url, pooler="transaction"),
    }
    stores = {kind: SQLStore(each) for kind, each in kinds.items()}
    try:
        times = _timed({kind: _store_op(store) for kind, store in stores.items()}, ops)
    finally:
        for store in stores.values():
            store.close()
    return {"ops": ops, "rows": _table(times, next(iter(kinds)))}


def lock_bound_alternatives(url: str, ops: int) -> dict[str, Any]:
    """Section 2 (see the module docstring)."""
    import psycopg

    store = SQLStore(url)
    store._ensure_ready()
    libpq = store._url.set(drivername="postgresql").render_as_string(hide_password=False)
    read_or_insert, complete = store._read_or_insert, store._complete
    assert read_or_insert is not None
    bound = f"SET LOCAL lock_timeout = {round(store.timeout * 800)}"

    def statements(key: str) -> list[tuple[str, Any]]:
        lease_id = new_lease_id()
        digest = dibs.Key(NAMESPACE, key).digest
        first = {
            "p_key_hash": digest,
            "p_namespace": NAMESPACE,
            "p_name": key,
            "p_owner": "bench",
            "p_lease_id": lease_id,
            "p_span": 60.0,
            "p_max_lease_age": None,
            "p_ttl": 60.0,
        }
        second = {
            "p_key_hash": digest,
            "p_fence": 1,
            "p_lease_id": lease_id,
            "p_namespace": NAMESPACE,
            "p_name": key,
            "p_serializer": "json",
            "p_payload": PAYLOAD,
            "p_size": len(PAYLOAD),
            "p_checksum": DIGEST,
            "p_compute_seconds": 0.001,
        }
        return [
            (read_or_insert.sql, read_or_insert.parameters(first)),
            (complete.sql, complete.parameters(second)),
        ]

    connections = {name: psycopg.connect(libpq, autocommit=True) for name in ("a", "b", "c", "d")}
    connections["b"].prepare_threshold = None

    def autocommit(conn: Any) -> Callable[[str], None]:
        def op(key: str) -> None:
            with conn.cursor() as cursor:
                for sql, parameters in statements(key):
                    cursor.execute(sql, parameters)
                    assert len(cursor.fetchall()) == 1

        return op

    def set_local(conn: Any, *, pipelined: bool) -> Callable[[str], None]:
        def op(key: str) -> None:
            with conn.cursor() as cursor:
                for sql, parameters in statements(key):
                    with conn.pipeline() if pipelined else ExitStack(), conn.transaction():
                        cursor.execute(bound)
                        cursor.execute(sql, parameters)
                    assert len(cursor.fetchall()) == 1

        return op

    kinds = {
        "autocommit, prepared (what the store sends)": autocommit(connections["a"]),
        "autocommit, not prepared": autocommit(connections["b"]),
        "BEGIN; SET LOCAL lock_timeout; statement; COMMIT": set_local(connections["c"], pipelined=False),
        "the same, pipelined (one network round trip)": set_local(connections["d"], pipelined=True),
    }
    try:
        times = _timed(kinds, ops)
    finally:
        for conn in connections.values():
            conn.close()
        store.close()
    return {"ops": ops, "rows": _table(times, next(iter(kinds)))}


@contextmanager
def _bouncers(server_url: str) -> Iterator[dict[str, Any] | str]:
    """PgBouncer in both modes in front of the server (tests/postgres_servers.py); the reason if not."""
    try:
        from tests import postgres_servers
    except ImportError as exc:  # pragma: no cover - run from the repository
        yield f"tests/postgres_servers.py cannot be imported: {exc}"
        return
    binary = (
        os.environ.get(postgres_servers.PGBOUNCER_ENV) or shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    )
    if not Path(binary).is_file():
        yield f"PgBouncer is not installed ({postgres_servers.INSTALL_HINT})"
        return
    with (
        postgres_servers.PgBouncer(server_url, "transaction") as transaction,
        postgres_servers.PgBouncer(server_url, "session") as session,
    ):
        yield {"transaction": transaction, "session": session}


def _through(bouncer: Any, direct: str, **query: str) -> str:
    from tests.backends.pgbouncer import through

    url = through(bouncer, direct)
    return _with_query(url, **query) if query else url


def through_pgbouncer(direct: str, bouncers: dict[str, Any], ops: int) -> dict[str, Any]:
    """Section 3 (see the module docstring)."""
    kinds = {
        "server itself": direct,
        "PgBouncer, transaction pooling": _through(bouncers["transaction"], direct),
        "PgBouncer, session pooling": _through(bouncers["session"], direct),
        "PgBouncer, session pooling, ?pooler=session (prepared)": _through(
            bouncers["session"], direct, pooler="session"
        ),
    }
    stores = {kind: SQLStore(each) for kind, each in kinds.items()}
    try:
        times = _timed({kind: _store_op(store) for kind, store in stores.items()}, ops)
        prepares = {
            kind: bool(store.server_end and store.server_end.prepares) for kind, store in stores.items()
        }
    finally:
        for store in stores.values():
            store.close()
    rows = _table(times, "server itself")
    for row in rows:
        row["prepared"] = prepares[row["kind"]]
    return {"ops": ops, "rows": rows}


def handoffs(direct: str, bouncers: dict[str, Any] | None, rounds: int) -> dict[str, Any]:
    """Section 4 (see the module docstring): one waiter process per topology, rounds interleaved."""
    from sqlalchemy.engine import make_url

    urls = {"server itself (LISTEN on the server)": direct}
    if bouncers is not None:
        server = make_url(direct).set(drivername="postgresql", query={}).render_as_string(hide_password=False)
        urls |= {
            "PgBouncer session pooling (LISTEN through it)": _through(bouncers["session"], direct),
            "PgBouncer transaction pooling + listen_url": _through(
                bouncers["transaction"], direct, listen_url=server
            ),
            "PgBouncer transaction pooling, no listen_url (waiters poll)": _through(
                bouncers["transaction"], direct
            ),
        }
    settings = dataclasses.replace(SMOKE, handoff_hold=(0.05, 0.25))
    rng = random.Random(29)
    pools = {kind: Pool(1) for kind in urls}
    holders: list[dibs.Reservations] = []
    series = {}
    try:
        for kind, url in urls.items():
            target = Target(name="postgres", label=kind, url=url, pushes=True, push_how=kind)
            series[kind], holder = handoff._dibs(pools[kind], target, "push", 1, settings=settings, rng=rng)
            holders.append(holder)
        summaries = handoff._interleaved(list(series.values()), rounds)
    finally:
        for holder in holders:
            holder.close()
        for pool in pools.values():
            pool.close()
    baseline = summaries[0]["latency_ms"]["median"]
    rows = []
    for kind, summary in zip(urls, summaries, strict=True):
        latency = summary["latency_ms"]
        rows.append(
            {
                "kind": kind,
                "rounds": summary["rounds"],
                "p50_ms": latency["median"],
                "p99_ms": latency["p99"],
                "ratio": ratio(latency["median"], baseline),
            }
        )
    return {"rounds": rounds, "rows": rows}


def _markdown(results: dict[str, Any]) -> str:
    lines = [
        "# PgBouncer and the PostgreSQL store's settings (issue 29)",
        "",
        f"`python -m benchmarks.pooling --ops {results['ops']} --rounds {results['rounds']}`, "
        f"{results['when']}, PostgreSQL at `{results['server']}`"
        + (f", PgBouncer {results['pgbouncer_version']}" if results.get("pgbouncer_version") else "")
        + ". Every ratio is against the first row of its table, measured in the same run, interleaved.",
        "",
    ]
    titles = {
        "store_settings": "1. The store's settings, on the server itself (acquire + complete of a fresh key)",
        "lock_bound": "2. Where else a lock bound could go (the store's two statements, on one connection)",
        "pgbouncer": "3. Through PgBouncer (acquire + complete of a fresh key)",
    }
    for section, title in titles.items():
        data = results.get(section)
        if isinstance(data, str):
            lines += [f"## {title}", "", f"Not measured: {data}", ""]
            continue
        if data is None:
            continue
        lines += [
            f"## {title}",
            "",
            f"{data['ops']} operations each.",
            "",
            "| kind | p50 µs | p99 µs | p50 ratio |",
        ]
        lines.append("| --- | --- | --- | --- |")
        for row in data["rows"]:
            lines.append(
                f"| {row['kind']} | {row['p50_us']:.0f} | {row['p99_us']:.0f} | {row['ratio']:.2f}x |"
            )
        lines.append("")
    data = results.get("handoff")
    if data is not None:
        lines += [
            "## 4. Hand-off (one waiter process, from `complete` to the waiter's return)",
            "",
            f"{data['rounds']} rounds each.",
            "",
            "| topology | p50 ms | p99 ms | p50 ratio |",
            "| --- | --- | --- | --- |",
        ]
        for row in data["rows"]:
            lines.append(
                f"| {row['kind']} | {row['p50_ms']:.1f} | {row['p99_ms']:.1f} | {row['ratio']:.2f}x |"
            )
        lines.append("")
    return "\n".join(lines)


@contextmanager
def _schema(server_url: str) -> Iterator[str]:
    import psycopg

    schema = f"dibs_bench_{uuid.uuid4().hex[:12]}"
    try:
        yield _with_query(server_url, schema=schema)
    finally:
        libpq = server_url.replace("postgresql+psycopg://", "postgresql://", 1)
        with psycopg.connect(libpq, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pooling", description=__doc__.split("\n")[0])
    parser.add_argument("--ops", type=int, default=400, help="operations per kind in sections 1-3")
    parser.add_argument("--rounds", type=int, default=30, help="hand-off rounds per topology")
    parser.add_argument("--out", type=Path, default=None, help="folder for pooling.md and pooling.json")
    args = parser.parse_args(argv)
    server_url = _service_url("postgres")
    results: dict[str, Any] = {
        "ops": args.ops,
        "rounds": args.rounds,
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "server": dibs.stores.redact_url(server_url),
    }
    with _schema(server_url) as direct:
        print("1. the store's settings on the server itself", file=sys.stderr)
        results["store_settings"] = store_settings(direct, args.ops)
        print("2. where else a lock bound could go", file=sys.stderr)
        results["lock_bound"] = lock_bound_alternatives(direct, args.ops)
        with _bouncers(server_url) as bouncers:
            if isinstance(bouncers, str):
                results["pgbouncer"] = bouncers
            else:
                import subprocess

                version = subprocess.run(
                    [str(bouncers["session"].binary), "--version"],
                    capture_output=True,
                    text=True,
                    check=False,
                )
                results["pgbouncer_version"] = (
                    version.stdout.split("\n")[0].removeprefix("PgBouncer ").strip()
                )
                print("3. through PgBouncer", file=sys.stderr)
                results["pgbouncer"] = through_pgbouncer(direct, bouncers, args.ops)
            print("4. hand-off", file=sys.stderr)
            results["handoff"] = handoffs(
                direct, None if isinstance(bouncers, str) else bouncers, args.rounds
            )
    report = _markdown(results)
    print(report)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "pooling.md").write_text(report + "\n")
        (args.out / "pooling.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``RESULTS.md`` (goals first, then each benchmark's detail) and ``handoff.png`` from the results."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.stats import lag_text
from benchmarks.targets import ALL_STORES, EXTRA_STORES

__all__ = ["write"]

_SHORT = {
    "sqlite": "SQLite",
    "sqlite-full": "SQLite FULL",
    "postgres": "PostgreSQL",
    "mysql": "MariaDB",
    "redis": "Redis",
    "azure": "Azurite",
    "file": "Files",
}
YES, NO = "✅", "❌"
#: Stores whose watch hub is woken by the store (or by a probe of shared memory or ``stat``): the
#: hand-off goal of 10 ms is theirs. MySQL's hub polls the store (every 25 ms), Azure's too (50 ms to 1 s).
PUSHING = frozenset({"sqlite", "postgres", "redis", "file"})
#: The stores the fan-in goals name (the others are measured for information).
FANIN_GOAL_STORES = frozenset({"postgres", "redis", "sqlite"})


def _num(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def _worst_lag(*values: float | None) -> float | None:
    """The worst of the measured lags (``None``: that window had no tick), ``None`` if none was."""
    return max((value for value in values if value is not None), default=None)


def _mark(ok: bool | None) -> str:
    return "" if ok is None else f" {YES if ok else NO}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return [*lines, ""]


def _ok(results: dict[str, Any], name: str) -> dict[str, Any] | None:
    found = results["benchmarks"].get(name)
    return found if found and "error" not in found else None


# -- the goals table -------------------------------------------------------------------------------


def _goal_rows(results: dict[str, Any], stores: list[str]) -> list[list[str]]:
    rows: list[list[str]] = []

    def row(number: str, what: str, goal: str, cells: dict[str, str]) -> None:
        rows.append([number, what, goal, *(cells.get(store, "-") for store in stores)])

    overhead = _ok(results, "overhead")
    if overhead:
        for kind, what in (
            ("store", "reserve + complete, store interface, vs raw primitive (median)"),
            ("client", "reserve + complete, client (`get_or_reserve` + `complete`), vs raw"),
        ):
            row(
                "1",
                what,
                "≤ 1.5x",
                {
                    store: f"{_num(data['ratio'][kind])}x{_mark(data['ratio'][kind] <= 1.5)}"
                    for store, data in overhead.items()
                    if isinstance(data, dict) and "ratio" in data
                },
            )
    observing = _ok(results, "observing")
    if observing:
        _observing_goals(row, observing)
    handoff = _ok(results, "handoff")
    if handoff:
        counts = sorted(int(n) for n in results["settings"]["handoff_waiters"])
        first, last = str(counts[0]), str(counts[-1])
        cells, scaling = {}, {}
        anchor: dict[str, dict[str, str]] = {kind: {} for kind in handoff.get("anchors", {})}
        for store, modes in handoff["stores"].items():
            mode = "push" if "push" in modes else "poll"
            p50 = modes[mode][first]["latency_ms"]["median"]
            pushing = mode == "push" and store in PUSHING
            note = "" if pushing else (" (hub polls)" if mode == "push" else " (no hub)")
            cells[store] = f"{_num(p50, 1)} ms{_mark(p50 <= 10 if pushing else None)}{note}"
            ratio = modes[mode]["scaling"]
            scaling[store] = f"{_num(ratio)}x{_mark(ratio <= 2)}"
            for kind, vs in modes[mode][first].get("vs_anchor", {}).items():
                anchor[kind][store] = f"{_num(vs)}x"
        row("2", f"hand-off p50, watch hub, N={first} waiter", "≤ 10 ms", cells)
        row("2", f"hand-off p50, N={last} waiters / N={first}", "≤ 2x", scaling)
        _raw_goal_rows(handoff, first, last, row)
        for kind, per_kind in handoff.get("anchors", {}).items():
            median = per_kind.get(first, {}).get("latency_ms", {}).get("median")
            if median is not None:
                row(
                    "2",
                    f"hand-off p50 vs {per_kind['label']} ({_num(median, 1)} ms), N={first}",
                    "< 1x",
                    anchor[kind],
                )
    contention = _ok(results, "contention")
    if contention:
        row(
            "3",
            f"throughput, {contention['processes']} processes x {contention['keys']} keys"
            f"{_fewer(contention)} (shuffled), vs raw",
            "≥ 50 %",
            {
                store: f"{data['shuffled']['ratio']:.0%}{_mark(data['shuffled']['ratio'] >= 0.5)}"
                for store, data in contention["stores"].items()
            },
        )
    takeover = _ok(results, "takeover")
    if takeover:
        ttl = takeover["ttl_s"]
        row(
            "4",
            f"takeover after SIGKILL: worst of {results['settings']['takeover_repeats']} minus the ttl "
            f"({ttl:g} s; heartbeat every {ttl / 3:.2g} s)",
            "≤ 1 interval",
            {
                store: f"{data['max_past_ttl_ms']:+.0f} ms{_mark(data['goal_met'])}"
                if data["latency_s"]["n"]
                else "- (every run taken over before the kill)"
                for store, data in takeover["stores"].items()
            },
        )
    waiters = _ok(results, "waiters")
    if waiters:
        for mode, goal, limit in (("poll", "≤ 1 /s (± 5 %)", 1.0), ("push", "→ 0 /s", None)):
            cells = {}
            for store, modes in waiters["stores"].items():
                if mode in modes:
                    rate = modes[mode]["one"]["steady_queries_per_s"]
                    cells[store] = f"{_num(rate)} /s{_mark(rate <= limit * 1.05 if limit else None)}"
            label = "no hub, polling" if mode == "poll" else "watch hub"
            row(
                "5", f"store requests of a waiting process with 1 waiter, steady state ({label})", goal, cells
            )
        many = waiters["many"]
        cells = {
            store: f"{_num(modes['push']['many']['steady_queries_per_s_per_waiter'], 3)} /s"
            for store, modes in waiters["stores"].items()
            if "push" in modes
        }
        row("5", f"… with {many} waiters (watch hub), per waiter (backstop questions)", "→ 0 /s", cells)
    rows += _startup_goal_rows(results, stores)
    rows += _fanin_goal_rows(results, stores)
    return rows


def _observing_goals(row: Callable[..., None], observing: dict[str, Any]) -> None:
    """Benchmark 8's goals (issue 33): metrics alone, and dibs's share above the SDK's bare span."""
    from benchmarks.observing import METRICS_GOAL, SPAN_SHARE_GOAL

    measured = {
        store: data for store, data in observing.items() if isinstance(data, dict) and "ratio" in data
    }
    if not any("metrics" in data["ratio"] for data in measured.values()):  # results from before issue 33
        row(
            "8",
            "`run` observed through the OpenTelemetry SDK, vs unobserved (median)",
            f"≤ {METRICS_GOAL:.2f}x",
            {
                store: f"{_num(data['ratio']['otel'])}x{_mark(data['ratio']['otel'] <= METRICS_GOAL)}"
                for store, data in measured.items()
            },
        )
        return
    row(
        "8",
        "`run` with dibs's metrics through the OpenTelemetry SDK (no spans), vs unobserved (median)",
        f"≤ {METRICS_GOAL:.2f}x",
        {
            store: f"{_num(data['ratio']['metrics'])}x{_mark(data['ratio']['metrics'] <= METRICS_GOAL)}"
            for store, data in measured.items()
            if "metrics" in data["ratio"]  # none in older results
        },
    )
    row(
        "8",
        "with spans: dibs's share above the SDK's cheapest span, (OpenTelemetry - bare span) / unobserved",
        f"≤ {SPAN_SHARE_GOAL:.0%}",
        {
            store: f"{data['span_share']:+.1%}{_mark(data['span_share'] <= SPAN_SHARE_GOAL)}"
            for store, data in measured.items()
            if "span_share" in data
        },
    )


def _raw_goal_rows(
    handoff: dict[str, Any], first: str, last: str, row: Callable[[str, str, str, dict[str, str]], None]
) -> None:
    """The hand-off against the store's raw notification fan-out measured alongside (issue 20)."""
    raw = handoff.get("raw_notify", {})
    if not raw:
        return
    vs_first, vs_last, raw_scaling = {}, {}, {}
    for store, per in raw.items():
        push = handoff["stores"][store]["push"]
        vs = push[first].get("vs_raw")
        vs_first[store] = f"{_num(vs)}x{_mark(vs <= 5 if vs is not None else None)}"
        vs_last[store] = f"{_num(push[last].get('vs_raw'))}x"
        raw_scaling[store] = f"{_num(per['scaling'])}x"
    row(
        "2",
        f"hand-off p50, N={first}, vs the store's raw notification round trip (same run, "
        f"{first} listener process)",
        "≤ 5x",
        vs_first,
    )
    row(
        "2",
        f"the raw notification round trip itself (no dibs), N={last} listener processes / N={first}: "
        "the growth the primitive has on this machine",
        "(info)",
        raw_scaling,
    )
    row("2", f"hand-off p50, N={last}, vs the raw round trip with N={last} listeners", "(info)", vs_last)


def _cells_row(number: str, what: str, goal: str, cells: dict[str, str], stores: list[str]) -> list[str]:
    return [number, what, goal, *(cells.get(store, "-") for store in stores)]


def _startup_goal_rows(results: dict[str, Any], stores: list[str]) -> list[list[str]]:
    """The start-up goals, in the PostgreSQL column (they are measured there)."""
    startup = _ok(results, "startup")
    if not startup or "cases" not in startup.get("four_at_once", {}):
        return []
    rows = []
    for name, row in startup["first_reservation"].items():
        if row["goal_met"] is not None:
            cell = f"{_num(row['first_s']['median'])} s{_mark(row['goal_met'])}"
            what = f"first reservation in a fresh process, {name} (median of {row['runs']})"
            rows.append(_cells_row("6", what, "≤ 1 s", {"postgres": cell}, stores))
    for name, row in startup["first_reservation"].items():
        if row.get("added_goal_met") is not None:
            cell = f"{row['added_s'] * 1e3:+.0f} ms{_mark(row['added_goal_met'])}"
            what = f"what dibs adds to that first reservation, {name}, beyond a raw psycopg claim"
            rows.append(_cells_row("6", what, "≤ 300 ms", {"postgres": cell}, stores))
    for name, row in startup["four_at_once"]["cases"].items():
        if row["goal_met"] is not None:
            cell = f"{_num(row['slowest_s']['median'])} s{_mark(row['goal_met'])}"
            what = f"four processes starting at once, {name}: the slowest (median of {row['runs']})"
            rows.append(_cells_row("6", what, "≤ 2 s", {"postgres": cell}, stores))
    return rows


def _fanin_goal_rows(results: dict[str, Any], stores: list[str]) -> list[list[str]]:
    """The fan-in goals for the largest count on one key: marked for PostgreSQL, Redis and SQLite."""
    fanin = _ok(results, "fanin")
    if not fanin or not fanin["stores"]:
        return []
    top = max(max(data["counts"]) for data in fanin["stores"].values())
    picked: dict[str, tuple[str, dict[str, Any], dict[str, Any] | None]] = {}
    for store, data in fanin["stores"].items():
        count = str(max(data["counts"]))
        prefix = "" if int(count) == top else f"N={count}: "
        picked[store] = (prefix, data["one"][count], data.get("late"))

    def cells(render: Callable[[dict[str, Any], str, bool], str], late: bool = False) -> dict[str, str]:
        found = {}
        for store, (prefix, early_row, late_row) in picked.items():
            row = late_row if late else early_row
            if row is not None:
                found[store] = prefix + render(row, store, store in FANIN_GOAL_STORES and not prefix)
        return found

    def errors(row: dict[str, Any], store: str, marked: bool) -> str:
        return f"{row['errors']}{_mark(row['errors'] == 0 if marked else None)}"

    def connections(row: dict[str, Any], store: str, marked: bool) -> str:
        peak, bound = row["connections_peak"], fanin["stores"][store]["bound"]
        if peak is None:
            return "-"
        if bound is None:  # no server: SQLite's open database files, for information
            return f"{peak} (files)"
        return f"{peak}{_mark(peak <= bound if marked else None)}"

    def p50(row: dict[str, Any], store: str, marked: bool) -> str:
        value = row["latency_ms"]["median"]
        return f"{_num(value, 0)} ms{_mark(value <= 50 if marked else None)}"

    def p99(row: dict[str, Any], store: str, marked: bool) -> str:
        value = row["latency_ms"]["p99"]
        return f"{_num(value, 0)} ms{_mark(value <= 200 if marked else None)}"

    def lag(row: dict[str, Any], store: str, marked: bool) -> str:
        value = _worst_lag(row["lag_worst_ms"]["wait"], row["lag_worst_ms"]["handoff"])
        if value is None:
            return "n/a"
        return f"{_num(value, 0)} ms{_mark(value <= 50 if marked else None)}"

    hold = results["settings"]["handoff_hold"]
    early = f"completed {hold[0] * 1e3:.0f}-{hold[1] * 1e3:.0f} ms after all wait"
    way = "ReservationTrigger.run()" if fanin.get("api") == "trigger" else "AsyncReservations.wait"
    what = f"fan-in: {top:,} waiters on one key in one event loop ({way})"
    rows = [
        _cells_row("7", f"{what}: errors", "0", cells(errors), stores),
        _cells_row("7", f"{what}: server connections of that process", "≤ 4", cells(connections), stores),
        _cells_row("7", f"{what}: hand-off p50, {early}", "≤ 50 ms", cells(p50), stores),
        _cells_row("7", f"{what}: hand-off p99, {early}", "≤ 200 ms", cells(p99), stores),
        _cells_row(
            "7", f"{what}: worst event-loop lag waiting and handing off", "≤ 50 ms", cells(lag), stores
        ),
    ]
    late_hold = fanin.get("late_hold_s")
    if late_hold:
        later = f"completed {late_hold:g} s after all wait"
        rows += [
            _cells_row("7", f"{what}: hand-off p50, {later}", "≤ 50 ms", cells(p50, late=True), stores),
            _cells_row("7", f"{what}: hand-off p99, {later}", "≤ 200 ms", cells(p99, late=True), stores),
            _cells_row("7", f"{what}: worst lag, {later}", "≤ 50 ms", cells(lag, late=True), stores),
        ]
    return rows


def _fewer(contention: dict[str, Any]) -> str:
    fewer = {
        store: data["keys"]
        for store, data in contention["stores"].items()
        if data.get("keys", contention["keys"]) != contention["keys"]
    }
    return "".join(f" ({_SHORT.get(store, store)}: {keys})" for store, keys in fewer.items())


# -- details ---------------------------------------------------------------------------------------


def _overhead_section(data: dict[str, Any]) -> list[str]:
    lines = [
        "## 1. Uncontended overhead",
        "",
        "One fresh key reserved and completed, per operation (µs, median and p99); ratios are medians "
        "against the raw primitive measured alongside (see README for what each baseline does).",
        "",
    ]
    rows = []
    for store in (*ALL_STORES, *EXTRA_STORES):
        if store not in data or not isinstance(data[store], dict):
            continue
        us, ratio = data[store]["us"], data[store]["ratio"]
        rows.append(
            [
                data[store]["label"],
                f"{us['raw']['median']:.0f} / {us['raw']['p99']:.0f}",
                f"{us['store']['median']:.0f} / {us['store']['p99']:.0f}",
                f"{us['client']['median']:.0f} / {us['client']['p99']:.0f}",
                f"{us['run']['median']:.0f} / {us['run']['p99']:.0f}",
                f"{_num(ratio['store'])}x / {_num(ratio['client'])}x / {_num(ratio['run'])}x",
            ]
        )
    lines += _table(
        ["store", "raw µs p50/p99", "store µs", "client µs", "`run` µs", "ratio store / client / run"], rows
    )
    return lines


#: The runs of benchmark 8, in the table's order: the key in the results, its column, its ratio's name.
_OBSERVING_RUNS = (
    ("observed", "observed µs", "observed"),
    ("metrics", "metrics only µs", "metrics"),
    ("otel", "OpenTelemetry µs", "otel"),
    ("otel_later", "span not active µs", "not active"),
    ("bare_span", "bare span µs", "bare span"),
)


def _observing_section(data: dict[str, Any]) -> list[str]:
    """Benchmark 8's table, with the columns its results have: results from before issue 33 have no
    metrics-only run and no span share, and are shown as they were then, not with empty columns."""
    measured = [
        data[store]
        for store in (*ALL_STORES, *EXTRA_STORES)
        if isinstance(data.get(store), dict) and "ratio" in data[store]
    ]
    newer = any("metrics" in each["ratio"] for each in measured)  # as _observing_goals decides
    runs = [run for run in _OBSERVING_RUNS if newer or run[0] != "metrics"]
    lines = [
        "## 8. The overhead of observing",
        "",
        "`Reservations.run` on a fresh key (reserve + complete), per operation (µs, median and p99): nobody "
        "listening (the baseline), a process observer that does nothing (every event built and every "
        "store operation timed), the OpenTelemetry observer on the real SDK"
        + (" with metrics only, with metrics and spans," if newer else ",")
        + " and the same with "
        "`active_span=False` (its span not the active one while the work runs, made entirely off the "
        "caller's path), and the SDK's bare span alone (started and ended around the call, the floor of "
        "an active span). Ratios: medians against the unobserved runs measured alongside.",
        "",
    ]
    rows = []
    for each in measured:
        us, ratio = each["us"], each["ratio"]
        row = [
            each["label"],
            *(
                f"{us[kind]['median']:.0f} / {us[kind]['p99']:.0f}" if kind in us else "-"
                for kind in ("unobserved", *(run[0] for run in runs))
            ),
            " / ".join("-" if ratio.get(run[0]) is None else f"{ratio[run[0]]:.3f}x" for run in runs),
        ]
        if newer:
            share = each.get("span_share")
            row.append("-" if share is None else f"{share:+.1%}")
        rows.append(row)
    header = ["store", "unobserved µs p50/p99", *(run[1] for run in runs)]
    header.append("ratio " + " / ".join(run[2] for run in runs))
    if newer:
        header.append("dibs's span share")
    lines += _table(header, rows)
    return lines


def _topologies_section(data: dict[str, Any]) -> list[str]:
    """10. The Redis topologies, each against one server (issue 29: hand-off within 10x of it)."""
    from benchmarks import topologies

    lines = ["## 10. Redis topologies: one server, a Redis Cluster, through Sentinel", ""]
    if "skipped" in data:
        return [*lines, f"Skipped: {data['skipped']}", ""]
    lines += [topologies.__doc__.split("\n\n", 1)[1].strip() if topologies.__doc__ else "", ""]
    handoff = data.get("handoff", {})
    counts = sorted({int(n) for per in handoff.values() for n in per}, key=int)
    rows = []
    for kind in topologies.KINDS:
        for count in counts:
            row = handoff.get(kind, {}).get(str(count))
            if row is None:
                continue
            latency = row["latency_ms"]
            rows.append(
                [
                    kind,
                    str(count),
                    _num(latency["median"]),
                    _num(latency["p99"]),
                    f"{_num(row.get('vs_direct'))}x"
                    + _mark(None if kind == "direct" else row.get("vs_direct", 99) <= 10),
                ]
            )
    lines += ["Hand-off, complete to waiter (ms):", ""]
    lines += _table(["topology", "waiters", "p50", "p99", "p50 vs direct (goal ≤ 10x)"], rows)
    per_key = data.get("reserve_complete", {})
    lines += ["Reserve + complete in one process (µs per key):", ""]
    lines += _table(
        ["topology", "p50", "p99", "vs direct"],
        [
            [kind, _num(row["us"]["median"], 0), _num(row["us"]["p99"], 0), f"{_num(row['vs_direct'])}x"]
            for kind, row in per_key.items()
        ],
    )
    connections = data.get("connections", {})
    lines += ["Connections of one process's store, per data node (`CLIENT LIST` by client name):", ""]
    lines += _table(
        ["topology", "working (30 keys on every node) and waiting", "only waiting"],
        [
            [kind, " + ".join(map(str, row["working"])), " + ".join(map(str, row["only_waiting"]))]
            for kind, row in connections.items()
        ],
    )
    return lines


def _payloads_section(data: dict[str, Any], later_path: Path) -> list[str]:
    """Benchmark 9, and the later full run of ``python -m benchmarks.payloads --full`` (PAYLOADS.md,
    which says what else the machine ran then) when there is one: it has the BLAKE3 rows."""
    from benchmarks import payloads

    lines = [
        "## 9. Large-artifact hand-off (payload stores)",
        "",
        payloads.METHOD,
        "",
        *payloads.table(data["stores"]),
        "",
    ]
    if later_path.is_file():
        later = json.loads(later_path.read_text())
        lines += [
            f"A later run, {later.get('started', '?')} (`python -m benchmarks.payloads --full`, "
            f"[{PAYLOADS_REPORT}]({PAYLOADS_REPORT}), "
            "which says how loaded the machine was), with the folder store naming its payloads by BLAKE3 "
            "as well (`?digest=blake3`, the `blake3` extra):",
            "",
            *payloads.table(later["stores"]),
            "",
        ]
    return lines


def _handoff_section(data: dict[str, Any], settings: dict[str, Any]) -> list[str]:
    counts = [str(n) for n in settings["handoff_waiters"]]
    hold = settings["handoff_hold"]
    lines = [
        "## 2. Hand-off latency",
        "",
        "From the holder's `complete` call to each waiter process returning with the artifact (ms, p50 / "
        "p99 over all waiters of all rounds). `push`: the store as configured, each waiter process's "
        "watch hub wakes its waiters; `poll`: no hub (`PollingStore`), each waiter asks with its capped "
        f"backoff. The holder completes {hold[0] * 1e3:.0f}-{hold[1] * 1e3:.0f} ms "
        "after the waiters start waiting. The anchors are Prefect's lock managers, measured the same way: "
        "the holder releases the lock, waiters `wait_for_lock` then read the result.",
        "",
    ]
    raw = data.get("raw_notify", {})
    if raw:
        lines += [
            "`raw`: the store's own notification fan-out with nothing of dibs, measured in the same run "
            "and the same worker processes, interleaved round by round with `push` "
            "(`notify_fanout.py`): the benchmark process writes a row and notifies in one round trip, "
            "each of N listener processes (one connection or subscription each, as each waiter "
            "process's hub has) is woken and reads the row once; from the write call to the read having "
            "returned. Its growth with N is what the machine (and the server) impose on any hub; "
            "`vs raw` is push p50 / raw p50 at each N.",
            "",
        ]
    rows = []
    for store, modes in data["stores"].items():
        for mode, per in modes.items():
            cells = [
                f"{_num(per[n]['latency_ms']['median'], 1)} / {_num(per[n]['latency_ms']['p99'], 1)}"
                for n in counts
            ]
            vs = (
                " / ".join(f"{_num(per[n]['vs_raw'], 1)}x" for n in counts)
                if "vs_raw" in per[counts[0]]
                else "-"
            )
            rows.append([_SHORT.get(store, store), mode, *cells, f"{_num(per['scaling'])}x", vs])
        if store in raw:
            per = raw[store]
            cells = [
                f"{_num(per[n]['latency_ms']['median'], 2)} / {_num(per[n]['latency_ms']['p99'], 2)}"
                for n in counts
            ]
            rows.append(
                [_SHORT.get(store, store), f"raw: {per['how']}", *cells, f"{_num(per['scaling'])}x", "-"]
            )
    for kind, reason in data.get("anchors_skipped", {}).items():
        lines += [f"- Anchor skipped, {kind}: {reason}"]
    if data.get("anchors_skipped"):
        lines.append("")
    for per_kind in data.get("anchors", {}).values():
        cells = [
            f"{_num(per_kind[n]['latency_ms']['median'], 1)} / {_num(per_kind[n]['latency_ms']['p99'], 1)}"
            if n in per_kind
            else "-"
            for n in counts
        ]
        rows.append(
            [per_kind["label"], per_kind["wake_up"], *cells, f"{_num(per_kind.get('scaling'))}x", "-"]
        )
    lines += _table(
        [
            "store",
            "wake-up",
            *(f"N={n} p50 / p99" for n in counts),
            f"N={counts[-1]} / N={counts[0]}",
            f"p50 vs raw, N={' / '.join(counts)}",
        ],
        rows,
    )
    lines += ["![hand-off latency](handoff.png)", ""]
    killed = data.get("after_sigkill")
    if killed:
        lines += [
            "### Lock managers whose holder is SIGKILLed",
            "",
            "A holder process takes the lock as Prefect's transaction does (`acquire_lock(key, holder)`: "
            "Prefect passes no hold timeout) and is SIGKILLed at a random moment; a waiter process asks "
            f"`acquire_lock(key, holder, acquire_timeout={killed['window_s']:g})`. DibsLockManager runs on "
            f"the Redis store with ttl {killed['ttl_s']:g} s (heartbeats every ttl/3).",
            "",
        ]
        rows = []
        for row in killed["managers"].values():
            got = row["acquired"]
            took = (
                f"{_num(row['latency_s']['median'])} / {_num(row['latency_s']['max'])}"
                if got
                else f"never within {killed['window_s']:g} s"
            )
            rows.append([row["label"], f"{got} of {row['repeats']}", took, row["expiry"]])
        lines += _table(
            [
                "lock manager",
                "waiters that got the lock",
                "s after the kill, median / max",
                "the dead holder's lock",
            ],
            rows,
        )
    return lines


def _contention_section(data: dict[str, Any]) -> list[str]:
    lines = [
        "## 3. Contention throughput",
        "",
        f"{data['processes']} processes race through the same keys ({data['keys']} per store unless the "
        "table says otherwise); every key computed exactly once (verified), every process got every value. "
        "Keys/s (median of repetitions) against the same processes doing the raw primitive's conditional "
        "insert on as many keys. The raw baseline writes once per key and never hands a result over; dibs "
        "writes twice (reserve, complete) and delivers the value to every process.",
        "",
    ]
    rows = []
    for store, per_store in data["stores"].items():
        for order, row in per_store.items():
            if not isinstance(row, dict):
                continue
            rows.append(
                [
                    _SHORT.get(store, store),
                    str(per_store.get("keys", data["keys"])),
                    order,
                    f"{row['dibs_keys_per_s']:.0f}",
                    f"{row['raw_keys_per_s']:.0f}",
                    f"{row['ratio']:.0%}",
                ]
            )
    header = ["store", "keys", "key order", "dibs keys/s", "raw keys/s", "dibs / raw"]
    return [*lines, *_table(header, rows)]


def _takeover_section(data: dict[str, Any]) -> list[str]:
    lines = [
        "## 4. Takeover after SIGKILL",
        "",
        f"Holder heartbeating every {data['heartbeat_interval_s']:.3g} s with ttl {data['ttl_s']:g} s, "
        "killed at a "
        "random phase; time until a waiting process holds the lease. Expected between ⅔ ttl and ttl, plus "
        "the waiter's re-ask just after the expiry.",
        "",
    ]
    rows = [
        [
            _SHORT.get(store, store),
            f"{row['latency_s']['median']:.3f}",
            f"{row['latency_s']['min']:.3f}",
            f"{row['latency_s']['max']:.3f}",
            f"{row['max_past_ttl_ms']:+.0f}",
            str(row.get("premature", 0)),
        ]
        for store, row in data["stores"].items()
    ]
    header = ["store", "median s", "min s", "max s", "max - ttl, ms", "taken before the kill"]
    return [*lines, *_table(header, rows)]


def _waiters_section(data: dict[str, Any]) -> list[str]:
    lines = [
        "## 5. Waiter load",
        "",
        f"Waiting processes, each with 1 waiter or {data['many']} (threads, a key each), waiting "
        f"{data['wait_s']:g} s on keys that stay held. Store requests: every call through the Store "
        "interface (the waiters' asks and reads, the hub's batched reads), per second over the whole wait "
        "and in the steady state (its second half). `push`: the watch hub follows the store and each waiter "
        "only asks as a backstop (its backoff capped at 10 s); `poll`: no hub, each waiter asks with its "
        "backoff capped at 1 s. The feed's own looks are one stream per process, whatever the number of "
        "waiters, and are counted apart: a polling feed's token reads (MySQL's versions query, Azure's "
        "ETag HEADs or listing, the file store's `stat` of each watched record, SQLite's versions query) "
        "and SQLite's `data_version` probes (shared memory, never a server; on Linux an inotify watch on "
        "the `-wal` file says when to look, else every 4 ms; the probes it woke are counted apart, the "
        "others are its 0.1 s backstop). PostgreSQL's LISTEN and Redis's pattern subscription send nothing "
        "while nothing changes.",
        "",
    ]
    rows = []
    for store, modes in data["stores"].items():
        for mode, per in modes.items():
            for label in ("one", "many"):
                row = per[label]
                rows.append(
                    [
                        _SHORT.get(store, store),
                        mode,
                        str(row["waiters"]),
                        f"{row['queries_per_s']:.2f}",
                        f"{row['steady_queries_per_s']:.2f}",
                        f"{row['steady_queries_per_s_per_waiter']:.3f}",
                        str(row["hub_reads"]),
                        f"{row['feed_tokens_per_s']:.1f}",
                        f"{row['feed_probes_per_s']:.0f}",
                        f"{row['feed_inotify_per_s']:.1f}" if "feed_inotify_per_s" in row else "-",
                    ]
                )
    header = [
        "store",
        "wake-up",
        "waiters",
        "requests/s, overall",
        "steady state",
        "steady, per waiter",
        "hub reads",
        "feed token looks/s",
        "feed probes/s",
        "of which inotify wake-ups/s",
    ]
    return [*lines, *_table(header, rows)]


def _startup_section(data: dict[str, Any]) -> list[str]:
    lines = [
        "## 6. Import and CLI start-up",
        "",
        f"Fresh subprocesses, median of {data['runs']} runs each, commands interleaved.",
        "",
    ]
    rows = [
        [
            f"`{name}`",
            f"{ms['median']:.0f}",
            f"{ms['p99']:.0f}",
            f"{data['ratio'][name]:.1f}x",
            f"{data['added_ms'][name]:+.0f}",
        ]
        for name, ms in data["ms"].items()
    ]
    lines += _table(["command", "ms p50", "ms p99", "vs `python -c pass`", "added ms"], rows)
    importtime = data.get("importtime", {})
    if importtime.get("heaviest"):
        heavy = ", ".join(f"`{row['module']}` {row['self_ms']:.1f}" for row in importtime["heaviest"][:8])
        lines += [
            "`python -X importtime -c 'import dibs'`: "
            f"{_num(importtime.get('dibs_cumulative_ms'), 0)} ms in all; "
            f"most own time (ms): {heavy}.",
            "",
        ]
    return lines + _first_reservation_lines(data)


def _first_reservation_lines(data: dict[str, Any]) -> list[str]:
    first = data.get("first_reservation", {})
    if "skipped" in first:
        return [f"First reservation skipped: {first['skipped']}", ""]
    if not first:
        return []
    lines = [
        "### A fresh process's first reservation (PostgreSQL)",
        "",
        "From before `import dibs` to `get_or_reserve` answering, in a fresh process whose orchestrator "
        "imports (if any) were done before the clock started; `open` is building the client, which imports "
        "SQLAlchemy and the driver. Baselines in the same run: the raw primitive's first claim in a fresh "
        "process (`import psycopg`, connect, one conditional upsert) and the second reservation of the same "
        "process. CPU: the process's CPU seconds until the answer (the wall time also waits for the "
        "machine's other jobs).",
        "",
    ]
    rows = [
        [
            name,
            f"{_num(row['first_s']['median'], 3)}",
            f"{_num(row['import_s']['median'], 3)}",
            f"{_num(row['open_s']['median'], 3)}",
            f"{_num(row['request_s']['median'], 3)}",
            f"{_num(row['cpu_s']['median'], 3)}",
            f"{_num(row['second_s']['median'] * 1e3, 1)}",
            f"{_num(row['vs_raw'], 1)}x",
        ]
        for name, row in first.items()
    ]
    header = ["process", "first answer, s", "import", "open", "request", "CPU s", "second, ms", "vs raw"]
    lines += _table(header, rows)
    together = data.get("four_at_once", {}).get("cases", {})
    if together:
        lines += [
            "Four processes starting at the same instant (their orchestrator imports done), one key: the "
            "slowest one's first answer, from the common start. A fresh database is a new schema nobody has "
            "created the tables in: the four race to create them. CPU: the busiest process's CPU seconds "
            "(four processes on 2 cores need at least about twice that).",
            "",
        ]
        rows = [
            [
                name,
                str(row["runs"]),
                f"{_num(row['slowest_s']['median'], 3)}",
                f"{_num(row['slowest_s']['max'], 3)}",
                f"{_num(row['cpu_s']['median'], 3)}",
            ]
            for name, row in together.items()
        ]
        lines += _table(["four processes", "runs", "slowest, s (median)", "worst, s", "CPU s"], rows)
    return lines


#: The hand-off quantiles the fan-in shows (results written before the p90 was kept show "-" for it).
_QUANTILES = ("median", "p90", "p99")


def _fanin_section(data: dict[str, Any]) -> list[str]:
    lines = [
        "## 7. Fan-in: many waiters in one event loop",
        "",
        f"N waiters in one event loop of one waiting process ({data.get('api_label', '-')}), on one key or "
        "on N keys; the benchmark process holds the keys and completes them 50-250 ms after every waiter "
        "is parked (subscribed to the process's watch hub, its first reads done). Hand-off: from the "
        "`complete` call of a waiter's key to the waiter returning (ms, p50 / p90 / p99 over all waiters and "
        "rounds), against N=1 with the same code and against the loop's own floor (N bare coroutines "
        "woken from another thread by one `call_soon_threadsafe`, what the hub does per loop). Lag: the "
        "worst oversleep of a 5 ms ticker in the same loop while waiting / handing off (setting up the N "
        "waits; idle loop before). Connections: the waiting process's, counted by the server "
        "(`pg_stat_activity`, `CLIENT LIST`; SQLite: its open descriptors of the database file); "
        "bound 4. CPU: the waiting process's, for the whole case; loop µs: the loop thread's CPU during "
        "the hand-off per waiter. Requests per waiter through the shared store (reads, asks, the hub's "
        "batched reads), while setting up / waiting / handing off. Notification: the store's own raw "
        "round trip measured in the same run (PostgreSQL NOTIFY → LISTEN → SELECT, Redis PUBLISH → "
        "message → GET, SQLite commit → data_version → SELECT; `benchmarks/notify_rtt.py`): "
        + (
            ", ".join(
                f"{_SHORT.get(store, store)} p50 {per['notify_rtt_ms']['p50_ms']:.2f} ms"
                for store, per in data["stores"].items()
                if per.get("notify_rtt_ms")
            )
            or "not measured"
        )
        + ".",
        "",
    ]
    rows = []
    for store, per_store in data["stores"].items():
        entries = [(layout, n, row) for layout in ("one", "distinct") for n, row in per_store[layout].items()]
        entries = [entry for entry in entries if not (entry[0] == "distinct" and entry[1] == "1")]
        if "late" in per_store:
            entries.append(
                (
                    f"one, {data['late_hold_s']:g} s later",
                    str(per_store["late"]["waiters"]),
                    per_store["late"],
                )
            )
        for layout, count, row in entries:
            latency, lag = row["latency_ms"], row["lag_worst_ms"]
            requests = row["requests_per_waiter"]
            rows.append(
                [
                    _SHORT.get(store, store),
                    "1 key" if count == "1" else layout,
                    count,
                    " / ".join(_num(latency[q], 1) if q in latency else "-" for q in _QUANTILES),
                    f"{_num(row['p50_vs_n1'], 1)}x",
                    f"{_num(row['floor_ms']['median'], 2)}",
                    "-" if row.get("p50_vs_notify") is None else f"{_num(row['p50_vs_notify'], 0)}x",
                    str(row["errors"]),
                    f"{lag_text(lag['wait'])} / {lag_text(lag['handoff'])} "
                    f"({lag_text(lag['setup'])}; {lag_text(lag['idle'])})",
                    "-" if row["connections_peak"] is None else str(row["connections_peak"]),
                    f"{row['threads_before']} → {row['threads_peak']}",
                    f"{row['cpu_s']:.2f}",
                    f"{row['handoff_loop_cpu_us_per_waiter']:.0f}",
                    " / ".join(
                        f"{sum(requests[phase].values()):.1f}" for phase in ("setup", "wait", "handoff")
                    ),
                ]
            )
    header = [
        "store",
        "keys",
        "N",
        "hand-off ms p50 / p90 / p99",
        "p50 vs N=1",
        "floor p50 ms",
        "p50 vs notification",
        "errors",
        "lag ms wait / hand-off (setup; idle)",
        "connections",
        "threads",
        "CPU s",
        "loop µs/waiter",
        "requests/waiter",
    ]
    return [*lines, *_table(header, rows), *_fanin_baselines(data)]


def _gc_text(kind: dict[str, Any]) -> str:
    """The full collections while a baseline started / in all, summed over rounds (newer runs only)."""
    if "full_collections_start" not in kind:
        return ""
    return f"; {kind['full_collections_start']} / {kind['full_collections_all']} full collections"


def _fanin_baselines(data: dict[str, Any]) -> list[str]:
    """What any N triggers cost a loop of the same process (same heap), beside the setup lag of dibs's N."""
    lines = []
    for store, per_store in data["stores"].items():
        baseline = per_store.get("baseline")
        if not baseline:
            continue
        count = str(baseline["waiters"])
        ours = per_store["one"][count]["lag_worst_ms"]
        ours_gc = per_store["one"][count].get("full_collections")
        parts = [
            f"ReservationTrigger.run() {lag_text(ours['setup'])} ms setting up (one key"
            + ("" if ours_gc is None else f"; {ours_gc['setup']} full collections")
            + ")"
        ]
        if "trigger" in baseline:
            trigger = baseline["trigger"]
            parts.append(
                f"{baseline['trigger_label']} {lag_text(trigger['start_ms'])} ms starting "
                f"({lag_text(trigger['all_ms'])} ms until they fired{_gc_text(trigger)})"
            )
        bare = baseline["bare"]
        parts.append(
            f"bare coroutines sleeping {lag_text(bare['start_ms'])} ms "
            f"({lag_text(bare['all_ms'])} ms in all{_gc_text(bare)})"
        )
        lines.append(f"* {_SHORT.get(store, store)}: " + "; ".join(parts) + ".")
    if not lines:
        return []
    count = next(per["baseline"]["waiters"] for per in data["stores"].values() if per.get("baseline"))
    counted = any(
        "full_collections_start" in per["baseline"]["bare"]
        for per in data["stores"].values()
        if per.get("baseline")
    )
    return [
        "",
        f"Baseline, what any {count:,} triggers cost: in the same process and thread (same heap; a fresh "
        "event loop of its own), "
        f"right after each round of {count:,} waiters on one key, {count:,} of Airflow's own "
        "`DateTimeTrigger.run()` (standard provider; each logs a line as it starts) started at once, "
        "firing 1 s later, then as many bare coroutines sleeping 1 s; the worst lag of the 5 ms ticker while "
        "they start (their first 0.5 s) and until the last returned, worst of the rounds"
        + (
            ". Each start, dibs's and the baselines', follows a `gc.collect()`; the full collections that "
            "landed while starting / in all, summed over the rounds, are shown beside (the garbage "
            "collector's stalls fall on whichever coroutine tips them):"
            if counted
            else ":"
        ),
        "",
        *lines,
    ]


def _header(results: dict[str, Any]) -> list[str]:
    machine, versions = results["machine"], results["versions"]
    load = machine.get("load_average_at_start")
    lines = [
        "# dibs benchmark results",
        "",
        f"`benchmarks/run{' --smoke' if results['mode'] == 'smoke' else ''}` ({results['mode']} mode), "
        f"{results['started']}, {results['seconds'] / 60:.1f} min. "
        f"Machine: {machine['cpu']}, {machine['cpus']} CPUs, "
        f"Python {machine['python']}"
        + (f", load average {load[0]:.1f} at the start" if load else "")
        + ". Other jobs shared the machine, so every figure is a ratio against a baseline measured in the "
        "same run, interleaved with it, and times are medians (p50) and p99 of many repetitions. What each "
        "benchmark does: [README.md](../README.md).",
        "",
        "Versions: " + ", ".join(f"{name} {version}" for name, version in versions.items()) + ".",
        "",
    ]
    for name, again in results.get("remeasured", {}).items():
        # A benchmark whose run failed, measured again with `--only NAME` and merged in: said, not hidden.
        lines += [
            f"`{name}` comes from a separate run (`benchmarks/run --only {name}`), {again['started']}, "
            f"{again['seconds'] / 60:.1f} min, load average {again['load_average_at_start'][0]:.1f} at the "
            f"start: {again['why']}",
            "",
        ]
    rows = [[info["label"], info["push"], f"`{info['url']}`"] for info in results["stores"].values()]
    lines += _table(["store", "how waiters are woken", "URL"], rows)
    for name, reason in results.get("skipped", {}).items():
        lines += [f"- Skipped **{name}**: {reason}"]
    if results.get("skipped"):
        lines.append("")
    return lines


def write(results: dict[str, Any], out: Path, log: Callable[[str], None]) -> None:
    stores = [name for name in ALL_STORES if name in results.get("stores", {})]
    lines = _header(results)
    lines += ["## Goals", ""]
    lines += _table(["#", "measure", "goal", *(_SHORT[s] for s in stores)], _goal_rows(results, stores))
    startup = _ok(results, "startup")
    if startup:
        name, base = "python -c 'import dibs'", startup["ms"]["python -c pass"]["median"]
        lines += [
            f"6: `import dibs` takes {startup['ms'][name]['median']:.0f} ms against {base:.0f} ms for a bare "
            f"interpreter ({startup['ratio'][name]:.1f}x, +{startup['added_ms'][name]:.0f} ms); "
            "`dibs --help` "
            f"{startup['ms']['dibs --help']['median']:.0f} ms ({startup['ratio']['dibs --help']:.1f}x).",
            "",
        ]
    sections: dict[str, Callable[[dict[str, Any]], list[str]]] = {
        "overhead": _overhead_section,
        "handoff": lambda data: _handoff_section(data, results["settings"]),
        "topologies": _topologies_section,
        "contention": _contention_section,
        "takeover": _takeover_section,
        "waiters": _waiters_section,
        "startup": _startup_section,
        "fanin": _fanin_section,
        "observing": _observing_section,
        "payloads": lambda data: _payloads_section(data, out / PAYLOADS_LATER),
    }
    for name, section in sections.items():
        data = results["benchmarks"].get(name)
        later = _later_run(out, name)
        if later is not None:
            data = later["benchmarks"][name]
        if data is None:
            continue
        if "error" in data:
            lines += [f"## {name}: FAILED", "", "```", data["error"].rstrip(), "```", ""]
            continue
        shown = section(data)
        if later is not None:  # after the section's heading: where its figures come from
            shown[1:1] = ["", _later_note(later, name)]
        lines += shown
    lines += _history_section(out / HISTORY)
    (out / "RESULTS.md").write_text("\n".join(lines))
    if _ok(results, "handoff"):
        _plot(results, out / "handoff.png", log)


#: Where a later run of one benchmark alone (``python -m benchmarks --only NAME --out DIR``) is kept:
#: its section of RESULTS.md is taken from there, and says so.
LATER = Path("issue30")
#: The later full run of the payload benchmark (``python -m benchmarks.payloads --full``).
PAYLOADS_LATER = Path("payloads.json")
PAYLOADS_REPORT = "PAYLOADS.md"  # what that run wrote beside it
#: The namespace-history benchmark's results (``python -m benchmarks.history``), not part of a full run.
HISTORY = LATER / "history.json"
#: Later runs of it for one store (``--stores file --name history-files``), whose rows replace that
#: store's in :data:`HISTORY`'s table: the file store since its index.
HISTORY_LATER = {"file": LATER / "history-files.json"}
#: ``prune`` on PostgreSQL and Redis measured again with nothing else running.
HISTORY_QUIET = LATER / "history-quiet.json"
#: ``python -m benchmarks.azure_index`` runs shown in the history section, in this order: the newest
#: with the emulator's metadata in memory, and the one with it in MariaDB (to 100,000 keys).
AZURE_RUNS = (LATER / "azure-copies.json", LATER / "azure-sql-metadata.json")
#: Where azure_index says Azurite kept its metadata when its results do not say (those before the
#: ``--azurite-db`` flag): its ``MEMORY``, repeated here so that the report needs no Azure SDK.
_AZURITE_DEFAULT = "in memory (LokiJS)"
#: The Azure runs before the record copies, linked from the section.
AZURE_EARLIER = ("history-azure.md", "azure-index.md", "azure-page.md", "azure-feed.md")


def _later_run(out: Path, name: str) -> dict[str, Any] | None:
    path = out / LATER / f"{name}.json"
    if not path.is_file():
        return None
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc if name in doc.get("benchmarks", {}) else None


def _later_note(doc: dict[str, Any], name: str) -> str:
    stores = ",".join(doc.get("stores", {}))
    return (
        f"*This section's figures come from a later run of this benchmark alone, {doc.get('started', '?')} "
        f"(`python -m benchmarks --only {name} --stores {stores}`, "
        f"[{LATER}/{name}.json]({LATER}/{name}.json)); the Goals table and the rest of the page: the full "
        "run above.*"
    )


#: The history benchmark's goals (issue 30): the reads a person makes at any size, a new key's cost
#: against an empty namespace, removal on the stores that serve many keys.
_HISTORY_GOALS = {"top_s": 1.0, "airflow_page_s": 1.0, "new_key_ratio": 1.3, "prune_keys_per_s": 20_000}
#: The stores the prune goal names.
_PRUNE_GOAL_STORES = frozenset({"postgres", "redis"})


def _history_section(path: Path) -> list[str]:
    if not path.is_file():
        return []
    rows: list[dict[str, Any]] = json.loads(path.read_text())
    later = {store: p for store, p in HISTORY_LATER.items() if (path.parent.parent / p).is_file()}
    for store, later_path in later.items():  # in place of the store's rows (at the end if none)
        at = next((i for i, row in enumerate(rows) if row["store"] == store), len(rows))
        kept = [row for row in rows if row["store"] != store]
        rows = kept[:at] + json.loads((path.parent.parent / later_path).read_text()) + kept[at:]

    def mark(row: dict[str, Any], field: str) -> str:
        value, goal = row[field], _HISTORY_GOALS[field]
        if field == "prune_keys_per_s":
            if row["store"] not in _PRUNE_GOAL_STORES:
                return f"{value:,}"
            return f"{value:,} {'✅' if value >= goal else '❌'}"
        text = f"{value * 1000:,.1f} ms" if field.endswith("_s") else f"{value}x"
        return f"{text} {'✅' if value <= goal else '❌'}"

    lines = [
        "## 11. History: a namespace of a million keys",
        "",
        "`python -m benchmarks.history` (not part of `benchmarks/run`; "
        "[issue30/history.md](issue30/history.md) has every column and how it was run). One namespace of "
        "each store grown to each size in finished keys. Goals (issue 30): `dibs top --once` and the "
        "Airflow Reservations page's read ≤ 1 s at any size, a new key's reserve + complete ≤ 1.3x its "
        "cost on an empty namespace, `prune` ≥ 20,000 keys/s on PostgreSQL and Redis. The memory store "
        "scans (one listing per read); the file store finds `top`'s and the page's records through its "
        "index."
        + "".join(
            f" The {_SHORT.get(store, store)} rows: a later run of that store alone, [{md}]({md})."
            for store, md in ((store, p.with_suffix(".md")) for store, p in later.items())
        )
        + (
            " The Azurite rows: from before the Azure store's index, when each read listed every record "
            "blob and `prune` changed `max_concurrency` records at once with the emulator as the limit "
            "([issue30/history-azure.md](issue30/history-azure.md)); the Azure table at the end of this "
            "section has the index."
            if any(row["store"] == "azure" for row in rows)
            else ""
        ),
        "",
    ]
    lines += _table(
        [
            "store",
            "keys",
            "top --once",
            "Airflow page",
            "new key vs empty",
            "hit vs empty",
            "ls records/s",
            "prune keys/s",
        ],
        [
            [
                _SHORT.get(r["store"], r["store"]),
                f"{r['keys']:,}",
                mark(r, "top_s"),
                mark(r, "airflow_page_s"),
                mark(r, "new_key_ratio"),
                f"{r['hit_ratio']}x",
                f"{r['ls_records_per_s']:,}",
                mark(r, "prune_keys_per_s"),
            ]
            for r in rows
        ],
    )
    lines += _quiet_prune_lines(path.parent.parent / HISTORY_QUIET)
    lines += _azure_history_lines(path.parent.parent)
    return lines


def _quiet_prune_lines(path: Path) -> list[str]:
    """``prune`` measured again with nothing else running (the table's runs shared the machine), with
    the verdict for the stores the goal names."""
    if not path.is_file():
        return []
    rows: list[dict[str, Any]] = sorted(json.loads(path.read_text()), key=lambda row: row["keys"])
    stores = list(dict.fromkeys(row["store"] for row in rows))
    speeds = [
        f"{_SHORT.get(store, store)} "
        + ", ".join(
            f"{row['prune_keys_per_s']:,} at {row['keys']:,} keys" for row in rows if row["store"] == store
        )
        for store in stores
    ]
    goal = _HISTORY_GOALS["prune_keys_per_s"]
    slowest = min(
        (row["prune_keys_per_s"] for row in rows if row["store"] in _PRUNE_GOAL_STORES), default=None
    )
    if slowest is None:
        verdict = "none of the stores the goal names was measured"
    elif slowest >= goal:
        verdict = f"the goal of {goal:,} holds at every size there"
    else:
        verdict = f"below the goal of {goal:,} at {slowest:,}"
    md = path.with_suffix(".md").relative_to(path.parent.parent)
    return [
        f"`prune` on a quiet machine ([{md}]({md}), nothing else running), keys/s: {'; '.join(speeds)}: "
        f"{verdict}. The marks in the table are from the runs above, on a loaded machine.",
        "",
    ]


def _ms_or_dash(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:,.0f} ms"


def _azure_history_lines(out: Path) -> list[str]:
    """Azure through its index and the record copies (``python -m benchmarks.azure_index``): Azurite's
    requests slow with the blobs it holds when it keeps its metadata in memory, so the largest size is
    measured with its metadata in MariaDB."""
    runs = [(p, json.loads((out / p).read_text())) for p in AZURE_RUNS if (out / p).is_file()]
    if not runs:
        return []

    def mark(value: float, goal: float) -> str:
        return f"{value * 1000:,.0f} ms {'✅' if value <= goal else '❌'}"

    rows = []
    in_a_database = False
    for path, doc in runs:
        metadata = doc["argv"].get("metadata", _AZURITE_DEFAULT).split(" (")[0]
        in_a_database = in_a_database or metadata != "in memory"
        first = doc["results"][0]
        for r in doc["results"]:
            grown = r["new_key_p50_ms"] / first["new_key_p50_ms"]
            rows.append(
                [
                    f"{r['keys']:,}",
                    f"[{metadata}]({path.with_suffix('.md')})",
                    mark(r["top_s"], _HISTORY_GOALS["top_s"]),
                    _ms_or_dash(r.get("top_listed_s")),
                    mark(r["airflow_page_s"], _HISTORY_GOALS["airflow_page_s"]),
                    str(r.get("airflow_page_gets", "-")),
                    f"{_ms_or_dash(r.get('airflow_page_uncopied_s'))} "
                    f"({r.get('airflow_page_uncopied_gets', '-')})",
                    "-" if r.get("record_get_ms") is None else f"{r['record_get_ms']:.2f} ms",
                    f"{_ms_or_dash(r.get('feed_look_s'))} ({_ms_or_dash(r.get('feed_look_listed_s'))})",
                    f"{r['new_key_p50_ms']:,.0f} ms, {grown:.2f}x "
                    f"{'✅' if grown <= _HISTORY_GOALS['new_key_ratio'] else '❌'}",
                    f"{r['new_key_ratio']}x",
                ]
            )
    return [
        "Azure (Azurite, the emulator), through the store's index and the record copies its artifacts' index "
        "blobs carry (`python -m benchmarks.azure_index`: each file has every column and how it was run). "
        "Azurite keeps its blobs' metadata in memory unless told otherwise, and there every request costs "
        "more the more blobs it holds (`one GET`)"
        + (
            "; with it in MySQL/MariaDB (`--azurite-db`), found by an index on the blobs' names, the "
            "largest size could be grown in minutes"
            if in_a_database
            else ""
        )
        + ". The page's GETs: the records it downloads (the live leases' records, read once for its held "
        "and once for its expired rows, the failure's, and any done key's without a copy; the newest done "
        "keys come from the copies), against the same page downloading every row. Feed look: one look of "
        "the change feed at 20 watched keys (by the listing of every record blob, as before the index). A "
        "new key: its reserve + complete, against the same at the run's first size (the goal: ≤ 1.3x), "
        "and against the write path without the index, interleaved (the index's cost on the hot path; the "
        "emulator answers requests sent together one after another). "
        "Before the copies: "
        + ", ".join(f"[{LATER}/{name}]({LATER}/{name})" for name in AZURE_EARLIER)
        + ".",
        "",
        *_table(
            [
                "keys",
                "Azurite's metadata",
                "top --once",
                "by listing",
                "Airflow page",
                "GETs",
                "downloading every row (GETs)",
                "one GET",
                "feed look (by listing)",
                "new key p50, vs the first size",
                "new key vs no index",
            ],
            rows,
        ),
    ]


def _plot(results: dict[str, Any], path: Path, log: Callable[[str], None]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed (it is in the dev group): no handoff.png")
        return
    data = results["benchmarks"]["handoff"]
    counts = list(results["settings"]["handoff_waiters"])
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.6), sharey=True)
    colors = plt.get_cmap("tab10")
    for panel, (mode, title) in zip(
        axes,
        (
            ("push", "push: the watch hub wakes waiters\n(dashed, x: the store's raw notification)"),
            ("poll", "poll: no hub"),
        ),
        strict=True,
    ):
        for index, store in enumerate(ALL_STORES):
            per = data["stores"].get(store, {}).get(mode)
            if per is None:
                continue
            p50 = [per[str(n)]["latency_ms"]["median"] for n in counts]
            p99 = [per[str(n)]["latency_ms"]["p99"] for n in counts]
            color = colors(index)
            panel.plot(counts, p50, marker="o", color=color, label=_SHORT[store])
            panel.plot(counts, p99, linestyle=":", color=color, alpha=0.6)
            raw = data.get("raw_notify", {}).get(store)
            if mode == "push" and raw is not None:
                raw_p50 = [raw[str(n)]["latency_ms"]["median"] for n in counts]
                panel.plot(counts, raw_p50, marker="x", linestyle="--", color=color, alpha=0.7)
        for kind, color in (("filesystem", "black"), ("redis", "dimgrey")):
            per_kind = data.get("anchors", {}).get(kind, {})
            anchor = [n for n in counts if str(n) in per_kind]
            if anchor:
                panel.plot(
                    anchor,
                    [per_kind[str(n)]["latency_ms"]["median"] for n in anchor],
                    marker="s",
                    color=color,
                    linestyle="--",
                    label=per_kind["label"],
                )
        panel.axhline(10, color="grey", linewidth=0.8, linestyle="-.")
        panel.set_xscale("log", base=2)
        panel.set_xticks(counts, [str(n) for n in counts])
        panel.set_yscale("log")
        panel.set_title(title)
        panel.set_xlabel("waiter processes")
        panel.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("complete → waiter has the artifact, ms (p50; dotted: p99)")
    handles, labels = axes[1].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    figure.suptitle(
        f"dibs hand-off latency ({results['mode']} run, {results['started'][:10]}; grey: 10 ms goal)"
    )
    figure.tight_layout(rect=(0, 0.06, 1, 1))
    figure.savefig(path, dpi=110)
    plt.close(figure)

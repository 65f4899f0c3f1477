"""``RESULTS.md`` (goals first, then each benchmark's detail) and ``handoff.png`` from the results."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def _num(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


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
    handoff = _ok(results, "handoff")
    if handoff:
        counts = sorted(int(n) for n in results["settings"]["handoff_waiters"])
        first, last = str(counts[0]), str(counts[-1])
        cells, scaling, anchor = {}, {}, {}
        for store, modes in handoff["stores"].items():
            mode = "push" if "push" in modes else "poll"
            p50 = modes[mode][first]["latency_ms"]["median"]
            note = "" if mode == "push" else " (no push)"
            cells[store] = f"{_num(p50, 1)} ms{_mark(p50 <= 10 if mode == 'push' else None)}{note}"
            ratio = modes[mode]["scaling"]
            scaling[store] = f"{_num(ratio)}x{_mark(ratio <= 2)}"
            vs = modes[mode][first].get("vs_prefect")
            anchor[store] = f"{_num(vs)}x" if vs is not None else "-"
        row("2", f"hand-off p50, push wake-up, N={first} waiter", "≤ 10 ms", cells)
        row("2", f"hand-off p50, N={last} waiters / N={first}", "≤ 2x", scaling)
        prefect = handoff.get("prefect", {}).get(first, {}).get("latency_ms", {}).get("median")
        if prefect is not None:
            row(
                "2",
                f"hand-off p50 vs Prefect's FileSystemLockManager ({_num(prefect, 1)} ms), N={first}",
                "< 1x",
                anchor,
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
                for store, data in takeover["stores"].items()
            },
        )
    waiters = _ok(results, "waiters")
    if waiters:
        for mode, goal, limit in (("poll", "≤ 1 /s (± 5 %)", 1.0), ("push", "→ 0 /s", None)):
            cells = {}
            for store, modes in waiters["stores"].items():
                if mode in modes:
                    rate = modes[mode]["steady_queries_per_s"]
                    cells[store] = f"{_num(rate)} /s{_mark(rate <= limit * 1.05 if limit else None)}"
            label = "polling" if mode == "poll" else "push wake-up"
            row("5", f"store queries per waiter, steady state ({label})", goal, cells)
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


def _handoff_section(data: dict[str, Any], settings: dict[str, Any]) -> list[str]:
    counts = [str(n) for n in settings["handoff_waiters"]]
    hold = settings["handoff_hold"]
    lines = [
        "## 2. Hand-off latency",
        "",
        "From the holder's `complete` call to each waiter process returning with the artifact (ms, p50 / "
        "p99 over all waiters of all rounds). `push`: the store's watch; `poll`: watch disabled. "
        f"The holder completes {hold[0] * 1e3:.0f}-{hold[1] * 1e3:.0f} ms "
        "after the waiters start waiting.",
        "",
    ]
    rows = []
    for store, modes in data["stores"].items():
        for mode, per in modes.items():
            cells = [
                f"{_num(per[n]['latency_ms']['median'], 1)} / {_num(per[n]['latency_ms']['p99'], 1)}"
                for n in counts
            ]
            rows.append([_SHORT.get(store, store), mode, *cells, f"{_num(per['scaling'])}x"])
    prefect = data.get("prefect", {})
    if "skipped" in prefect:
        lines += [f"Prefect anchor skipped: {prefect['skipped']}", ""]
    elif prefect:
        cells = [
            f"{_num(prefect[n]['latency_ms']['median'], 1)} / {_num(prefect[n]['latency_ms']['p99'], 1)}"
            if n in prefect
            else "-"
            for n in counts
        ]
        rows.append(
            ["Prefect FileSystemLockManager", "poll 100 ms", *cells, f"{_num(prefect.get('scaling'))}x"]
        )
    lines += _table(
        ["store", "wake-up", *(f"N={n} p50 / p99" for n in counts), f"N={counts[-1]} / N={counts[0]}"], rows
    )
    lines += ["![hand-off latency](handoff.png)", ""]
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
        f"One waiter per store and mode, waiting {data['wait_s']:g} s on a key that stays held; requests "
        "that reach the store (through a counting proxy of the Store interface). Local probes never reach "
        "a server: SQLite's watch reads `PRAGMA data_version` from shared memory, the file store's watch "
        "`stat`s the record.",
        "",
    ]
    rows = []
    for store, modes in data["stores"].items():
        for mode, row in modes.items():
            rows.append(
                [
                    _SHORT.get(store, store),
                    mode,
                    f"{row['queries']}",
                    f"{row['queries_per_s']:.2f}",
                    f"{row['steady_queries_per_s']:.2f}",
                    f"{row['local_probes_per_s']:.0f}",
                ]
            )
    header = ["store", "wake-up", "queries", "per s, overall", "per s, steady state", "local probes /s"]
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
    return lines


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
    rows = [[info["label"], info["push"], f"`{info['url']}`"] for info in results["stores"].values()]
    lines += _table(["store", "push wake-up", "URL"], rows)
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
        "contention": _contention_section,
        "takeover": _takeover_section,
        "waiters": _waiters_section,
        "startup": _startup_section,
    }
    for name, section in sections.items():
        data = results["benchmarks"].get(name)
        if data is None:
            continue
        if "error" in data:
            lines += [f"## {name}: FAILED", "", "```", data["error"].rstrip(), "```", ""]
            continue
        lines += section(data)
    (out / "RESULTS.md").write_text("\n".join(lines))
    if _ok(results, "handoff"):
        _plot(results, out / "handoff.png", log)


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
        axes, (("push", "push wake-up (the store's watch)"), ("poll", "polling only")), strict=True
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
        prefect = data.get("prefect", {})
        anchor = [n for n in counts if str(n) in prefect]
        if anchor:
            panel.plot(
                anchor,
                [prefect[str(n)]["latency_ms"]["median"] for n in anchor],
                marker="s",
                color="black",
                linestyle="--",
                label="Prefect FileSystemLockManager",
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

"""The benchmark driver: ``python -m benchmarks [--smoke] [--only NAMES] [--stores NAMES] [--out DIR]``."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.pool import Pool
from benchmarks.settings import FULL, SMOKE, Settings
from benchmarks.targets import ALL_STORES, EXTRA_STORES, Target, open_targets

HERE = Path(__file__).resolve().parent
BENCHMARKS = (
    "overhead",
    "handoff",
    "topologies",
    "contention",
    "takeover",
    "waiters",
    "startup",
    "fanin",
    "observing",
    "payloads",
)
REQUIRE_ENV = "DIBS_REQUIRE_SERVICES"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="benchmarks/run", description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="a quick run (under a minute) that CI uses")
    parser.add_argument(
        "--only",
        default=",".join(BENCHMARKS),
        help=f"comma-separated benchmarks (default: all of {BENCHMARKS})",
    )
    parser.add_argument(
        "--stores",
        default=",".join(ALL_STORES + EXTRA_STORES),
        help="comma-separated stores (default: every one this machine can run)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where RESULTS.md, results.json and handoff.png go "
        "(default: benchmarks/results, or benchmarks/results/raw/smoke with --smoke)",
    )
    parser.add_argument(
        "--report-only",
        type=Path,
        metavar="RESULTS_JSON",
        help="measure nothing: rewrite RESULTS.md and handoff.png next to an existing results.json",
    )
    return parser


class _Log:
    def __init__(self) -> None:
        self.started = time.monotonic()

    def __call__(self, message: str) -> None:
        print(f"[{time.monotonic() - self.started:7.1f}s] {message}", file=sys.stderr, flush=True)


def _machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    found = {}
    for package in ("dibs", "sqlalchemy", "psycopg", "pymysql", "redis", "azure-storage-blob", "prefect"):
        with contextlib.suppress(md.PackageNotFoundError):
            found[package] = md.version(package)
    return found


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.report_only is not None:
        from benchmarks import report

        report.write(json.loads(args.report_only.read_text()), args.report_only.parent, _Log())
        return 0
    settings: Settings = SMOKE if args.smoke else FULL
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(only) - set(BENCHMARKS))
    if unknown:
        raise SystemExit(f"unknown benchmark(s) {unknown}; choose from {BENCHMARKS}")
    stores = tuple(name.strip() for name in args.stores.split(",") if name.strip())
    bad = sorted(set(stores) - set(ALL_STORES + EXTRA_STORES))
    if bad:
        raise SystemExit(f"unknown store(s) {bad}; choose from {ALL_STORES + EXTRA_STORES}")
    out: Path = args.out or (HERE / "results" / "raw" / "smoke" if args.smoke else HERE / "results")
    log = _Log()
    log(f"dibs benchmarks, {settings.name} mode: {', '.join(only)} on {', '.join(stores)}")

    from benchmarks import (
        contention,
        fanin,
        handoff,
        observing,
        overhead,
        payloads,
        report,
        startup,
        takeover,
        topologies,
        waiters,
    )

    results: dict[str, Any] = {
        "mode": settings.name,
        "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": _machine(),
        "versions": _versions(),
        "settings": {k: v for k, v in vars(settings).items()},
        "benchmarks": {},
    }
    with open_targets(stores) as (targets, skipped):
        results["stores"] = {
            t.name: {"label": t.label, "push": t.push_how, "url": _shown(t)} for t in targets
        }
        results["skipped"] = skipped
        for name, reason in skipped.items():
            log(f"skipping the {name} store: {reason}")
        main_targets = [t for t in targets if t.name in ALL_STORES]
        pool = _LazyPool(max(*settings.handoff_waiters, settings.contention_processes), log)
        fanin_waiter = fanin.WaiterProcess()

        def waiters_run() -> dict[str, Any]:
            if "fanin" in only:  # it imports Airflow meanwhile: the waiter load measures no time
                fanin_waiter.start()
            return waiters.run(main_targets, settings, log)

        runners: dict[str, Callable[[], dict[str, Any]]] = {
            "overhead": lambda: overhead.run(targets, settings, log),
            "handoff": lambda: handoff.run(main_targets, settings, log, pool.get()),
            "topologies": lambda: topologies.run(settings, log, pool.get()),
            "contention": lambda: contention.run(main_targets, settings, log, pool.get()),
            "takeover": lambda: takeover.run(main_targets, settings, log, pool.get()),
            "waiters": waiters_run,
            "startup": lambda: startup.run(
                settings, log, next((t for t in main_targets if t.name == "postgres"), None)
            ),
            "fanin": lambda: fanin.run(main_targets, settings, log, fanin_waiter),
            "observing": lambda: observing.run(main_targets, settings, log),
            "payloads": lambda: payloads.run(targets, settings.payload_sizes, log),
        }
        with pool, fanin_waiter:
            failed = _run_all(only, runners, results, log)
    results["seconds"] = time.monotonic() - log.started
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2, sort_keys=False, default=str) + "\n")
    report.write(results, out, log)
    log(f"done in {results['seconds']:.1f}s; results in {out}")
    required = os.environ.get(REQUIRE_ENV, "").strip().lower() in {"1", "true", "yes"}
    if required and results["skipped"]:
        log(f"{REQUIRE_ENV}=1 and stores were skipped: {sorted(results['skipped'])}")
        failed = True
    return 1 if failed else 0


class _LazyPool:
    """The worker processes, started on first use (only the multi-process benchmarks need them)."""

    def __init__(self, size: int, log: Callable[[str], None]) -> None:
        self.size = size
        self.log = log
        self._pool: Pool | None = None

    def get(self) -> Pool:
        if self._pool is None:
            self.log(f"starting {self.size} worker processes")
            self._pool = Pool(self.size)
            for index in range(self.size):
                self._pool.start(index, "ping")
            for index in range(self.size):
                self._pool.result(index)
        return self._pool

    def __enter__(self) -> _LazyPool:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.close()


def _run_all(
    only: list[str],
    runners: dict[str, Callable[[], dict[str, Any]]],
    results: dict[str, Any],
    log: Callable[[str], None],
) -> bool:
    """Run the chosen benchmarks in order; ``True`` if any failed (each failure is recorded)."""
    failed = False
    for name in BENCHMARKS:
        if name not in only:
            continue
        began = time.monotonic()
        try:
            results["benchmarks"][name] = runners[name]()
        except Exception as exc:  # report it, finish the others, fail at the end
            failed = True
            log(f"{name} FAILED: {type(exc).__name__}: {exc}")
            results["benchmarks"][name] = {"error": traceback.format_exc()}
        # Something wrong that did not stop the benchmark (a waiter that failed): fail, keep the figures.
        for problem in results["benchmarks"][name].get("problems", []):
            failed = True
            log(f"{name} FAILED: {problem}")
        results["benchmarks"][name]["seconds"] = time.monotonic() - began
    return failed


def _shown(target: Target) -> str:
    from dibs.stores import redact_url

    url = target.url
    if url.startswith("azure://"):
        url = url.split("?", 1)[0] + "?connection_string=<Azurite dev account>"
    elif url.startswith(("sqlite", "file")):
        url = url.split("://", 1)[0] + "://<scratch dir>" + ("?" + url.split("?", 1)[1] if "?" in url else "")
    return redact_url(url)

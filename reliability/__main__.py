"""``python -m reliability`` (or ``reliability/run``): every scenario on every available store.

Full size by default, writing ``RELIABILITY.md`` at the repository root; ``--ci`` runs the reduced
sizes and writes no report unless ``--report`` is given. The exit status is 0 only when no
unexpected violation was found (expected ones are documented limits, shown in the report), and, with
``--require`` (or ``DIBS_REQUIRE_SERVICES=1``), only when every store and libfaketime were available.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from reliability import report, scenarios, targets
from reliability.scenarios import CI, FULL, Launcher, ScenarioResult

ROOT = Path(__file__).resolve().parent.parent


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reliability/run",
        description="Fault injection and history checking on every dibs store (see reliability/__init__.py).",
    )
    parser.add_argument(
        "--ci", action="store_true", help="reduced sizes (a few minutes); no report unless --report"
    )
    parser.add_argument(
        "--stores", default=",".join(targets.ALL_STORES), help="comma-separated stores (default: all)"
    )
    parser.add_argument(
        "--scenarios", default=",".join(scenarios.SCENARIOS), help="comma-separated scenarios (default: all)"
    )
    parser.add_argument(
        "--report", type=Path, help="Markdown report to write (default for a full run: RELIABILITY.md)"
    )
    parser.add_argument("--json", type=Path, help="also write every result as JSON here")
    parser.add_argument(
        "--seed", type=int, default=20261125, help="seed of every random choice (default: %(default)s)"
    )
    parser.add_argument(
        "--require", action="store_true", help="fail when a store or libfaketime is unavailable"
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the recorded histories (kept anyway on violations)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # The harness reads stores directly (final reads, hostile input); what dibs logs there is the
    # expected reaction to planted damage, and is judged by the checks, not printed.
    logging.getLogger("dibs").addHandler(logging.NullHandler())
    sizes = CI if args.ci else FULL
    stores = [s for s in args.stores.split(",") if s]
    chosen = [s for s in args.scenarios.split(",") if s]
    unknown = [s for s in chosen if s not in scenarios.SCENARIOS] + [
        s for s in stores if s not in targets.ALL_STORES
    ]
    if unknown:
        print(f"unknown store or scenario: {', '.join(unknown)}", file=sys.stderr)
        return 2
    require = args.require or os.environ.get("DIBS_REQUIRE_SERVICES", "").strip().lower() in {
        "1",
        "true",
        "yes",
    }
    workdir = Path(tempfile.mkdtemp(prefix="dibs-reliability-"))
    launcher = Launcher()
    results: list[ScenarioResult] = []
    unavailable: dict[str, str] = {}
    started = time.monotonic()
    print(
        f"reliability: {'CI' if args.ci else 'full'} size, seed {args.seed}, histories in {workdir}",
        flush=True,
    )
    try:
        for store in stores:
            try:
                target = targets.open_target(store, workdir / store / "space", defaults=True)
            except targets.TargetUnavailable as exc:
                unavailable[store] = str(exc)
                print(f"  {store:<8} unavailable: {exc}", flush=True)
                continue
            try:
                for offset, name in enumerate(chosen):
                    result = scenarios.run_scenario(
                        name,
                        target,
                        sizes,
                        workdir / store / name,
                        launcher=launcher,
                        seed=args.seed + offset,
                    )
                    results.append(result)
                    print("  " + report.one_line(result), flush=True)
                    for violation in result.unexpected[:10]:
                        print(f"      VIOLATION {violation}", flush=True)
            finally:
                target.close()
    finally:
        targets.stop_azurite()
    elapsed = time.monotonic() - started
    unexpected = sum(len(r.unexpected) for r in results)
    missing_skew = [r.store for r in results if r.scenario == "skew" and r.skipped]
    out = args.report or (None if args.ci else ROOT / "RELIABILITY.md")
    if out is not None:
        out.write_text(
            report.render(
                results, unavailable, sizes=sizes, full=not args.ci, seed=args.seed, seconds=elapsed
            )
        )
        print(f"reliability: wrote {out}")
    if args.json is not None:
        args.json.write_text(json.dumps([r.to_json() for r in results], indent=1, default=str))
    print(
        f"reliability: {len(results)} scenario runs in {elapsed:.0f}s, {unexpected} unexpected violation(s)"
    )
    failed = unexpected > 0 or (require and (unavailable or missing_skew))
    if require and (unavailable or missing_skew):
        print(f"reliability: required but unavailable: {sorted(unavailable) + missing_skew}", file=sys.stderr)
    if failed or args.keep:
        print(f"reliability: histories kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""6. Import and CLI start-up: ``import dibs`` and ``dibs --help`` against a bare interpreter.

Each command runs as a fresh subprocess, the commands interleaved run by run; reported are medians.
The baseline is ``python -c "pass"`` with the same interpreter. Also measured, for information: the
first use of the default SQLite store (``import dibs`` + open + one read), which pulls in SQLAlchemy,
and the modules that ``import dibs`` spends the most time on (``python -X importtime``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.stats import ratio, summarize


def _dibs_script() -> list[str]:
    script = Path(sys.executable).with_name("dibs")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "dibs"]


def _importtime(environment: dict[str, str]) -> dict[str, Any]:
    """``import dibs`` under ``-X importtime``: its total, and the modules with the most own time."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import dibs"],
        capture_output=True,
        text=True,
        env=environment,
        check=True,
    )
    rows: list[dict[str, Any]] = []
    for line in done.stderr.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if len(parts) != 3 or not parts[0].strip().isdigit():
            continue
        rows.append(
            {"module": parts[2].strip(), "self_ms": int(parts[0]) / 1e3, "cumulative_ms": int(parts[1]) / 1e3}
        )
    total = next((row["cumulative_ms"] for row in rows if row["module"] == "dibs"), None)
    heaviest = sorted(rows, key=lambda row: row["self_ms"], reverse=True)[:12]
    return {"dibs_cumulative_ms": total, "heaviest": heaviest}


def run(settings: Any, log: Callable[[str], None]) -> dict[str, Any]:
    scratch = Path(tempfile.mkdtemp(prefix="dibs-bench-startup-"))
    environment = {**os.environ, "DIBS_HOME": str(scratch)}
    environment.pop("DIBS_STORE_URL", None)
    commands = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "python -c 'import dibs'": [sys.executable, "-c", "import dibs"],
        "dibs --help": [*_dibs_script(), "--help"],
        "import dibs + first use of the SQLite default": [
            sys.executable,
            "-c",
            "import dibs; c = dibs.Reservations(); c.status('k'); c.close()",
        ],
    }
    samples: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(settings.startup_runs + 1):  # the first pass warms the page cache and is dropped
        for name, command in commands.items():
            started = time.perf_counter()
            subprocess.run(command, env=environment, check=True, stdout=subprocess.DEVNULL)
            samples[name].append(time.perf_counter() - started)
    summaries = {name: summarize(values[1:]) for name, values in samples.items()}
    base = summaries["python -c pass"].median
    results: dict[str, Any] = {
        "runs": settings.startup_runs,
        "ms": {name: summary.to_dict(1e3) for name, summary in summaries.items()},
        "ratio": {name: ratio(summary.median, base) for name, summary in summaries.items()},
        "added_ms": {name: (summary.median - base) * 1e3 for name, summary in summaries.items()},
        "importtime": _importtime(environment),
    }
    for name in commands:
        log(f"startup {name}: {summaries[name].median * 1e3:.0f} ms ({results['ratio'][name]:.1f}x)")
    return results

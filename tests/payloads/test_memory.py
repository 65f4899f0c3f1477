"""Memory: a large artifact crosses processes without being copied through memory.

The issue's bounds, measured in the processes themselves (peak RSS: ``VmHWM``; for the CLI,
``getrusage`` of its children in a small wrapper): with records on PostgreSQL and payloads in a
folder, a bytes value handed from a holder process to a waiting one grows neither by more than 1.5x
the payload + 64 MB, and the PostgreSQL table holds only the record; ``dibs run --payloads`` with a
large stdout, ``dibs wait`` and a later ``dibs run`` (a hit) printing it back each stay under 200 MB
of RSS. Sizes: 200 MB and 1 GB under ``DIBS_FULL=1``; in CI 160 MB (a second copy would break the
bound) and 256 MB (over the 200 MB bound by itself). Before payload stores the waiter held 6.2 copies
of the payload.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

import dibs
from tests.backends import postgres
from tests.services import full_size

SPAWN = multiprocessing.get_context("spawn")
MB = 1024 * 1024


def _peak_rss() -> int:
    """This process's peak RSS in bytes: ``VmHWM``, which starts afresh at ``exec`` (``ru_maxrss`` of a
    spawned child would start from its parent's size, hiding anything smaller)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _hold(records: str, payloads: str, size: int, ready: str, result: str) -> None:
    client = dibs.Reservations(records, payloads=payloads, serializer="bytes", ttl=60)
    lease = client.acquire("big")
    assert isinstance(lease, dibs.Acquired)
    baseline = _peak_rss()
    Path(ready).touch()  # the waiter is told to wait only once the lease is held
    value = os.urandom(size)
    digest = hashlib.sha256(value).hexdigest()
    report = client.hold(lease, lambda: value)
    assert report.stored
    Path(result).write_text(f"{baseline} {_peak_rss()} {digest}")


def _wait(records: str, payloads: str, ready: str, result: str) -> None:
    client = dibs.Reservations(records, payloads=payloads, serializer="bytes")
    while not Path(ready).exists():
        time.sleep(0.01)
    baseline = _peak_rss()
    report = client.compute("big", lambda: b"never computed here")
    assert report.role == "waited", report.role
    digest = hashlib.sha256(report.value).hexdigest()
    Path(result).write_text(f"{baseline} {_peak_rss()} {digest}")


def test_a_large_value_crosses_processes_in_bounded_memory(tmp_path: Path) -> None:
    size = (200 if full_size() else 160) * MB  # 160: two copies (320 MB) would exceed the bound
    with postgres.isolated_url(tmp_path) as records:
        payloads = (tmp_path / "payloads").as_uri()
        ready, held, waited = (str(tmp_path / name) for name in ("ready", "held", "waited"))
        holder = SPAWN.Process(target=_hold, args=(records, payloads, size, ready, held))
        waiter = SPAWN.Process(target=_wait, args=(records, payloads, ready, waited))
        holder.start()
        waiter.start()
        for child in (holder, waiter):
            child.join(timeout=600)
            assert child.exitcode == 0, f"{child.name} exited with {child.exitcode}"
        bound = 1.5 * size + 64 * MB
        results = {}
        for name, path in (("holder", held), ("waiter", waited)):
            baseline, peak, digest = Path(path).read_text().split()
            results[name] = digest
            grew = int(peak) - int(baseline)
            print(f"{name}: grew by {grew / MB:.0f} MB for a {size / MB:.0f} MB value")
            assert grew <= bound, f"the {name} grew by {grew / MB:.0f} MB, above {bound / MB:.0f} MB"
        assert results["holder"] == results["waiter"]  # the same bytes, not just as many

        # The coordination database holds the record only, not the payload.
        import sqlalchemy as sa

        engine = sa.create_engine(records.split("?", 1)[0])
        schema = records.rsplit("schema=", 1)[1]
        try:
            with engine.connect() as conn:
                used = conn.execute(
                    sa.text(
                        "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c JOIN "
                        "pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = :s AND c.relkind = 'r'"
                    ),
                    {"s": schema},
                ).scalar_one()
        finally:
            engine.dispose()
        assert used < MB, f"the PostgreSQL tables take {used:,} bytes"


_MEASURE = """
import hashlib, resource, subprocess, sys
process = subprocess.Popen(sys.argv[2:], stdout=subprocess.PIPE)
digest, size = hashlib.sha256(), 0
while chunk := process.stdout.read(1 << 20):
    digest.update(chunk)
    size += len(chunk)
status = process.wait()
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
open(sys.argv[1], "w").write(f"{status} {peak} {size} {digest.hexdigest()}")
"""


def _measured(tmp_path: Path, name: str, command: list[str], env: dict[str, str]) -> tuple[int, int, str]:
    """Run ``command``, reading its stdout in chunks; its exit status, peak RSS, size and digest."""
    out = tmp_path / f"{name}.measure"
    subprocess.run([sys.executable, "-c", _MEASURE, str(out), *command], env=env, check=True, timeout=900)
    status, peak, size, digest = out.read_text().split()
    assert status == "0", f"{name} exited with {status}"
    return int(peak), int(size), digest


def test_dibs_run_and_dibs_wait_stream_a_large_stdout(tmp_path: Path) -> None:
    size = (1024 if full_size() else 256) * MB
    with postgres.isolated_url(tmp_path) as records:
        env = {**os.environ, "DIBS_STORE_URL": records, "DIBS_PAYLOADS_URL": (tmp_path / "payloads").as_uri()}
        produce = f"head -c {size} /dev/urandom | tee {tmp_path / 'made'}"
        dibs_cli = [sys.executable, "-m", "dibs"]
        run_peak, run_size, run_digest = _measured(
            tmp_path, "run", [*dibs_cli, "run", "--key", "out", "--", "sh", "-c", produce], env
        )
        wait_peak, wait_size, wait_digest = _measured(tmp_path, "wait", [*dibs_cli, "wait", "out"], env)
        # A hit of dibs run prints the stored stdout as dibs wait does (COMMAND does not run).
        hit_peak, hit_size, hit_digest = _measured(
            tmp_path, "hit", [*dibs_cli, "run", "--key", "out", "--", "false"], env
        )
    made = hashlib.sha256()
    with open(tmp_path / "made", "rb") as stream:
        while chunk := stream.read(MB):
            made.update(chunk)
    assert (run_size, wait_size, hit_size) == (size, size, size)
    assert run_digest == wait_digest == hit_digest == made.hexdigest()
    print(
        f"peak RSS for {size / MB:.0f} MB: dibs run {run_peak / MB:.0f} MB, "
        f"dibs wait {wait_peak / MB:.0f} MB, dibs run on a hit {hit_peak / MB:.0f} MB"
    )
    for name, peak in (("dibs run", run_peak), ("dibs wait", wait_peak), ("dibs run (a hit)", hit_peak)):
        assert peak < 200 * MB, f"{name} peaked at {peak / MB:.0f} MB of RSS"


@pytest.fixture(autouse=True)
def _postgres_present() -> None:
    postgres.server_url()  # skips (or fails under DIBS_REQUIRE_SERVICES) without PostgreSQL

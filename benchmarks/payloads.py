"""8. Large-artifact hand-off through a payload store, against a plain file copy of the same bytes.

Part of ``python -m benchmarks`` (``--only payloads``; its smoke run hands off 1 MB twice, its full
run 1 MB, 100 MB and 1 GB), and on its own: ``python -m benchmarks.payloads`` (1 MB and 100 MB;
``--full`` adds 1 GB; ``--out DIR``, default ``benchmarks/results``, writes ``PAYLOADS.md`` and
``payloads.json``).

Records on PostgreSQL; payloads in a local folder (named by SHA-256, the default, and by BLAKE3,
``?digest=blake3``, when the ``blake3`` extra is installed) and on Azure Blob (Azurite). Per size and payload
store, two fresh processes: a holder (the value already in its memory) and a waiter blocked in
``Reservations.compute`` on the same key. A round's time runs from the holder's ``Lease.complete``
call to the waiter holding the value (read back and checked against its SHA-256): the whole
hand-off, writing the payload, publishing the reference, waking the waiter, reading it back.

The baseline, measured in the same run and interleaved round by round, is the physical limit of
that hand-off: a plain copy of the same bytes from one file to another on the same disk
(``shutil.copyfile`` then ``fsync``, the durability the payload store's writer also pays). Both
are reported as throughput (MB/s, medians of the rounds); the ratio is dibs' share of the copy's
throughput. Each process's peak RSS (``getrusage``) is reported too, against the payload size.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
import multiprocessing
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from benchmarks.targets import Target

MB = 1024 * 1024
HERE = Path(__file__).resolve().parent
SPAWN = multiprocessing.get_context("spawn")


def _peak_rss() -> int:
    """This process's peak RSS in bytes: ``VmHWM``, which starts afresh at ``exec`` (``ru_maxrss`` of a
    spawned child would start from its parent's size, hiding anything smaller)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _holder(records: str, payloads: str, size: int, conn: Connection) -> None:
    import dibs

    client = dibs.Reservations(records, payloads=payloads, serializer="bytes", ttl=600)
    client.status("warm-up")  # connections and tables ready before the first round
    value = os.urandom(size)
    baseline = _peak_rss()
    conn.send(("ready", hashlib.sha256(value).hexdigest(), baseline))
    while (message := conn.recv()) is not None:
        _, key = message
        got = client.acquire(key)
        assert isinstance(got, dibs.Acquired), got
        conn.send("held")
        conn.recv()  # go
        started = time.monotonic()
        got.lease.complete(value)
        conn.send(started)
    conn.send(_peak_rss())


def _waiter(records: str, payloads: str, conn: Connection) -> None:
    import dibs

    client = dibs.Reservations(records, payloads=payloads, serializer="bytes")
    client.status("warm-up")
    conn.send(("ready", _peak_rss()))
    while (message := conn.recv()) is not None:
        _, key = message
        conn.send("waiting")
        report = client.compute(key, lambda: b"")  # never runs: the key is held
        arrived = time.monotonic()
        assert report.role == "waited", report.role
        conn.send((arrived, hashlib.sha256(report.value).hexdigest(), len(report.value)))
        del report
    conn.send(_peak_rss())


def _file_copy(source: Path, folder: Path) -> float:
    target = folder / f"copy-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    shutil.copyfile(source, target)
    with open(target, "rb+") as stream:
        os.fsync(stream.fileno())
    elapsed = time.monotonic() - started
    target.unlink()
    return elapsed


def _case(records: str, payloads: str, size: int, rounds: int, scratch: Path) -> dict[str, Any]:
    to_holder, holder_end = SPAWN.Pipe()
    to_waiter, waiter_end = SPAWN.Pipe()
    holder = SPAWN.Process(target=_holder, args=(records, payloads, size, holder_end))
    waiter = SPAWN.Process(target=_waiter, args=(records, payloads, waiter_end))
    holder.start()
    waiter.start()
    _, digest, holder_base = to_holder.recv()
    _, waiter_base = to_waiter.recv()
    source = scratch / "source"
    with open(source, "wb") as stream:  # the same number of random bytes, for the copy
        for _ in range(max(1, size // MB)):
            stream.write(os.urandom(min(size, MB)))
    handoffs, copies = [], []
    try:
        for number in range(rounds):
            copies.append(_file_copy(source, scratch))
            key = f"payloads-{size}-{uuid.uuid4().hex[:8]}-{number}"
            to_holder.send(("round", key))
            assert to_holder.recv() == "held"
            to_waiter.send(("wait", key))
            assert to_waiter.recv() == "waiting"
            time.sleep(0.3)  # the waiter is in its wait (subscribed) before the holder completes
            to_holder.send("go")
            started = to_holder.recv()
            arrived, got, length = to_waiter.recv()
            assert (got, length) == (digest, size), "the waiter got other bytes"
            handoffs.append(arrived - started)
        to_holder.send(None)
        to_waiter.send(None)
        holder_peak, waiter_peak = to_holder.recv(), to_waiter.recv()
    finally:
        for child in (holder, waiter):
            child.join(timeout=120)
            if child.is_alive():
                child.kill()
        source.unlink(missing_ok=True)
    handoff, copy = statistics.median(handoffs), statistics.median(copies)
    return {
        "size_mb": size / MB,
        "rounds": rounds,
        "handoff_s": handoff,
        "copy_s": copy,
        "handoff_mb_s": size / MB / handoff,
        "copy_mb_s": size / MB / copy,
        "share_of_copy": copy / handoff,
        "holder_peak_rss_mb": holder_peak / MB,
        "waiter_peak_rss_mb": waiter_peak / MB,
        "holder_growth_mb": (holder_peak - holder_base) / MB,
        "waiter_growth_mb": (waiter_peak - waiter_base) / MB,
    }


def run(
    targets: Sequence[Target], sizes: Sequence[tuple[int, int]], log: Callable[[str], None]
) -> dict[str, Any]:
    """Every size through a folder (SHA-256, and BLAKE3 with the extra) and, when Azurite is among
    ``targets``, Azure Blob; records on the
    PostgreSQL target. ``{"stores": {name: [case, ...] or a skip reason}}``."""
    urls = {target.name: target.url for target in targets}
    if "postgres" not in urls:
        return {"stores": {"folder": "needs the PostgreSQL store (records)"}}
    results: dict[str, Any] = {"stores": {}}
    with tempfile.TemporaryDirectory(prefix="dibs-payloads-bench-") as scratch:
        folder = Path(scratch)
        choices = {"folder": (folder / "payloads").as_uri()}
        if importlib.util.find_spec("blake3") is not None:  # the extra: payloads named by BLAKE3
            choices["folder, ?digest=blake3"] = (folder / "payloads").as_uri() + "?digest=blake3"
        else:
            results["stores"]["folder, ?digest=blake3"] = "the blake3 extra is not installed"
        if "azure" in urls:
            choices["Azure Blob (Azurite)"] = urls["azure"]
        else:
            results["stores"]["Azure Blob (Azurite)"] = "the Azure store (Azurite) is not available"
        for name, payloads in choices.items():
            results["stores"][name] = []
            for size, rounds in sizes:
                log(f"payloads: {name}, {size / MB:,.0f} MB x {rounds}")
                results["stores"][name].append(_case(urls["postgres"], payloads, size, rounds, folder))
                with contextlib.suppress(FileNotFoundError):
                    shutil.rmtree(folder / "payloads")
    return results


def table(stores: dict[str, Any]) -> list[str]:
    """The results as a Markdown table (shared with the main report's section)."""
    lines = [
        "| payloads | size | rounds | hand-off MB/s | file copy MB/s | share | holder peak RSS (growth) "
        "| waiter peak RSS (growth) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for store, cases in stores.items():
        if isinstance(cases, str):
            lines.append(f"| {store} | skipped: {cases} | | | | | | |")
            continue
        for case in cases:
            lines.append(
                f"| {store} | {case['size_mb']:,.0f} MB | {case['rounds']} | {case['handoff_mb_s']:,.0f} | "
                f"{case['copy_mb_s']:,.0f} | {100 * case['share_of_copy']:.0f} % | "
                f"{case['holder_peak_rss_mb']:,.0f} MB (+{case['holder_growth_mb']:,.0f}) | "
                f"{case['waiter_peak_rss_mb']:,.0f} MB (+{case['waiter_growth_mb']:,.0f}) |"
            )
    return lines


METHOD = (
    "Records on PostgreSQL; see [benchmarks/payloads.py](../payloads.py) for the method. Throughput is the "
    "payload size over the median round (holder's `complete` call to the waiter holding the checked "
    "value); *share* is that throughput over a plain `copyfile`+`fsync` of the same bytes on the same "
    "disk, measured in the same run, interleaved. Goal: share ≥ 50 % for the folder. Peak RSS: each "
    "process's maximum, with its growth over its size before the hand-off."
)


def _report(results: dict[str, Any]) -> str:
    lines = [
        "# Large-artifact hand-off (payload stores)",
        "",
        f"Made by `python -m benchmarks.payloads{' --full' if results['full'] else ''}` on "
        f"{results['machine']} ({results['started']}). " + METHOD,
        "",
        *table(results["stores"]),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.payloads", description=__doc__.split("\n")[0])
    parser.add_argument("--full", action="store_true", help="add the 1 GB case (several minutes)")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument(
        "--sizes", help="comma-separated sizes in MB instead of the default ones (e.g. 100,1024)"
    )
    parser.add_argument("--no-azure", action="store_true", help="the folder payload stores only (no Azurite)")
    args = parser.parse_args(argv)
    sizes = [(1 * MB, 7), (100 * MB, 5)] + ([(1024 * MB, 3)] if args.full else [])
    if args.sizes:
        rounds = {1: 7, 100: 5, 1024: 3}
        sizes = [(int(mb) * MB, rounds.get(int(mb), 3)) for mb in args.sizes.split(",")]
    from benchmarks.main import _machine
    from benchmarks.targets import open_targets

    machine = _machine()
    results: dict[str, Any] = {
        "full": args.full,
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{machine['cpus']} x {machine['cpu']}, Python {machine['python']}",
        "stores": {},
    }
    with open_targets(("postgres",) if args.no_azure else ("postgres", "azure")) as (targets, skipped):
        if not any(target.name == "postgres" for target in targets):
            raise SystemExit(f"the payload benchmark needs PostgreSQL: {skipped.get('postgres')}")
        found = run(targets, sizes, lambda line: print(line, file=sys.stderr, flush=True))
    results["stores"] = found["stores"]
    if "azure" in skipped:
        results["stores"]["Azure Blob (Azurite)"] = skipped["azure"]
    if args.no_azure:
        results["stores"].pop("Azure Blob (Azurite)", None)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "payloads.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "PAYLOADS.md").write_text(_report(results))
    print(_report(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Real OS processes racing on one store: exactly-once, SIGKILL takeover, SIGSTOP fencing, re-entry.

Each test runs on every store that processes can share (``process_store_url``). Sizes are the
issue's: 8 processes x 100 keys (``DIBS_FULL=1`` raises it to 16 x 250).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

import dibs
from tests import workers
from tests.services import full_size

SPAWN = multiprocessing.get_context("spawn")


def _wait_for(path: Path, timeout: float = 60.0) -> list[dict[str, object]]:
    deadline = time.monotonic() + timeout
    while not (lines := workers.read_lines(path)):
        assert time.monotonic() < deadline, f"no child wrote {path.name} within {timeout}s"
        time.sleep(0.02)
    return lines


def test_racing_processes_compute_each_key_exactly_once(process_store_url: str, tmp_path: Path) -> None:
    processes, key_count = (16, 250) if full_size() else (8, 100)
    keys = [f"partition-{i:04d}" for i in range(key_count)]
    start_at = time.time() + 3.0  # after every child has imported dibs
    children = [
        SPAWN.Process(
            target=workers.race_keys,
            # each worker walks the keys in its own order so that they collide all along the way
            args=(process_store_url, keys[w:] + keys[:w], str(tmp_path), w, start_at),
        )
        for w in range(processes)
    ]
    started = time.monotonic()
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=600)
        assert child.exitcode == 0, f"worker exited with {child.exitcode}"
    elapsed = time.monotonic() - started

    executions = Counter(line["key"] for line in workers.read_lines(tmp_path / "executions.jsonl"))
    assert set(executions) == set(keys)
    duplicated = {key: n for key, n in executions.items() if n != 1}
    assert not duplicated, f"computed more than once: {duplicated}"
    for worker in range(processes):
        (report,) = workers.read_lines(tmp_path / f"results-{worker}.jsonl")
        assert report["results"] == {key: f"value-of-{key}" for key in keys}
    store = process_store_url.split(":", maxsplit=1)[0]
    print(f"\n{processes} processes x {key_count} keys on {store}: {elapsed:.2f}s")


def test_a_killed_holder_is_taken_over_after_its_ttl(process_store_url: str, tmp_path: Path) -> None:
    ttl = 1.5
    holder = SPAWN.Process(
        target=workers.hold_forever, args=(process_store_url, "killed", str(tmp_path), ttl)
    )
    holder.start()
    try:
        (announced,) = _wait_for(tmp_path / "holder.jsonl")
        client = dibs.Reservations(process_store_url, namespace="faults", ttl=ttl)
        assert isinstance(client.get_or_reserve("killed", owner="waiter"), dibs.Busy)
        os.kill(holder.pid or 0, signal.SIGKILL)
        holder.join()
        killed_at = time.monotonic()
        last = client.status("killed").lease
        assert last is not None and last.owner == f"holder-{announced['pid']}"

        got = client.acquire("killed", owner="waiter", timeout=60)
        takeover = time.monotonic() - killed_at
    finally:
        if holder.is_alive():
            holder.kill()
    assert isinstance(got, dibs.Acquired)
    assert got.took_over_from == last.owner
    assert got.lease.token == last.token.fence + 1
    assert got.lease.record.acquired_at >= last.expires_at  # exclusion, on the store's clock
    store = process_store_url.split(":", maxsplit=1)[0]
    print(f"\ntakeover after SIGKILL on {store}: {takeover:.2f}s (ttl {ttl}s)")
    got.lease.complete("recovered")
    assert client.run("killed", lambda: "never runs") == "recovered"


def test_a_paused_holder_is_fenced_out_when_it_resumes(process_store_url: str, tmp_path: Path) -> None:
    ttl = 1.0
    paused = SPAWN.Process(
        target=workers.hold_then_finish_on_signal, args=(process_store_url, "paused", str(tmp_path), ttl)
    )
    paused.start()
    try:
        (announced,) = _wait_for(tmp_path / "holder.jsonl")
        os.kill(paused.pid or 0, signal.SIGSTOP)
        client = dibs.Reservations(process_store_url, namespace="faults", ttl=30)
        got = client.acquire("paused", owner="successor", timeout=60)  # waits out the paused lease
        assert isinstance(got, dibs.Acquired) and got.took_over_from is not None
        got.lease.complete("fresh value")
        os.kill(paused.pid or 0, signal.SIGCONT)
        (tmp_path / "go").touch()
        (report,) = _wait_for(tmp_path / "paused-report.jsonl")
        paused.join(timeout=60)
    finally:
        if paused.is_alive():
            os.kill(paused.pid or 0, signal.SIGCONT)
            paused.kill()
    assert got.lease.token > announced["token"]
    assert str(report["heartbeat"]).startswith("LeaseLost") and "already completed" in str(
        report["heartbeat"]
    )
    assert str(report["complete"]).startswith("LeaseLost")
    hit = client.get_or_reserve("paused")
    assert isinstance(hit, dibs.Hit) and hit.value == "fresh value" and hit.producer == "successor"


def test_the_same_logical_owner_reenters_after_its_process_died(
    process_store_url: str, tmp_path: Path
) -> None:
    owner = "dag=features/run=2026-11-25/task=build/map=-1"
    first = SPAWN.Process(
        target=workers.acquire_and_exit, args=(process_store_url, "retry", owner, str(tmp_path))
    )
    first.start()
    first.join(timeout=60)
    (line,) = workers.read_lines(tmp_path / "first.jsonl")
    client = dibs.Reservations(process_store_url, namespace="faults", ttl=60)
    assert isinstance(client.get_or_reserve("retry", owner="someone-else"), dibs.Busy)
    again = client.get_or_reserve("retry", owner=owner)  # the retry: no waiting for the expiry
    assert isinstance(again, dibs.Acquired) and again.lease.token == line["token"]


def test_a_failed_holder_hands_over_at_once_with_the_failure_visible(process_store_url: str) -> None:
    first = dibs.Reservations(process_store_url, namespace="faults", ttl=600)
    second = dibs.Reservations(process_store_url, namespace="faults", ttl=600)

    def boom() -> None:
        raise RuntimeError("upstream table missing")

    with pytest.raises(RuntimeError):
        first.run("failing", boom)
    got = second.get_or_reserve("failing", owner="next")  # no 600 s wait: the lease was released
    assert isinstance(got, dibs.Acquired)
    assert got.last_failure is not None and "upstream table missing" in got.last_failure.error

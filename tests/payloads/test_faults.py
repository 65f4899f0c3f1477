"""Payload faults across real processes, reliability-style: whatever happens to a payload, no caller
gets a wrong value and no computed value is lost; at worst a key computes again.

* a writer SIGKILLed in the middle of its upload: its lease expires, a waiter takes over and stores
  the value, and the partial upload is removed by the next ``reap``;
* concurrent removal: processes compute (and refresh) keys whose payloads are identical across
  processes (so uploads of the same bytes race) while another process forgets, prunes and reaps in a
  loop with almost no grace (GRACE: just what the file system's coarse timestamp clock needs; the
  default is a minute); every value returned is checked byte for byte.
(Missing, truncated and altered payloads: tests/payloads/test_payloads.py.)
"""

from __future__ import annotations

import hashlib
import io
import json
import multiprocessing
import os
import random
import signal
import time
from pathlib import Path

import dibs
from tests.backends import postgres
from tests.cli_harness import eventually
from tests.services import full_size

SPAWN = multiprocessing.get_context("spawn")
SIZE = 100_000  # above the inline limit


def _expected(key: str) -> bytes:
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (SIZE // len(seed) + 1))[:SIZE]


class _Endless(io.RawIOBase):
    """A source that never ends: the writer is killed while it uploads."""

    def __init__(self, started: Path) -> None:
        self.started = started

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        n = min(len(buffer), 64 * 1024)
        buffer[:n] = b"x" * n
        if not self.started.exists():
            self.started.touch()
        else:
            time.sleep(0.01)
        return n


def _upload_forever(records: str, payloads: str, started: str) -> None:
    client = dibs.Reservations(records, payloads=payloads, serializer="bytes", ttl=1.0)
    client.compute("k", lambda: client.put_payload(_Endless(Path(started))))


def test_a_writer_killed_mid_upload_loses_nothing_and_leaves_nothing(tmp_path: Path) -> None:
    payloads = tmp_path / "payloads"
    with postgres.isolated_url(tmp_path) as records:
        started = tmp_path / "started"
        writer = SPAWN.Process(target=_upload_forever, args=(records, payloads.as_uri(), str(started)))
        writer.start()
        eventually(lambda: started.exists() and any((payloads / "partial").iterdir()), "the upload to start")
        assert writer.pid is not None
        os.kill(writer.pid, signal.SIGKILL)
        writer.join(timeout=60)
        with dibs.Reservations(
            records, payloads=payloads.as_uri(), serializer="bytes", payload_grace=0
        ) as client:
            report = client.compute("k", lambda: _expected("k"))
            assert (report.role, report.value) == ("computed", _expected("k"))  # took over the dead lease
            assert report.took_over_from is not None
            client.reap()
            assert list((payloads / "partial").iterdir()) == []  # the partial upload is gone
            assert client.run("k", lambda: b"never") == _expected("k")
            assert [p.read_bytes() for p in (payloads / "sha256").rglob("*") if p.is_file()] == [
                _expected("k")
            ]


#: The removal rule's grace in the race. Not 0: a file's mtime comes from the kernel's coarse clock,
#: which may read a few milliseconds behind the lease's grant time, so a writer's temporary file
#: written at once after its lease looked older than the lease (once in many thousand writes).
GRACE = 0.05


def _compute_keys(records: str, payloads: str, keys: list[str], job: tuple[int, int], out: str) -> None:
    rounds, seed = job
    client = dibs.Reservations(records, payloads=payloads, serializer="bytes", payload_grace=GRACE, ttl=10)
    rng = random.Random(seed)
    lines = []
    for _ in range(rounds):
        for key in rng.sample(keys, len(keys)):
            try:
                report = client.compute(key, lambda k=key: _expected(k), refresh=rng.random() < 0.2)
                lines.append({"key": key, "role": report.role, "right": report.value == _expected(key)})
            except Exception as exc:  # every error is a finding
                lines.append({"key": key, "error": f"{type(exc).__name__}: {exc}"})
    Path(out).write_text("\n".join(json.dumps(line) for line in lines))


def _remove_until(records: str, payloads: str, keys: list[str], stop: str, out: str) -> None:
    client = dibs.Reservations(records, payloads=payloads, serializer="bytes", payload_grace=GRACE)
    rng = random.Random(7)
    removals = 0
    while not Path(stop).exists():
        client.forget(rng.choice(keys))
        client.prune(0)
        client.reap()
        removals += 3
    Path(out).write_text(str(removals))


def test_concurrent_removal_never_serves_a_wrong_value_or_an_error(tmp_path: Path) -> None:
    workers, rounds, keys = (6, 8, 24) if full_size() else (3, 3, 10)
    names = [f"part-{i}" for i in range(keys)]
    payloads = (tmp_path / "payloads").as_uri()
    with postgres.isolated_url(tmp_path) as records:
        dibs.Reservations(records).status("warm-up")  # the table, created once before the race
        stop, removed = tmp_path / "stop", tmp_path / "removed"
        remover = SPAWN.Process(
            target=_remove_until, args=(records, payloads, names, str(stop), str(removed))
        )
        remover.start()
        outs = [tmp_path / f"worker-{w}.jsonl" for w in range(workers)]
        children = [
            SPAWN.Process(target=_compute_keys, args=(records, payloads, names, (rounds, w), str(outs[w])))
            for w in range(workers)
        ]
        for child in children:
            child.start()
        for child in children:
            child.join(timeout=600)
            assert child.exitcode == 0
        stop.touch()
        remover.join(timeout=120)
        assert remover.exitcode == 0
    calls = [json.loads(line) for out in outs for line in out.read_text().splitlines()]
    assert len(calls) == workers * rounds * keys
    errors = [call for call in calls if "error" in call]
    wrong = [call for call in calls if call.get("right") is False]
    assert not errors, errors[:5]
    assert not wrong, wrong[:5]
    assert int(removed.read_text()) > 0  # the removals really ran alongside
    computed = sum(call["role"] == "computed" for call in calls)
    print(f"{len(calls)} calls, {computed} computed, {int(removed.read_text())} removals alongside")

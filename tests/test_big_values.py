"""A large value kept in its record (no payload store) reaches a waiting process, in bounded memory.

Issue 30: without a payload store, a 200 MB value on PostgreSQL made waiters fail with "no answer
within the store's timeout" while the server was up, and a waiter's peak RSS was 9 times the value.
Now a record store reads such a value apart from its record, a chunk per call, each bounded for its
size (:mod:`dibs.stores.large`), into one buffer; one read serves every thread of the process; and a
JSON text is read without the second text ``json.loads`` makes.

Here, on every SQL store (SQLite, PostgreSQL, MariaDB) and Redis, with the stores' own timeouts (10 s
a call): a holder process stores the value, a waiter process blocked in ``compute`` gets it (the
same bytes), and the waiter's peak RSS (``VmHWM``) grows by at most 2.5 times the value (plus 32 MB
for what any first hand-off allocates), for a ``bytes`` value and a JSON text. MariaDB's stock
``max_allowed_packet`` (16 MB, the shared server's) refuses such a value before it is sent, so its
case runs on a MariaDB of its own that takes 1 GB (:mod:`tests.mariadb_servers`). Size: 200 MB under
``DIBS_FULL=1``, 64 MB otherwise (already over ``max_allowed_packet`` and the 16 MB at which
``complete`` advises a payload store; the waiter held 9 times the value before on PostgreSQL,
4 times on Redis and SQLite's JSON, which this bound refuses at either size).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import dibs
from tests.backends import postgres, redis, sqlite
from tests.mariadb_servers import throwaway_mariadb
from tests.services import full_size

SPAWN = multiprocessing.get_context("spawn")
MB = 1024 * 1024
#: What a first hand-off allocates besides the value (buffers, a chunk being read).
SLACK = 32 * MB


def _peak_rss() -> int:
    """This process's peak RSS in bytes: ``VmHWM``, which starts afresh at ``exec``."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/self/status")


def _value(size: int, serializer: str) -> bytes | str:
    if serializer == "bytes":
        return os.urandom(size)
    return os.urandom(size // 2).hex()  # a text of ``size`` characters, stored as a JSON string


def _digest(value: bytes | str) -> str:
    return hashlib.sha256(value if isinstance(value, bytes) else value.encode()).hexdigest()


def _hold(url: str, serializer: str, size: int, folder: str) -> None:
    client = dibs.Reservations(url, serializer=serializer, ttl=120)
    lease = client.acquire("big")
    assert isinstance(lease, dibs.Acquired)
    value = _value(size, serializer)
    Path(folder, "digest").write_text(_digest(value))
    Path(folder, "held").touch()  # the waiter waits on a held key
    report = client.hold(lease, lambda: value)
    assert report.stored, report


def _wait(url: str, serializer: str, folder: str) -> None:
    client = dibs.Reservations(url, serializer=serializer)
    client.status("warm-up")  # connections and tables ready: the baseline is a waiting process's
    deadline = time.monotonic() + 300
    while not Path(folder, "held").exists():
        assert time.monotonic() < deadline, "the holder never held the key"
        time.sleep(0.01)
    baseline = _peak_rss()
    report = client.compute("big", lambda: _value(0, serializer), timeout=600)
    peak = _peak_rss()
    result = {"role": report.role, "digest": _digest(report.value), "baseline": baseline, "peak": peak}
    Path(folder, "waited").write_text(json.dumps(result))


@contextlib.contextmanager
def _store(kind: str, tmp_path: Path) -> Iterator[str]:
    if kind == "mariadb":
        with throwaway_mariadb(max_allowed_packet="1G", innodb_log_file_size="1G") as url:
            yield url
        return
    backend = {"sqlite": sqlite, "postgres": postgres, "redis": redis}[kind]
    with backend.isolated_url(tmp_path) as url:
        yield url


@pytest.mark.parametrize("serializer", ["bytes", "json"])
@pytest.mark.parametrize("kind", ["sqlite", "postgres", "mariadb", "redis"])
def test_a_large_inline_value_reaches_a_waiter_in_bounded_memory(
    kind: str, serializer: str, tmp_path: Path
) -> None:
    size = (200 if full_size() else 64) * MB
    with _store(kind, tmp_path) as url:
        folder = str(tmp_path)
        waiter = SPAWN.Process(target=_wait, args=(url, serializer, folder))
        holder = SPAWN.Process(target=_hold, args=(url, serializer, size, folder))
        waiter.start()
        holder.start()
        for child in (holder, waiter):
            child.join(timeout=900)
            assert child.exitcode == 0, f"the {child.name} exited with {child.exitcode}"
    waited = json.loads(Path(folder, "waited").read_text())
    assert waited["role"] == "waited"
    assert waited["digest"] == Path(folder, "digest").read_text()  # the same bytes, not just as many
    grew = waited["peak"] - waited["baseline"]
    print(f"{kind} {serializer} {size // MB} MB: the waiter grew by {grew / MB:.0f} MB ({grew / size:.2f}x)")
    assert grew <= 2.5 * size + SLACK, f"the waiter grew by {grew / MB:.0f} MB for {size // MB} MB"

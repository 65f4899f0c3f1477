"""What a waiting ``dibs run`` or ``dibs wait`` shows: live on a terminal, one line per event with
``-v`` elsewhere, nothing at all otherwise.

The holder in these tests is this test process: it heartbeats its lease until the waiter is seen
waiting, then stops (as a crashed holder does), so that the lease expires and the waiter, or another
``dibs run``, takes over. No step depends on how long anything takes.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import dibs
from tests.cli_harness import Terminal, posix_only, running
from tests.cli_harness import dibs as run_dibs

TTL = 2.0


@pytest.fixture
def store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


@contextlib.contextmanager
def holding(store: str, key: str, owner: str = "crashed-worker") -> Iterator[dibs.Lease]:
    """Hold ``key`` and keep it alive for the block; afterwards the lease dies of old age in TTL."""
    got = dibs.Reservations(store, ttl=TTL).get_or_reserve(key, owner=owner)
    assert isinstance(got, dibs.Acquired)
    with got.lease.keep_alive(interval=TTL / 8):
        yield got.lease


def test_a_terminal_shows_the_holder_its_lease_and_the_takeover(store: str) -> None:
    posix_only()
    with holding(store, "report"):
        terminal = Terminal("run", "--store", store, "--key", "report", "--", "echo", "computed here")
        try:
            terminal.wait_for("held by crashed-worker")
            terminal.wait_for("lease expires in")
        except BaseException:
            terminal.kill()
            raise
    assert terminal.finish() == 0
    drawn = terminal.drawn
    assert "\r\x1b[2Kdibs: waiting for default/report · held by crashed-worker · lease expires in" in drawn
    assert "dibs: default/report: took over from 'crashed-worker', whose lease expired" in drawn
    assert drawn.endswith("\r\n")  # the live line was replaced by lines that stay
    assert terminal.stdout == b"computed here\n"


def test_a_terminal_shows_why_a_failed_key_is_not_done(store: str) -> None:
    posix_only()
    failed = run_dibs("run", "--key", "broken", "--", "sh", "-c", "exit 3", store=store, check=False)
    assert failed.returncode == 3
    terminal = Terminal("wait", "broken", "--timeout", "1", "--store", store)
    assert terminal.finish() == 75
    drawn = terminal.drawn
    assert "default/broken: not computed: its last attempt failed (1 failure(s); the last by" in drawn
    assert "command \"sh -c 'exit 3'\" exited with status 3" in drawn
    assert "dibs: error: gave up waiting for default/broken after" in drawn


@pytest.mark.parametrize("waiter", ["wait", "run"])
def test_without_a_terminal_a_wait_says_nothing_but_how_it_ended(store: str, waiter: str) -> None:
    args = ("wait", "quiet") if waiter == "wait" else ("run", "--key", "quiet", "--", "echo", "x")
    with holding(store, "quiet"):
        result = run_dibs(args[0], "--timeout", "2", *args[1:], store=store, check=False)
    assert result.returncode == 75  # it did wait, two whole seconds
    assert result.stderr.startswith("dibs: error: gave up waiting for default/quiet after 2.")
    assert result.stderr.count("\n") == 1, result.stderr  # ...and said nothing else
    assert result.stdout == ""


def test_with_v_a_waiter_reports_each_event_once_in_a_line_of_its_own(store: str, tmp_path: Path) -> None:
    go = tmp_path / "go"
    script = "\n".join(
        [
            "import pathlib, sys, time",
            "while not pathlib.Path(sys.argv[1]).exists(): time.sleep(0.02)",
            "print('v2')",
        ]
    )
    slow = [sys.executable, "-c", script, str(go)]
    with running("-v", "wait", "shared", "--store", store) as waiter:
        with holding(store, "shared"):
            waiter.wait_for_line("'crashed-worker' is computing it")
        # The lease now dies of old age; a second worker takes over and computes.
        with running(
            "run", "--store", store, "--key", "shared", "--owner", "worker-b", "--", *slow
        ) as successor:
            waiter.wait_for_line("'worker-b' took over from 'crashed-worker', whose lease expired")
            go.touch()
            assert successor.finish() == 0
            assert successor.stdout == b"v2\n"
        assert waiter.finish() == 0
    assert waiter.stdout == b"v2\n"
    lines = waiter.lines
    assert len(set(lines)) == len(lines), lines  # each event once
    assert "'crashed-worker' is computing it" in lines[0]
    assert "'worker-b' took over from 'crashed-worker'" in lines[-2]
    assert lines[-1].startswith("dibs: default/shared: computed by 'worker-b'")
    # Between them at most the expiry itself, if the waiter looked while nobody held the key.
    assert all("the lease of 'crashed-worker' expired" in line for line in lines[1:-2]), lines


def test_with_json_and_v_every_event_is_a_json_line(store: str) -> None:
    with running("--json", "-v", "run", "--store", store, "--key", "k", "--", "echo", "mine") as run:
        with holding(store, "k"):
            run.wait_for_line('"event": "waiting"')
        assert run.finish() == 0
    events = [json.loads(line) for line in run.lines]
    # Between the wait and the takeover at most the expiry itself, if the waiter looked while nobody
    # held the key (a busy machine can delay its next ask past the lease's end).
    names = [e["event"] for e in events]
    takeover = names.index("takeover")
    assert names[0] == "waiting" and set(names[1:takeover]) <= {"expired"}, names
    assert events[0]["holder"] == "crashed-worker" and events[0]["expires_in"] > 0
    assert events[takeover]["took_over_from"] == "crashed-worker"
    assert json.loads(run.stdout)["took_over_from"] == "crashed-worker"

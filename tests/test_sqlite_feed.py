"""SQLite's change feed (issue 20): woken by an inotify watch on the ``-wal`` file on Linux, by a
``data_version`` look every 4 ms elsewhere. Writers are other processes, as in production; every
assertion is on what prompted the feed's look (:attr:`DataVersionFeed.woken_by`), never on a time."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import select
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import dibs
from dibs.keys import Key
from dibs.records import Granted, checksum
from dibs.runtime import runtime
from dibs.stores import AcquireRequest, NewArtifact, Store, _inotify
from dibs.stores.feeds import fingerprint
from dibs.stores.sql import SQLStore
from dibs.stores.sql.feed import DataVersionFeed
from tests.scale import wait_until

SPAWN = multiprocessing.get_context("spawn")
LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")


def _commit(url: str, name: str) -> None:
    """In another process: a reservation of ``name``, one committed write."""
    client = dibs.Reservations(url, namespace="feed")
    assert isinstance(client.get_or_reserve(name, owner="writer"), dibs.Acquired)
    client.close()


def _commit_in_a_process(url: str, name: str) -> None:
    process = SPAWN.Process(target=_commit, args=(url, name))
    process.start()
    process.join(60)
    assert process.exitcode == 0


def _checkpoint(path: Path, mode: str) -> None:
    with sqlite3.connect(path) as conn:
        busy, _, _ = conn.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()
        assert busy == 0  # the feed's connection reads nothing now: the checkpoint completed
    conn.close()


def _until_changed(feed: DataVersionFeed) -> str:
    """Look until a commit is seen (bounded in looks, not time); what prompted the look that saw it."""
    before = feed.woken_by.copy()
    for _ in range(1000):
        if feed.probe(1.0):
            [(reason, _count)] = (feed.woken_by - before).items()
            return reason
    raise AssertionError("no commit seen in 1000 looks")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLStore]:
    store = SQLStore(f"sqlite:///{tmp_path / 'dibs.db'}")
    yield store
    store.close()


def _feed(store: SQLStore) -> DataVersionFeed:
    feed = store.change_feed()
    assert isinstance(feed, DataVersionFeed)
    return feed


@LINUX
def test_a_commit_in_another_process_wakes_the_feed_by_inotify(store: SQLStore, tmp_path: Path) -> None:
    feed = _feed(store)
    feed.open()
    try:
        assert feed.watching
        assert feed.max_interval == DataVersionFeed.BACKSTOP  # the slow look is only a backstop
        _commit_in_a_process(_url(tmp_path), "a")
        assert _until_changed(feed) == "inotify"
        assert feed.inotify_wakeups >= 1 and feed.woken_by["backstop"] == 0
        # Nothing written since: the next look is the backstop's, and finds nothing.
        assert not feed.probe(0.0)
    finally:
        feed.close()
    assert not feed.watching


@LINUX
@pytest.mark.parametrize("mode", ["TRUNCATE", "RESTART", "PASSIVE"])
def test_a_checkpoint_does_not_stop_the_wake_ups(store: SQLStore, tmp_path: Path, mode: str) -> None:
    url = _url(tmp_path)
    feed = _feed(store)
    feed.open()
    try:
        _commit_in_a_process(url, "before")
        assert _until_changed(feed) == "inotify"
        _checkpoint(tmp_path / "dibs.db", mode)  # TRUNCATE empties the -wal file, RESTART rewinds it
        _commit_in_a_process(url, "after")
        assert _until_changed(feed) == "inotify"
        assert feed.woken_by["backstop"] == 0
    finally:
        feed.close()


@LINUX
def test_a_recreated_wal_file_is_watched_again(store: SQLStore, tmp_path: Path) -> None:
    """SQLite deletes the ``-wal`` file when the last connection closes; the next one creates it anew.
    (The feed's own connection keeps it open, so it is removed here by hand, as another tool might.)"""
    url = _url(tmp_path)
    feed = _feed(store)
    feed.open()
    try:
        _checkpoint(tmp_path / "dibs.db", "TRUNCATE")
        os.unlink(tmp_path / "dibs.db-wal")
        (tmp_path / "dibs.db-wal").touch()  # created again: heard of by the folder's watch
        assert feed._watch is not None and feed._watch.wait(1.0)
        assert feed._watch._file_wd is not None  # and the new file is watched
        _commit_in_a_process(url, "after")
        assert _until_changed(feed) == "inotify"
    finally:
        feed.close()


def test_without_inotify_the_feed_looks_every_few_milliseconds(
    store: SQLStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_inotify, "ENABLED", False)
    feed = _feed(store)
    feed.open()
    try:
        assert not feed.watching and feed.max_interval == DataVersionFeed.POLL
        _commit_in_a_process(_url(tmp_path), "a")
        assert _until_changed(feed) == "poll"
        assert feed.inotify_wakeups == 0
    finally:
        feed.close()


@LINUX
def test_a_new_key_cuts_the_wait_for_a_write_short(store: SQLStore) -> None:
    """The hub adds a key from a waiter's thread: :meth:`wake` makes the feed's wait on the watch end at
    once (its ``eventfd`` is readable), so the feed takes the new key without waiting for the backstop."""
    feed = _feed(store)
    feed.open()
    try:
        watch = feed._watch
        assert watch is not None
        assert not _readable(watch._poke_fd)
        feed.wake()
        assert _readable(watch._poke_fd)  # a wait now ends at once
        assert not feed.probe(60.0)  # and says "nothing written"
        assert not _readable(watch._poke_fd)
        assert feed.changes({"d": Key("feed", "new")}, 0.0) == ()  # the hub's newer set is wanted
        assert feed.changes({"d": Key("feed", "new")}, 0.0) == {"d"}  # a new key is reported once
    finally:
        feed.close()


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


@LINUX
def test_a_forked_child_closes_its_copy_of_the_watch(store: SQLStore) -> None:
    feed = _feed(store)
    feed.open()
    try:
        watch = feed._watch
        assert watch is not None
        fd = watch._fd
        pid = os.fork()
        if pid == 0:  # the child: its copy is closed, the descriptor too
            os._exit(0 if watch.closed and not _is_open(fd) else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert not watch.closed and _is_open(fd)  # the parent's is untouched
    finally:
        feed.close()


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'dibs.db'}"


@LINUX
def test_a_process_with_many_waiters_holds_one_watch(tmp_path: Path) -> None:
    """The watch is the hub's, one per store and process: one inotify instance (and the eventfd that
    cuts its wait short), however many waiters; none left once the hub lets go. In a fresh process,
    so that no other test's hub is closing its own meanwhile."""
    url = _url(tmp_path)
    holder = SQLStore(url)
    names = [f"k{i}" for i in range(20)]
    keys = [Key("feed", name) for name in names]
    tokens = []
    for key in keys:
        granted = holder.acquire(key, AcquireRequest("holder", 60))
        assert isinstance(granted, Granted)
        tokens.append(granted.lease.token)
    ours, theirs = SPAWN.Pipe()
    process = SPAWN.Process(target=_many_waiters, args=(url, names, theirs))
    process.start()
    try:
        assert ours.poll(60)
        before, waiting = ours.recv()
        assert (before, waiting) == (0, 1)
    finally:
        for key, token in zip(keys, tokens, strict=True):
            holder.complete(key, token, NewArtifact("json", b"1", checksum(b"1")))
        holder.close()
    assert ours.poll(60)
    hits, after = ours.recv()
    process.join(60)
    assert process.exitcode == 0
    assert hits == len(names) and after == 0


def _many_waiters(url: str, names: list[str], conn: Any) -> None:
    """In a fresh process: wait on every key in a thread each; send the inotify descriptors before and
    while waiting, then the hits and the descriptors after the hub let go."""
    client = dibs.Reservations(url, namespace="feed")
    before = _inotify_descriptors()
    got: list[object] = []
    threads = [threading.Thread(target=_acquire, args=(client, name, got)) for name in names]
    for thread in threads:
        thread.start()
    wait_until(lambda: _watching(client.store, len(names)), "every waiter is subscribed")
    conn.send((before, _inotify_descriptors()))
    for thread in threads:
        thread.join(60)
    hits = sum(isinstance(outcome, dibs.Hit) for outcome in got)
    runtime().close()  # the hub's thread closes its feed at its next turn
    wait_until(lambda: _inotify_descriptors() == before, "the hub closed its watch", timeout=30)
    conn.send((hits, _inotify_descriptors()))


def _acquire(client: dibs.Reservations, name: str, got: list[object]) -> None:
    got.append(client.acquire(name, timeout=60))


def _watching(store: Store, keys: int) -> bool:
    hub = runtime().hub(store)
    return hub is not None and hub.following and hub.watched == keys


def _inotify_descriptors() -> int:
    found = 0
    for entry in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            found += os.readlink(f"/proc/self/fd/{entry}") == "anon_inode:inotify"
    return found


def test_the_feed_reads_one_changed_key_on_its_own_connection(store: SQLStore) -> None:
    key, other = Key("feed", "done"), Key("feed", "other")
    granted = store.acquire(key, AcquireRequest("alice", 60))
    assert isinstance(granted, Granted)
    store.complete(key, granted.lease.token, NewArtifact("bytes", b"for the hub", checksum(b"for the hub")))
    feed = _feed(store)
    checkouts: list[object] = []
    sa.event.listen(store.engine, "checkout", lambda *args: checkouts.append(args))
    feed.open()
    try:
        checkouts.clear()
        [state] = feed.read_many(store, [key]) or []
        assert checkouts == []  # no pooled connection: the feed's own
        assert state.artifact is not None and state.artifact.verified_payload(key) == b"for the hub"
        assert fingerprint(state) == fingerprint(store.read(key))
        assert feed.read_many(store, [other]) == []  # no row
        # Another store object (one wrapped around this store, say), or several keys: the store reads.
        assert feed.read_many(SQLStore(store.url), [key]) is None
        assert feed.read_many(store, [key, other]) is None
    finally:
        feed.close()
    assert feed.read_many(store, [key]) is None  # closed: the store reads


def _write_elsewhere(path: str, seconds: float, started: Any) -> None:
    """In another process: commits to a table the feed does not watch, as fast as they go."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")  # the most commits a second: the most -wal writes
    conn.execute("CREATE TABLE IF NOT EXISTS elsewhere (n INTEGER)")
    started.set()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        conn.execute("INSERT INTO elsewhere VALUES (1)")
    conn.close()


@LINUX
def test_a_busy_database_does_not_make_the_feed_look_at_every_write(store: SQLStore, tmp_path: Path) -> None:
    """Every commit to the database writes the ``-wal`` file, whatever its table: the feed takes the
    writes heard within :data:`DataVersionFeed.MIN_GAP` of its last look together, so its looks are
    bounded by the time it watched (counted against the elapsed time it measured, not a time limit),
    not by the writer's rate; and it still sees a commit to the watched key."""
    url = _url(tmp_path)
    feed = _feed(store)
    feed.open()
    try:
        assert feed.watching
        started = SPAWN.Event()
        writer = SPAWN.Process(target=_write_elsewhere, args=(str(tmp_path / "dibs.db"), 1.0, started))
        writer.start()
        assert started.wait(60)
        looks_before, wakeups_before = feed.looks, feed.inotify_wakeups
        began = time.monotonic()
        while writer.is_alive():
            feed.probe(0.1)
        elapsed = time.monotonic() - began
        writer.join(60)
        assert writer.exitcode == 0
        looks = feed.looks - looks_before
        assert feed.inotify_wakeups > wakeups_before  # the writes were heard
        assert looks <= 1.2 * elapsed / DataVersionFeed.MIN_GAP + 10, (looks, elapsed)
        _commit_in_a_process(url, "watched")
        assert _until_changed(feed) == "inotify"
    finally:
        feed.close()


def _inotify_or_eventfd(fd: int) -> bool:
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return False
    return "inotify" in target or "eventfd" in target


@LINUX
def test_a_watch_dropped_without_close_closes_its_descriptors(tmp_path: Path) -> None:
    """Its inotify instance counts against the user's ``fs.inotify.max_user_instances``: a watch
    nobody closed gives both descriptors back when it is collected (and one closed gives nothing
    twice: the numbers may be another file's by then)."""
    import gc

    watch = _inotify.watch(str(tmp_path / "x.db-wal"))
    assert watch is not None
    fds = [watch._fd, watch._poke_fd]
    assert all(_inotify_or_eventfd(fd) for fd in fds)
    del watch
    gc.collect()
    assert not any(_inotify_or_eventfd(fd) for fd in fds)
    closed = _inotify.watch(str(tmp_path / "y.db-wal"))
    assert closed is not None
    closed.close()
    reused = [os.open(os.devnull, os.O_RDONLY), os.open(os.devnull, os.O_RDONLY)]
    try:
        del closed
        gc.collect()
        assert all(_is_open(fd) for fd in reused)  # the finalizer closed nothing of someone else's
    finally:
        for fd in reused:
            os.close(fd)


_EXIT_WHILE_WATCHING = """
import atexit, os, sys, threading, time
from dibs.stores import _inotify

atexit.register(time.sleep, 0.6)  # runs after the watches' own exit hooks: the thread still waits then
path = sys.argv[1]
watch = _inotify.watch(path)
assert watch is not None
waiting = threading.Event()

def follow():
    while True:
        waiting.set()
        try:
            watch.wait(0.1)
        except OSError as exc:
            print(f"the watch failed: {exc}", flush=True)
            return

threading.Thread(target=follow, daemon=True).start()
waiting.wait(30)
"""


def test_a_live_watch_is_not_closed_under_its_thread_when_the_process_exits(tmp_path: Path) -> None:
    # dibs wait / run exit while the hub's daemon thread still follows the -wal file; a finalizer that
    # closed the watch's descriptors at exit made that thread read closed ones and warn "lost the
    # change feed ... Bad file descriptor" on the way out.
    if not _inotify.ENABLED:
        pytest.skip("inotify is Linux-only")
    wal = tmp_path / "db.sqlite-wal"
    wal.write_bytes(b"")
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", _EXIT_WHILE_WATCHING, str(wal)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "the watch failed" not in done.stdout, done.stdout

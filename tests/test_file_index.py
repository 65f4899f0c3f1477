"""The file store's index (:mod:`dibs.stores.file_index`): a record that holds a lease always has its
``live`` file, one with an artifact or a failure its ``made`` file, at every moment a record is
renamed into place; what a killed process leaves over is passed by and swept by ``reap``; reads
through the index see what a scan of every record sees, without one; nothing planted under
``index/`` hangs or redirects a writer.

The write order is checked where it happens: a spy on the record's rename looks at the index files
the new record needs, and a spy on the removals looks at the record on disk. Then several processes
race on a few keys while some of them are SIGKILLed, and the index is checked against the records.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from dibs.errors import LeaseLost, StoreUnavailable
from dibs.keys import Key
from dibs.records import Granted, KeyState, LeaseRecord, Present, checksum
from dibs.stores import AcquireRequest, NewArtifact, codec, pages
from dibs.stores.file_index import FileIndex
from dibs.stores.filesystem import FileStore
from dibs.stores.name_index import Layout, made_names

NAMESPACE = "files.index"
SPAWN = multiprocessing.get_context("spawn")
#: How long the racing processes may take before the test gives up on them (not a measurement).
GENEROUS = 120.0


def _granted(outcome: object) -> LeaseRecord:
    assert isinstance(outcome, Granted), outcome
    return outcome.lease


def _payload(data: bytes) -> NewArtifact:
    return NewArtifact("bytes", data, checksum(data))


def _index_files(store: FileStore) -> set[str]:
    """Every index file but the ready marker, as names relative to the store's root."""
    root = store.root / "index"
    return {p.relative_to(store.root).as_posix() for p in root.rglob("*") if p.is_file()} - {"index/ready"}


def _needed(state: KeyState) -> set[str]:
    """The index files a record needs (the rules of dibs.stores.file_index)."""
    layout = Layout("")
    names = made_names(layout, state)
    if state.lease is not None:
        names.add(layout.live(state.key))
    return names


def _scanned(store: FileStore) -> pages.Overview:
    """What ``dibs top`` shows when every record is read (the default of a store without an index)."""
    return pages.overview_of(store.list(NAMESPACE), leases=50, recent=50)


def _keys(states: list[KeyState]) -> list[Key]:
    return [state.key for state in states]


@pytest.fixture
def store(tmp_path: Path) -> FileStore:
    return FileStore(tmp_path / "store")


# --------------------------------------------------------------------------------------------------
# What each write leaves, and in which order


def test_each_write_leaves_the_index_files_its_record_needs_and_no_other(store: FileStore) -> None:
    key = Key(NAMESPACE, "daily")
    assert FileIndex(store.root).is_ready()  # a new store is indexed from its first record

    lease = _granted(store.acquire(key, AcquireRequest("first", 60)))
    assert _index_files(store) == _needed(store.read(key)) == {Layout("").live(key)}
    store.heartbeat(key, lease.token, 120)
    assert _index_files(store) == _needed(store.read(key))

    store.release(key, lease.token, "ValueError: bad rows")  # a failure, no lease
    failed = store.read(key)
    assert failed.failure is not None and _index_files(store) == _needed(failed)

    second = _granted(store.acquire(key, AcquireRequest("second", 60)))
    store.release(key, second.token, "ValueError: bad rows again")  # a newer failure replaces it
    assert _index_files(store) == _needed(store.read(key))

    third = _granted(store.acquire(key, AcquireRequest("third", 60)))
    store.complete(key, third.token, _payload(b"rows"))  # an artifact; the failure stays recorded
    done = store.read(key)
    assert done.artifact is not None and done.failure is not None
    assert _index_files(store) == _needed(done) and len(_index_files(store)) == 2

    assert store.forget(key)  # nothing to show any more: no index file either
    assert _index_files(store) == set()


def test_index_files_come_before_the_record_that_needs_them_and_go_after(
    store: FileStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At each record's rename, every index file the new record needs is there; at each removal, the
    record on disk no longer needs the file removed."""
    records = store.root / "records"
    renamed: list[KeyState] = []
    replace, remove = os.replace, FileIndex.remove

    def spying_replace(src: Any, dst: Any) -> None:
        if Path(dst).parent.parent == records:
            new = codec.decode(Path(src).read_bytes(), None, time.time(), where=str(src))
            missing = _needed(new) - _index_files(store)
            assert not missing, f"{new.key} renamed in before its index files {missing}"
            renamed.append(new)
        replace(src, dst)

    def spying_remove(self: FileIndex, paths: Any) -> None:
        paths = list(paths)
        for path in paths:
            digest = path.name.rpartition("-")[2]
            on_disk = store._reader([])(digest)
            assert on_disk is None or path.relative_to(store.root).as_posix() not in _needed(on_disk)
        remove(self, paths)

    monkeypatch.setattr(os, "replace", spying_replace)
    monkeypatch.setattr(FileIndex, "remove", spying_remove)
    key = Key(NAMESPACE, "ordered")
    for round_ in range(3):
        lease = _granted(store.acquire(key, AcquireRequest(f"holder-{round_}", 60, max_age=0)))
        if round_ == 1:
            store.release(key, lease.token, "RuntimeError: once")
        else:
            store.complete(key, lease.token, _payload(f"{round_}".encode()))
    store.acquire(key, AcquireRequest("refresher", 60, max_age=0))
    assert store.force_release(key) and store.forget(key)
    assert len(renamed) == 9  # every write went through the spy


def test_a_holder_ending_its_lease_removes_the_live_file_before_the_next_can_take_the_key(
    store: FileStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ``live`` file is shared by the key's successive holders: the one ending its lease removes
    it under the key's lock, so a next holder (here trying at that very moment) cannot have taken the
    key, found the file there, and lost it to the removal."""
    key = Key(NAMESPACE, "shared")
    lease = _granted(store.acquire(key, AcquireRequest("first", 60)))
    other = FileStore(store.root, lock_timeout=0)
    tried: list[object] = []
    remove = FileIndex.remove

    def interleaved(self: FileIndex, paths: Any) -> None:
        paths = list(paths)
        if paths and not tried:
            try:
                tried.append(other.acquire(key, AcquireRequest("second", 60)))
            except StoreUnavailable as exc:  # the key's lock is held: the removal comes first
                tried.append(exc)
        remove(self, paths)

    monkeypatch.setattr(FileIndex, "remove", interleaved)
    store.release(key, lease.token)
    monkeypatch.undo()
    assert len(tried) == 1
    assert _needed(store.read(key)) <= _index_files(store)
    assert isinstance(tried[0], StoreUnavailable)


def test_a_write_whose_index_file_cannot_be_made_fails_and_leaves_the_record(store: FileStore) -> None:
    """A FIFO (or a link) planted where a ``live`` file belongs is reported at once: never opened (a
    FIFO would block the writer), never written through; the record stays as it was."""
    key = Key(NAMESPACE, "planted")
    live = store.root / Layout("").live(key)
    live.parent.mkdir(parents=True)
    os.mkfifo(live)
    with pytest.raises(StoreUnavailable, match="FIFO"):
        store.acquire(key, AcquireRequest("worker", 60))
    assert store.read(key).status == "free"
    live.unlink()
    target = store.root.parent / "elsewhere"
    live.symlink_to(target)
    with pytest.raises(StoreUnavailable, match="symbolic link"):
        store.acquire(key, AcquireRequest("worker", 60))
    assert not target.exists() and store.read(key).status == "free"


def test_a_removal_that_fails_after_the_write_landed_does_not_fail_the_write(
    store: FileStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = Key(NAMESPACE, "kept")
    lease = _granted(store.acquire(key, AcquireRequest("worker", 60)))
    unlink = Path.unlink

    def refusing(self: Path, missing_ok: bool = False) -> None:
        if "index" in self.parts:
            raise PermissionError(13, "Permission denied", str(self))
        unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", refusing)
    store.complete(key, lease.token, _payload(b"rows"))  # landed: no error for the left-over file
    monkeypatch.undo()
    assert store.read(key).status == "done"
    assert Layout("").live(key) in _index_files(store)  # left over ...
    assert store.leases(NAMESPACE, expired=False, limit=10) == []  # ... passed by ...
    store.reap(NAMESPACE)
    assert _index_files(store) == _needed(store.read(key))  # ... and swept


# --------------------------------------------------------------------------------------------------
# Reads through the index


def _history(store: FileStore) -> None:
    """Keys in every status, some changed more than once."""
    for i in range(12):
        lease = _granted(store.acquire(Key(NAMESPACE, f"day-{i:02d}"), AcquireRequest("etl", 60)))
        store.complete(lease.key, lease.token, _payload(f"{i}".encode()))
    _granted(store.acquire(Key(NAMESPACE, "day-03"), AcquireRequest("refresh", 60, max_age=0)))
    _granted(store.acquire(Key(NAMESPACE, "held"), AcquireRequest("worker", 600)))
    _granted(store.acquire(Key(NAMESPACE, "expired"), AcquireRequest("crashed", 0.05)))
    for name in ("broken", "broken-twice"):
        lease = _granted(store.acquire(Key(NAMESPACE, name), AcquireRequest("flaky", 60)))
        store.release(lease.key, lease.token, "ValueError: no rows")
    lease = _granted(store.acquire(Key(NAMESPACE, "broken-twice"), AcquireRequest("flaky", 60)))
    store.release(lease.key, lease.token, "ValueError: no rows again")
    lease = _granted(store.acquire(Key(NAMESPACE, "fixed"), AcquireRequest("flaky", 60)))
    store.release(lease.key, lease.token, "ValueError: no rows")
    lease = _granted(store.acquire(Key(NAMESPACE, "fixed"), AcquireRequest("flaky", 60)))
    store.complete(lease.key, lease.token, _payload(b"at last"))
    lease = _granted(store.acquire(Key(NAMESPACE, "retrying"), AcquireRequest("flaky", 60)))
    store.release(lease.key, lease.token, "ValueError: no rows")
    _granted(store.acquire(Key(NAMESPACE, "retrying"), AcquireRequest("flaky", 600)))  # failed, held again
    assert store.forget(Key(NAMESPACE, "day-05"))
    _granted(store.acquire(Key("elsewhere", "day-00"), AcquireRequest("other team", 60)))
    time.sleep(0.1)  # "expired" runs out


def test_reads_through_the_index_match_a_scan_of_every_record(
    store: FileStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    _history(store)
    scanned = _scanned(store)
    held_page = list(store.list(NAMESPACE))
    monkeypatch.setattr(FileStore, "list", lambda *args: pytest.fail("a read scanned the records"))
    seen = store.overview(NAMESPACE, leases=50, recent=50)
    assert seen.counts == scanned.counts == {"held": 3, "expired": 1, "done": 11, "failed": 2}
    for part in ("held", "expired", "artifacts", "failures"):
        assert _keys(getattr(seen, part)) == _keys(getattr(scanned, part)), part
    assert _keys(store.latest(NAMESPACE, "artifact", limit=3)) == _keys(scanned.artifacts[:3])
    for state in ("held", "expired"):
        expected = [s.key for s in held_page if s.status == state]
        assert _keys(list(store.list_page(NAMESPACE, state=state, limit=100).states)) == expected
        paged = [s.key for page in store.list_pages(NAMESPACE, state=state, limit=1) for s in page.states]
        assert paged == expected


def test_a_store_without_an_index_is_scanned_until_reap_builds_it(
    store: FileStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store an older dibs wrote has no ``index/``: reads scan (and never write); ``reap`` indexes it."""
    import shutil

    _history(store)
    shutil.rmtree(store.root / "index")
    scanned = _scanned(store)
    listings: list[str | None] = []
    listed = FileStore.list

    def counting(self: FileStore, namespace: str | None = None) -> Any:
        listings.append(namespace)
        return listed(self, namespace)

    monkeypatch.setattr(FileStore, "list", counting)
    seen = store.overview(NAMESPACE, leases=50, recent=50)
    assert listings == [NAMESPACE]  # one scan per refresh, not one per part of the screen
    monkeypatch.undo()
    assert seen.counts == scanned.counts
    for part in ("held", "expired", "artifacts", "failures"):
        assert _keys(getattr(seen, part)) == _keys(getattr(scanned, part)), part
    assert not (store.root / "index").exists()  # a read wrote nothing
    store.reap(NAMESPACE)  # clears "expired", then indexes every record
    assert FileIndex(store.root).is_ready()
    after = _scanned(store)
    monkeypatch.setattr(FileStore, "list", lambda *args: pytest.fail("a read scanned the records"))
    seen = store.overview(NAMESPACE, leases=50, recent=50)
    assert seen.counts == after.counts and _keys(seen.artifacts) == _keys(after.artifacts)
    assert _keys(seen.held) == _keys(after.held) and _keys(seen.failures) == _keys(after.failures)


def test_files_left_over_are_passed_by_and_swept_by_reap(store: FileStore) -> None:
    _history(store)
    layout = Layout("")
    ghost = Key(NAMESPACE, "never-written")  # a first write killed before its rename
    stale = [
        layout.live(Key(NAMESPACE, "day-00")),  # done: no lease
        layout.live(ghost),
        layout.made("artifact", Key(NAMESPACE, "day-01"), 1.0),  # an artifact it no longer has
        layout.made("failure", ghost, time.time() + 1),
    ]
    for name in stale:
        (store.root / name).parent.mkdir(parents=True, exist_ok=True)
        (store.root / name).touch()
    for planted in ("live", "made/a"):  # neither files of dibs's names nor regular: passed by
        folder = store.root / "index" / planted / sorted(os.listdir(store.root / "index" / planted))[0]
        os.mkfifo(folder / ("f" * 64 if planted == "live" else f"{0:017d}-{'f' * 64}"))
    before = store.overview(NAMESPACE, leases=50, recent=50)
    assert _keys(before.artifacts) == _keys(_scanned(store).artifacts)
    assert ghost not in _keys(before.failures) and Key(NAMESPACE, "day-00") not in _keys(before.held)
    store.reap(NAMESPACE)
    needed = set().union(*(_needed(s) for s in store.list()))
    assert _index_files(store) == needed
    assert not set(stale) & _index_files(store)


def test_latest_reads_every_tie_of_its_last_microsecond(
    store: FileStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Names hold whole microseconds and sort ties by key digest, not by key: the read takes every
    file of the last microsecond it keeps before the exact times and keys decide, as a scan would."""
    at = time.time()
    monkeypatch.setattr(time, "time", lambda: at)
    for name in ("tie-a", "tie-b", "tie-c", "tie-d", "tie-e"):
        lease = _granted(store.acquire(Key(NAMESPACE, name), AcquireRequest("etl", 60)))
        store.complete(lease.key, lease.token, _payload(name.encode()))
    monkeypatch.undo()
    scanned = pages.latest_of(store.list(NAMESPACE), "artifact", 5)
    assert _keys(scanned) == [Key(NAMESPACE, f"tie-{c}") for c in "abcde"]
    for limit in range(1, 6):
        assert _keys(store.latest(NAMESPACE, "artifact", limit=limit)) == _keys(scanned[:limit])


def test_a_link_planted_for_an_index_folder_is_refused_not_followed(store: FileStore, tmp_path: Path) -> None:
    key = Key(NAMESPACE, "linked")
    folder = store.root / Layout("").live_prefix(NAMESPACE)
    folder.parent.mkdir(parents=True, exist_ok=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    folder.symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(StoreUnavailable, match="symbolic link"):
        store.acquire(key, AcquireRequest("worker", 60))
    assert list(elsewhere.iterdir()) == [] and store.read(key).status == "free"
    with pytest.raises(StoreUnavailable, match="symbolic link"):
        store.leases(NAMESPACE, expired=False, limit=10)


def _die_at(root: str, where: str) -> None:
    """Take a key and complete it, SIGKILLed at ``where``: ``rename`` (its index files made, the
    record not renamed in) or ``remove`` (the record renamed in, the files it no longer needs not
    yet removed)."""
    from dibs.stores import file_index

    store = FileStore(root)
    key = Key(NAMESPACE, f"killed-at-{where}")
    lease = _granted(store.acquire(key, AcquireRequest("doomed", 60)))

    def die(*args: Any) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    if where == "rename":
        real = os.replace

        def dying_replace(src: Any, dst: Any) -> None:
            if Path(dst).suffix == ".json":
                die()
            real(src, dst)

        os.replace = dying_replace  # type: ignore[assignment]  # this process only: killed at the rename
    else:
        file_index.FileIndex.remove = die  # type: ignore[method-assign,assignment]
    store.complete(key, lease.token, _payload(b"never seen" if where == "rename" else b"landed"))


@pytest.mark.parametrize("where", ["rename", "remove"])
def test_a_writer_killed_between_its_index_and_its_record_leaves_what_reads_pass_by(
    tmp_path: Path, where: str
) -> None:
    root = str(tmp_path / "store")
    store = FileStore(root)
    child = SPAWN.Process(target=_die_at, args=(root, where))
    child.start()
    child.join(GENEROUS)
    assert child.exitcode == -signal.SIGKILL
    key = Key(NAMESPACE, f"killed-at-{where}")
    state = store.read(key)
    assert state.status == ("held" if where == "rename" else "done")
    left = _index_files(store) - _needed(state)
    assert len(left) == 1  # the artifact's file made for nothing, or the lease's not yet removed
    assert _needed(state) <= _index_files(store)
    seen = store.overview(NAMESPACE, leases=10, recent=10)
    assert _keys(seen.artifacts) == ([] if where == "rename" else [key])
    assert _keys(seen.held) == ([key] if where == "rename" else [])
    if where == "rename":
        assert store.force_release(key)
    store.reap(NAMESPACE)
    assert _index_files(store) == _needed(store.read(key))


def test_a_sweep_beside_writers_never_removes_a_file_a_record_needs(tmp_path: Path) -> None:
    """Writers, ``reap``'s sweep and a checker run side by side; the checker, holding a key's lock,
    sees every file its record needs each time it looks."""
    import threading

    root = tmp_path / "store"
    FileStore(root)
    keys = [Key(NAMESPACE, f"k{i}") for i in range(3)]
    stop = time.monotonic() + 4
    missing: list[tuple[Key, set[str]]] = []
    checks = [0]

    def churn(seed: int) -> None:
        _churn(str(root), seed, [key.name for key in keys], 10**9, seed, until=stop)

    def sweeper() -> None:
        store = FileStore(root)
        while time.monotonic() < stop:
            store._sweep(NAMESPACE)

    def checker() -> None:
        store = FileStore(root)
        rng = random.Random(0)
        while time.monotonic() < stop:
            key = rng.choice(keys)
            with store._locked(key):
                state = store._reader([])(key.digest)
                if state is not None and not _needed(state) <= _index_files(store):
                    missing.append((key, _needed(state) - _index_files(store)))
                checks[0] += 1

    threads = [threading.Thread(target=churn, args=(i,)) for i in range(3)]
    threads += [threading.Thread(target=sweeper), threading.Thread(target=checker)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert checks[0] > 100 and not missing, missing[:3]


# --------------------------------------------------------------------------------------------------
# Processes racing, some killed


def _churn(
    root: str, worker: int, keys: list[str], rounds: int, seed: int, *, until: float | None = None
) -> None:
    """Take, complete, fail, release, forget and abandon a few keys at random, ``rounds`` times (or
    until the monotonic clock reads ``until``)."""
    rng = random.Random(seed)
    store = FileStore(root)
    for _ in range(rounds):
        if until is not None and time.monotonic() > until:
            return
        key = Key(NAMESPACE, rng.choice(keys))
        try:
            outcome = store.acquire(key, AcquireRequest(f"worker-{worker}", rng.choice([0.05, 30.0])))
        except StoreUnavailable:
            continue
        if isinstance(outcome, Present) and rng.random() < 0.5:
            store.forget(key)
            continue
        if not isinstance(outcome, Granted):
            continue
        token, roll = outcome.lease.token, rng.random()
        try:
            if roll < 0.4:
                store.complete(key, token, _payload(f"{worker}".encode()))
            elif roll < 0.6:
                store.release(key, token, f"RuntimeError: worker {worker}")
            elif roll < 0.8:
                store.release(key, token)
        except LeaseLost:
            pass


def test_racing_processes_some_killed_keep_every_record_in_the_index(tmp_path: Path) -> None:
    root = str(tmp_path / "store")
    FileStore(root)
    keys = [f"partition-{i}" for i in range(4)]
    rng = random.Random(7)
    killed = 0
    for wave in range(3):
        workers = [SPAWN.Process(target=_churn, args=(root, w, keys, 400, 100 * wave + w)) for w in range(4)]
        for worker in workers:
            worker.start()
        for victim in workers[:2]:  # killed wherever they are: between an index file and a rename, too
            time.sleep(rng.uniform(0.5, 1.5))
            if victim.pid is not None and victim.is_alive():
                os.kill(victim.pid, signal.SIGKILL)
                killed += 1
        for worker in workers:
            worker.join(GENEROUS)
            if worker.is_alive():
                worker.kill()
        assert [w.exitcode for w in workers[2:]] == [0, 0]
    assert killed > 0

    store = FileStore(root)
    states = [store.read(Key(NAMESPACE, name)) for name in keys]
    files = _index_files(store)
    for state in states:  # nothing a record needs is missing
        assert _needed(state) <= files, state
    time.sleep(0.1)  # the short leases run out
    store.reap(NAMESPACE)
    states = [store.read(Key(NAMESPACE, name)) for name in keys]
    assert _index_files(store) == set().union(*(_needed(s) for s in states))
    assert store.overview(NAMESPACE, leases=10, recent=10).counts == _scanned(store).counts

"""What is specific to the file store: URLs, the directory layout, damaged files, and real processes.

The behaviour every store shares is held by the contract suite; here are the things only a directory
can get wrong: paths, files edited by hand, and OS processes that race or die holding a lock.
"""

from __future__ import annotations

import json
import multiprocessing
import re
import shutil
import signal
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import pytest

from dibs.errors import ArtifactCorrupted, ConfigurationError, CorruptRecord, LeaseLost, StoreUnavailable
from dibs.keys import Key
from dibs.records import Granted, Held, Present, checksum
from dibs.stores import AcquireRequest, NewArtifact, filesystem, open_store
from dibs.stores.filesystem import MARKER, FileStore

KEY = Key("team.features", "daily-report")
SPAWN = multiprocessing.get_context("spawn")
# Generous bounds on how long a child process may take to start; they never decide a result.
START_TIMEOUT = 120.0


@pytest.fixture
def store(tmp_path: Path) -> Iterator[FileStore]:
    with FileStore(tmp_path / "store") as opened:
        yield opened


def _complete(store: FileStore, key: Key, payload: bytes) -> int:
    outcome = store.acquire(key, AcquireRequest("producer", 3600))
    assert isinstance(outcome, Granted)
    store.complete(key, outcome.lease.token, NewArtifact("json", payload, checksum(payload)))
    return outcome.lease.token.fence


# -- URLs and opening -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "complaint"),
    [
        ("file://", "names no directory"),
        ("file://localhost", "names no directory"),
        ("file://relative/dir", "host must be empty or 'localhost'"),
        ("file://server.example.com/shared/dibs", "host must be empty or 'localhost'"),
        ("file:relative/dir", "relative path"),
        ("file:///tmp/dibs?colour=blue", "unknown option 'colour'"),
        ("file:///tmp/dibs?lock_timeout=soon", "not a number of seconds"),
        ("file:///tmp/dibs?lock_timeout=-1", "lock_timeout must be a number of seconds 0 or more"),
        ("file:///tmp/dibs?watch_interval=0", "watch_interval must be a number of seconds greater than 0"),
        ("file:///tmp/dibs#part", "fragment"),
    ],
)
def test_bad_urls_name_the_url_and_a_right_one(url: str, complaint: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        FileStore.from_url(url)
    message = str(caught.value)
    assert complaint in message
    if "option" not in complaint and "seconds" not in complaint:
        assert repr(url) in message
        assert "file:///var/lib/dibs" in message


def test_a_password_in_a_bad_url_is_not_repeated(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as caught:
        FileStore.from_url("file://user:hunter2@server/dir")
    assert "hunter2" not in str(caught.value)


def test_url_round_trips_through_open_store(tmp_path: Path) -> None:
    directory = tmp_path / "with space"
    url = f"file://localhost{directory}?lock_timeout=5".replace(" ", "%20")
    store = open_store(url)
    assert isinstance(store, FileStore)
    assert store.root == directory
    assert open_store(store.url).url == store.url == f"file://{directory}?lock_timeout=5".replace(" ", "%20")


def test_missing_parent_directory_is_a_configuration_error(tmp_path: Path) -> None:
    missing = tmp_path / "not-mounted" / "dibs"
    with pytest.raises(ConfigurationError, match=r"parent directory .*not-mounted does not exist"):
        FileStore(missing)
    assert not missing.parent.exists()  # a mistyped mount point is never created


def test_a_file_in_place_of_the_directory_is_a_configuration_error(tmp_path: Path) -> None:
    (tmp_path / "store").write_text("not a directory")
    with pytest.raises(ConfigurationError, match="is not a directory"):
        FileStore(tmp_path / "store")


def test_a_foreign_marker_is_refused_and_kept(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    (root / MARKER).write_text('{"format": "something-else/9"}')
    with pytest.raises(ConfigurationError, match="not a dibs file store"):
        FileStore(root)
    assert json.loads((root / MARKER).read_text()) == {"format": "something-else/9"}


def test_an_unwritable_parent_is_a_configuration_error_naming_it(tmp_path: Path) -> None:
    parent = tmp_path / "read-only"
    parent.mkdir(mode=0o500)
    try:
        if _can_write_in(parent):
            pytest.skip("this process ignores directory permissions (root with CAP_DAC_OVERRIDE)")
        with pytest.raises(ConfigurationError, match=r"permission denied.*read-only"):
            FileStore(parent / "store")
    finally:
        parent.chmod(0o700)


def _can_write_in(directory: Path) -> bool:
    try:
        (directory / "probe").touch()
    except PermissionError:
        return False
    return True


def test_reopening_an_existing_store_sees_its_records(tmp_path: Path) -> None:
    _complete(FileStore(tmp_path / "store"), KEY, b"[1, 2]")
    state = FileStore(tmp_path / "store").read(KEY)
    assert state.artifact is not None
    assert state.artifact.verified_payload(KEY) == b"[1, 2]"


# -- Paths never come from key names ----------------------------------------------------------------


def test_key_names_never_become_paths(store: FileStore) -> None:
    key = Key("team", "../../../../etc/passwd")
    _complete(store, key, b"{}")
    inside = {path for path in store.root.rglob("*") if path.is_file()}
    assert store.record_path(key) in inside
    assert store.artifact_path(key, 1) in inside
    assert all(key.digest in path.name for path in inside if path.name not in (MARKER, "ready"))
    assert [state.key for state in store.list()] == [key]


# -- Damaged and foreign files ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [
        b"\x00garbage",
        b'{"format": "someone-else/1"}',
        b'["a", "list"]',
        json.dumps({"format": "dibs.record/1", "namespace": "team", "name": "other"}).encode(),
    ],
)
def test_a_corrupted_record_is_reported_and_left_untouched(store: FileStore, content: bytes) -> None:
    path = store.record_path(KEY)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    for operation in (
        lambda: store.read(KEY),
        lambda: store.acquire(KEY, AcquireRequest("someone", 60)),
        lambda: store.forget(KEY),
        lambda: store.force_release(KEY),
    ):
        with pytest.raises(CorruptRecord, match=re.escape(str(path))):
            operation()
    assert path.read_bytes() == content


def test_list_skips_a_corrupted_record_and_names_it(
    store: FileStore, caplog: pytest.LogCaptureFixture
) -> None:
    good = Key("team", "good")
    _complete(store, good, b"1")
    bad = store.record_path(KEY)
    bad.parent.mkdir(parents=True, exist_ok=True)
    bad.write_bytes(b"not json")
    misplaced = store.record_path(Key("team", "elsewhere"))
    misplaced.parent.mkdir(parents=True, exist_ok=True)
    misplaced.write_bytes(store.record_path(good).read_bytes())  # a real record under the wrong name

    assert [state.key for state in store.list()] == [good]
    assert str(bad) in caplog.text
    assert str(misplaced) in caplog.text
    assert bad.read_bytes() == b"not json"


def test_a_tampered_payload_fails_its_integrity_check_when_read(store: FileStore) -> None:
    fence = _complete(store, KEY, b'{"total": 42}')
    store.artifact_path(KEY, fence).write_bytes(b'{"total": 43}')
    state = store.read(KEY)
    assert state.artifact is not None
    with pytest.raises(ArtifactCorrupted):
        state.artifact.verified_payload(KEY)
    outcome = store.acquire(KEY, AcquireRequest("someone", 60))
    assert isinstance(outcome, Present)
    with pytest.raises(ArtifactCorrupted):
        outcome.artifact.verified_payload(KEY)


def test_a_missing_payload_is_reported_and_forget_repairs_the_key(store: FileStore) -> None:
    fence = _complete(store, KEY, b'{"total": 42}')
    store.artifact_path(KEY, fence).unlink()
    artifact = store.read(KEY).artifact
    assert artifact is not None
    with pytest.raises(ArtifactCorrupted):
        artifact.verified_payload(KEY)
    assert store.forget(KEY)
    outcome = store.acquire(KEY, AcquireRequest("again", 60))
    assert isinstance(outcome, Granted)
    assert outcome.lease.token.fence == fence + 1


# -- Files on disk ----------------------------------------------------------------------------------


def test_forget_deletes_the_payload_file_and_keeps_the_fence(store: FileStore) -> None:
    fence = _complete(store, KEY, b"x" * 100_000)
    payload_file = store.artifact_path(KEY, fence)
    assert payload_file.stat().st_size == 100_000
    assert store.forget(KEY)
    assert not payload_file.exists()
    assert store.read(KEY).fence == fence


def test_list_omits_payloads_and_read_returns_them(store: FileStore) -> None:
    _complete(store, KEY, b"payload")
    listed = next(iter(store.list()))
    assert listed.artifact is not None
    assert listed.artifact.payload == b""
    read = store.read(KEY).artifact
    assert read is not None
    assert read.verified_payload(KEY) == b"payload"


def test_a_fenced_writer_leaves_no_file_behind(store: FileStore) -> None:
    first = store.acquire(KEY, AcquireRequest("first", 3600))
    assert isinstance(first, Granted)
    store.force_release(KEY)
    second = store.acquire(KEY, AcquireRequest("second", 3600))
    assert isinstance(second, Granted)
    with pytest.raises(LeaseLost, match="no longer current"):
        store.complete(KEY, first.lease.token, NewArtifact("json", b"stale", checksum(b"stale")))
    assert not store.artifact_path(KEY, first.lease.token.fence).exists()
    assert not any(path.name.endswith(".tmp") for path in store.root.rglob("*"))


def test_the_feed_reports_a_record_that_changes(store: FileStore) -> None:
    feed = store.change_feed()
    watched = {KEY.digest: KEY}
    assert feed.changes(watched, 0) == {KEY.digest}  # a newly watched key is reported once
    assert not feed.changes(watched, 0.05)  # nothing happened since
    store.acquire(KEY, AcquireRequest("someone", 60))
    deadline = time.monotonic() + START_TIMEOUT
    while not feed.changes(watched, 0.1):
        assert time.monotonic() < deadline, "the feed never saw the new record"


def test_the_lock_excludes_other_opens_in_the_same_process(store: FileStore) -> None:
    # flock belongs to the open file, not the process: threads with their own store are excluded too.
    impatient = FileStore(store.root, lock_timeout=0)
    with store._locked(KEY), pytest.raises(StoreUnavailable, match="stayed locked"):
        impatient.acquire(KEY, AcquireRequest("impatient", 60))
    assert isinstance(impatient.acquire(KEY, AcquireRequest("impatient", 60)), Granted)


def test_a_store_directory_removed_in_use_is_unavailable(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "store")
    shutil.rmtree(tmp_path / "store")
    with pytest.raises(StoreUnavailable, match="removed or unmounted"):
        store.acquire(KEY, AcquireRequest("someone", 60))
    with pytest.raises(StoreUnavailable, match="records"):
        list(store.list())


@pytest.mark.parametrize("away", ["removed", "a bare mount point"])
def test_a_held_key_is_not_read_as_new_while_the_store_directory_is_away(tmp_path: Path, away: str) -> None:
    """A record missing because its whole directory is gone is an outage, not a new key: read as
    "nobody holds it", a waiter would stop waiting on a key that is held (seen while a share was
    put back, between its mount point's removal and its return)."""
    root = tmp_path / "store"
    store = FileStore(root)
    assert isinstance(store.acquire(KEY, AcquireRequest("holder", 60)), Granted)
    root.rename(tmp_path / "elsewhere")
    if away == "a bare mount point":
        root.mkdir()
    with pytest.raises(StoreUnavailable, match="removed or unmounted"):
        store.read(KEY)
    with pytest.raises(StoreUnavailable, match="removed or unmounted"):
        store.read_many([KEY])
    if root.exists():
        root.rmdir()
    (tmp_path / "elsewhere").rename(root)
    lease = store.read(KEY).lease
    assert lease is not None and lease.owner == "holder"
    assert store.read(Key(KEY.namespace, "never-reserved")).lease is None


def test_a_store_directory_away_only_while_a_record_is_looked_up_still_shows_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The folder gone during the lookup and back before anything else could look: the lookup is in
    the folder held open before it, so the held key is still read as held."""
    root = tmp_path / "store"
    store = FileStore(root)
    assert isinstance(store.acquire(KEY, AcquireRequest("holder", 60)), Granted)
    real_read = filesystem._read_record

    def read_while_away(*args: Any, **kwargs: Any) -> bytes | None:
        root.rename(tmp_path / "elsewhere")
        try:
            return real_read(*args, **kwargs)
        finally:
            (tmp_path / "elsewhere").rename(root)

    monkeypatch.setattr(filesystem, "_read_record", read_while_away)
    lease = store.read(KEY).lease
    assert lease is not None and lease.owner == "holder"


# -- Real processes ---------------------------------------------------------------------------------


def _race(url: str, owner: str, keys: list[Key], barrier: Barrier, results: Connection) -> None:
    store = open_store(url)
    barrier.wait()
    outcomes = [store.acquire(key, AcquireRequest(owner, 3600)) for key in keys]
    results.send([(str(key), type(outcome).__name__) for key, outcome in zip(keys, outcomes, strict=True)])
    results.close()


def test_processes_racing_for_keys_get_exactly_one_grant_each(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    keys = [Key("race", f"key-{n}") for n in range(20)]
    processes = 6
    barrier = SPAWN.Barrier(processes)
    receivers = []
    children = []
    for n in range(processes):
        receiver, sender = SPAWN.Pipe(duplex=False)
        # Every process walks the keys from a different place, so they collide on every key.
        order = keys[n * 3 :] + keys[: n * 3]
        child = SPAWN.Process(target=_race, args=(url, f"worker-{n}", order, barrier, sender))
        child.start()
        sender.close()
        receivers.append(receiver)
        children.append(child)
    answers = [answer for receiver in receivers for answer in receiver.recv()]
    for child in children:
        child.join(START_TIMEOUT)
        assert child.exitcode == 0

    for key in keys:
        kinds = sorted(kind for name, kind in answers if name == str(key))
        assert kinds == ["Granted"] + ["Held"] * (processes - 1), key
    store = FileStore(tmp_path / "store")
    assert all(state.fence == 1 and state.lease is not None for state in store.list("race"))


def _hold_lock_forever(url: str, key: Key, ready: Connection) -> None:
    store = open_store(url)
    assert isinstance(store, FileStore)
    with store._locked(key):
        ready.send("locked")
        signal.pause()


def test_a_killed_process_holding_the_lock_does_not_block_others(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    store = FileStore(tmp_path / "store")
    receiver, sender = SPAWN.Pipe(duplex=False)
    child = SPAWN.Process(target=_hold_lock_forever, args=(url, KEY, sender))
    child.start()
    sender.close()
    try:
        assert receiver.poll(START_TIMEOUT), "the child never took the lock"
        assert receiver.recv() == "locked"
        impatient = FileStore(tmp_path / "store", lock_timeout=0)
        with pytest.raises(StoreUnavailable, match="stayed locked"):
            impatient.acquire(KEY, AcquireRequest("impatient", 60))
        assert store.read(KEY).lease is None  # readers never wait for the lock
    finally:
        child.kill()
        child.join(START_TIMEOUT)
    assert child.exitcode == -signal.SIGKILL
    outcome = store.acquire(KEY, AcquireRequest("survivor", 60))
    assert isinstance(outcome, Granted)
    assert isinstance(FileStore(tmp_path / "store").acquire(KEY, AcquireRequest("other", 60)), Held)

"""Regression tests for the payload stores' breaks of the contract (issue 31), one or more per defect.

Each pins the smallest reproduction of what a hostile user or a failing disk found, on the real
stores (a folder, fsspec's local file system, Azurite), and the behaviour the contract asks for:

1. a collector paused between its last check and its removal, while another key publishes the same
   bytes: nothing published is lost;
2. ``dibs wait`` and every streaming read verify before the first byte reaches the caller;
3. a FIFO, a directory or a symlink out of the folder at a payload path is a miss, never a block;
4. a failed payload write is a failed compute: the lease is released at once, the caller keeps its value;
5. a payload URL's password reaches no error and no CLI output;
6. every payload store error (and a record store URL with a control character) is a dibs error;
7. a damaged payload is a miss wherever it is found, a bad payload URL is refused when the client
   is built, a reference to a reference is a damaged record.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import dibs
from dibs.payloads import ReferencingStore
from tests.cli_harness import PATIENCE, eventually
from tests.cli_harness import dibs as dibs_cli

BIG = 300_000  # above the 64 KiB inline limit


def _client(records: str, payloads: str, **options: Any) -> dibs.Reservations:
    return dibs.Reservations(records, payloads=payloads, serializer="bytes", payload_grace=0.0, **options)


def _regular_files(folder: Path) -> list[Path]:
    """The payload copies in a folder store or an fsspec local one (whatever their layout)."""
    return sorted(
        p for p in folder.rglob("*") if p.is_file() and not p.is_symlink() and "partial" not in p.parts
    )


@pytest.fixture
def records(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'records.db'}"


# -- 1. a paused collector loses nothing -------------------------------------------------------------


@contextlib.contextmanager
def _azure_payloads(tmp_path: Path) -> Iterator[str]:
    from tests.backends import azure

    with azure.isolated_url(tmp_path) as url:
        yield url


@contextlib.contextmanager
def _folder_payloads(tmp_path: Path) -> Iterator[str]:
    yield (tmp_path / "payloads").as_uri()


@contextlib.contextmanager
def _fsspec_payloads(tmp_path: Path) -> Iterator[str]:
    yield f"local://{tmp_path / 'payloads'}"


PAYLOAD_STORES = {"folder": _folder_payloads, "fsspec": _fsspec_payloads, "azure": _azure_payloads}


class _PausedRemovals:
    """Holds the collector's thread at its destructive step (``os.unlink``/``os.remove`` of a payload,
    an Azure blob delete) until the test lets it go: the collector paused between its last check and
    its removal, as a SIGSTOP or a slow disk would pause it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
        self.thread: threading.Thread | None = None
        self.reached = threading.Event()
        self.go = threading.Event()
        self.folder = str(folder)
        for name in ("unlink", "remove"):
            monkeypatch.setattr(os, name, self._pausing(getattr(os, name)))
        with contextlib.suppress(ImportError):
            from azure.storage.blob import BlobClient

            monkeypatch.setattr(BlobClient, "delete_blob", self._pausing(BlobClient.delete_blob, always=True))

    def _pausing(self, real: Callable[..., Any], *, always: bool = False) -> Callable[..., Any]:
        def paused(*args: Any, **kwargs: Any) -> Any:
            mine = threading.current_thread() is self.thread
            # A payload by its path, or by its name in its folder (a descriptor), never a partial file.
            payload = str(args[0]).startswith(self.folder) or kwargs.get("dir_fd") is not None
            if mine and (always or payload) and "partial" not in str(args[0]):
                self.reached.set()
                assert self.go.wait(PATIENCE), "the test never let the collector go"
            return real(*args, **kwargs)

        return paused

    def start(self, collect: Callable[[], object]) -> None:
        self.thread = threading.Thread(target=collect)
        self.thread.start()
        assert self.reached.wait(PATIENCE), "the collector never came to remove the payload"

    def finish(self) -> None:
        self.go.set()
        assert self.thread is not None
        self.thread.join(PATIENCE)
        assert not self.thread.is_alive()


@pytest.mark.parametrize("kind", PAYLOAD_STORES)
def test_1_a_collector_paused_before_its_removal_never_loses_a_payload_published_meanwhile(
    kind: str, records: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    value = os.urandom(BIG)
    with PAYLOAD_STORES[kind](tmp_path) as payloads, _client(records, payloads) as client:
        store = client.store
        assert isinstance(store, ReferencingStore)
        client.run("first", lambda: value)
        client.compute("first", lambda: os.urandom(BIG), refresh=True)  # value is referenced by nothing now
        written = max(found.modified for found in store.payloads.list())
        eventually(lambda: time.time() > written + 0.01, "the clock to pass the payload's time")

        paused = _PausedRemovals(monkeypatch, tmp_path / "payloads")
        paused.start(store.collect)  # listed, checked, and now about to remove it...
        report = client.compute("second", lambda: value)  # ... while another key publishes the same bytes
        assert (report.role, report.stored) == ("computed", True)
        paused.finish()

        again = client.compute("second", lambda: b"never")
        assert (again.role, again.value) == ("hit", value)  # not a miss: the published payload is there


# -- 2. nothing unverified leaves dibs --------------------------------------------------------------


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["bit flipped", "another key's payload"])
def test_2_dibs_wait_prints_nothing_of_a_payload_damaged_at_its_size(tmp_path: Path, damage: str) -> None:
    store = f"sqlite:///{tmp_path / 'dibs.db'}"
    payloads = tmp_path / "payloads"
    env = {"DIBS_PAYLOADS_URL": payloads.as_uri(), "DIBS_STORE_URL": store}
    dibs_cli("run", "--key", "a", "--", "sh", "-c", "head -c 300000 /dev/zero | tr '\\0' a", env=env)
    (only,) = _regular_files(payloads)
    dibs_cli("run", "--key", "b", "--", "sh", "-c", "head -c 300000 /dev/zero | tr '\\0' b", env=env)
    (other,) = [path for path in _regular_files(payloads) if path != only]
    if damage == "bit flipped":
        _flip(only)
    else:
        only.write_bytes(other.read_bytes())  # exactly another key's value: the size matches
    waited = dibs_cli("wait", "--timeout", "1", "a", env=env, check=False)
    assert waited.stdout == "", f"printed {len(waited.stdout):,} unverified bytes"
    assert waited.returncode != 0 and "SHA-256" in waited.stderr, waited.stderr


def test_2_open_artifact_hands_out_no_byte_of_a_damaged_payload(records: str, tmp_path: Path) -> None:
    with _client(records, (tmp_path / "payloads").as_uri()) as client:
        client.run("k", lambda: os.urandom(BIG))
        (path,) = _regular_files(tmp_path / "payloads")
        _flip(path)
        with (
            pytest.raises(dibs.payloads.PayloadUnavailable, match="SHA-256"),
            client.open_artifact("k") as stream,
        ):
            stream.read(10)  # the first bytes would already be unverified


# -- 3. only regular files are payloads ------------------------------------------------------------


def _outside_fifo(tmp_path: Path) -> Path:
    fifo = tmp_path / "outside.fifo"
    os.mkfifo(fifo)
    return fifo


SWAPS: dict[str, Callable[[Path, Path], None]] = {
    "fifo": lambda path, tmp: (path.unlink(), os.mkfifo(path)),  # type: ignore[func-returns-value]
    "directory": lambda path, tmp: (path.unlink(), path.mkdir()),  # type: ignore[func-returns-value]
    "symlink out of the folder": lambda path, tmp: (path.unlink(), path.symlink_to(_outside_fifo(tmp))),  # type: ignore[func-returns-value]
}


def _bounded(call: Callable[[], object], unblock: Callable[[], None]) -> object:
    """``call()`` in a thread, which must end within PATIENCE; a call blocked in a FIFO's ``open``
    is let go by ``unblock`` (a writer opening it) before the test fails."""
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(call()), daemon=True)
    thread.start()
    thread.join(PATIENCE)
    if thread.is_alive():
        unblock()
        thread.join(PATIENCE)
        pytest.fail("the call blocked on what is at the payload's path")
    assert result, "the call raised (see the thread's traceback above)"
    return result[0]


def _unblocker(tmp_path: Path) -> Callable[[], None]:
    def unblock() -> None:
        for fifo in [*tmp_path.rglob("*.fifo"), *(p for p in tmp_path.rglob("*") if p.is_fifo())]:
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    return unblock


@pytest.mark.parametrize("swap", SWAPS)
@pytest.mark.parametrize("kind", ["folder", "fsspec"])
def test_3_anything_but_a_regular_file_at_a_payload_path_is_a_miss_never_a_block(
    records: str, tmp_path: Path, kind: str, swap: str
) -> None:
    value = os.urandom(BIG)
    with PAYLOAD_STORES[kind](tmp_path) as payloads, _client(records, payloads) as client:
        client.run("k", lambda: value)
        (path,) = _regular_files(tmp_path / "payloads")
        SWAPS[swap](path, tmp_path)
        unblock = _unblocker(tmp_path)
        hit = _bounded(lambda: client.get_or_reserve("k"), unblock)
        assert isinstance(hit, dibs.Acquired)  # a miss: this caller computes
        hit.lease.release()
        # The same bytes again: the writer must not trip over what is at their path either.
        report = _bounded(lambda: client.compute("k", lambda: value), unblock)
        assert (report.role, report.value, report.stored) == ("computed", value, True)  # type: ignore[attr-defined]
        assert _bounded(lambda: client.run("k", lambda: b"never"), unblock) == value


def test_3_dibs_run_does_not_block_on_a_fifo_at_the_payload_path(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'dibs.db'}"
    payloads = tmp_path / "payloads"
    env = {"DIBS_PAYLOADS_URL": payloads.as_uri(), "DIBS_STORE_URL": store}
    make = "head -c 300000 /dev/zero | tr '\\0' x"
    dibs_cli("run", "--key", "k", "--", "sh", "-c", make, env=env)
    (path,) = _regular_files(payloads)
    path.unlink()
    os.mkfifo(path)
    try:
        again = dibs_cli("run", "--key", "k", "--", "sh", "-c", make, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("dibs run blocked on the FIFO at the payload's path")
    assert again.stdout == "x" * 300_000


# -- 4. a failed payload write is a failed compute -------------------------------------------------


@pytest.mark.parametrize("policy", ["fail", "run"])
def test_4_a_failed_payload_write_releases_the_lease_at_once_and_keeps_the_value(
    records: str, tmp_path: Path, policy: str
) -> None:
    folder = tmp_path / "payloads"
    folder.mkdir()
    (folder / "partial").write_bytes(b"a file where the writers' folder must be")  # every write fails
    value = os.urandom(BIG)
    with _client(records, folder.as_uri(), ttl=600, on_store_unavailable=policy) as client:
        report = client.compute("k", lambda: value)
        assert (report.role, report.value, report.stored) == ("computed", value, False)
        state = client.status("k")
        assert state.live_lease is None  # released at once, not held for the ttl
        assert state.failure is not None and "payload" in state.failure.error, state.failure
        with _client(records, folder.as_uri()) as other:
            assert isinstance(other.get_or_reserve("k", owner="next"), dibs.Acquired)  # no wait


# -- 5. a payload URL's password is never shown ----------------------------------------------------

SECRET = "Sup3rSecretPw"
SECRET_URL = f"file://user:{SECRET}@somehost/folder"


def test_5_a_payload_url_password_reaches_no_api_error(records: str) -> None:
    with pytest.raises(dibs.ReservationError) as raised:
        dibs.Reservations(records, payloads=SECRET_URL)
    assert SECRET not in str(raised.value) and SECRET not in repr(raised.value.fields)


@pytest.mark.parametrize(
    "command",
    [
        ["ls"],
        ["show", "k"],
        ["forget", "k"],
        ["prune", "--older-than", "0s"],
        ["reap"],
        ["release", "k"],
        ["wait", "--timeout", "0", "k"],
        ["run", "--key", "k", "--", "true"],
        ["top", "--once"],
    ],
)
@pytest.mark.parametrize("json_lines", [False, True])
def test_5_a_payload_url_password_reaches_no_cli_output(
    tmp_path: Path, command: list[str], json_lines: bool
) -> None:
    env = {"DIBS_STORE_URL": f"sqlite:///{tmp_path / 'dibs.db'}"}
    argv = (["--json"] if json_lines else []) + [command[0], "--payloads", SECRET_URL, *command[1:]]
    done = dibs_cli(*argv, env=env, check=False)
    assert SECRET not in done.stdout + done.stderr, done.stdout + done.stderr
    assert "Traceback" not in done.stderr


# -- 6. every payload store error is a dibs error ----------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_6_an_unreachable_fsspec_payload_store_is_a_dibs_error(records: str, tmp_path: Path) -> None:
    payloads = f"ftp://127.0.0.1:{_closed_port()}/dibs"
    value = os.urandom(BIG)
    with _client(records, payloads, ttl=600) as client:  # building it sends nothing
        report = client.compute("k", lambda: value)
        assert (report.value, report.stored) == (value, False)
        state = client.status("k")
        assert state.live_lease is None and state.failure is not None
    env = {"DIBS_STORE_URL": records, "DIBS_PAYLOADS_URL": payloads}
    done = dibs_cli("run", "--key", "cli", "--", "sh", "-c", "head -c 300000 /dev/zero", env=env, check=False)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 69 and "payload" in done.stderr, (done.returncode, done.stderr)


@contextlib.contextmanager
def _read_only(folder: Path) -> Iterator[None]:
    """``folder`` (and the folders in it) read-only for real: mode 555 for an ordinary user; as root,
    whom no mode stops, the immutable attribute (``chattr +i``: nothing in it may be removed)."""
    folders = [folder, *(path for path in folder.rglob("*") if path.is_dir())]
    if os.geteuid() != 0:
        for path in folders:
            path.chmod(0o555)
        try:
            yield
        finally:
            for path in folders:
                path.chmod(0o755)
        return
    made = subprocess.run(["chattr", "+i", *map(str, folders)], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        subprocess.run(["chattr", "-i", *map(str, folders)], capture_output=True, check=False)
        pytest.skip(f"cannot make a folder read-only for root here (chattr +i: {made.stderr.strip()})")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", *map(str, folders)], check=True)


def test_6_collecting_in_a_payload_folder_that_cannot_be_written_is_a_dibs_error(
    records: str, tmp_path: Path
) -> None:
    folder = tmp_path / "payloads"
    with _client(records, folder.as_uri()) as client:
        client.run("k", lambda: os.urandom(BIG))
        client.compute("k", lambda: os.urandom(BIG), refresh=True)  # the first payload: referenced by nothing
        written = max(found.modified for found in client.store.payloads.list())  # type: ignore[attr-defined]
        eventually(lambda: time.time() > written + 0.01, "the clock to pass the payloads' times")
        with _read_only(folder / "sha256"), pytest.raises(dibs.StoreUnavailable, match="payload") as raised:
            client.reap()
        assert "reaped 0 record(s)" in str(raised.value)  # what was done, and what failed
        assert client.run("k", lambda: b"never") != b"never"  # the records are as they were


def test_6_a_directory_at_an_fsspec_payload_path_is_a_miss(records: str, tmp_path: Path) -> None:
    first, second = os.urandom(BIG), os.urandom(BIG)
    with _client(records, f"local://{tmp_path / 'payloads'}") as client:
        client.run("k", lambda: first)
        (path,) = _regular_files(tmp_path / "payloads")
        path.unlink()
        path.mkdir()
        assert client.run("k", lambda: second) == second
        assert client.compute("k", lambda: b"never").role == "hit"


@pytest.mark.parametrize("character", ["\x00", "\x01", "\x1b", "\x7f"])
def test_6_a_store_url_with_a_control_character_is_a_configuration_error(
    tmp_path: Path, character: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(dibs.ConfigurationError, match="control character"):
        dibs.Reservations(f"sqlite:///{character}x.db")
    with pytest.raises(dibs.ConfigurationError, match="control character"):
        dibs.Reservations(f"sqlite:///{tmp_path / 'ok.db'}", payloads=f"file://{tmp_path}/{character}p")
    assert not [path for path in tmp_path.rglob("*") if character in path.name]


def test_6_the_cli_refuses_a_store_url_with_a_control_character_and_creates_nothing(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dibs", "ls", "--store", "sqlite:///\x01x.db"],
        check=False,
        capture_output=True,
        text=True,
        timeout=PATIENCE,
        cwd=tmp_path,
    )
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "control character" in done.stderr
    assert list(tmp_path.iterdir()) == []


# -- 7. consistent answers -------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["truncated", "bit flipped"])
def test_7_wait_treats_a_damaged_payload_as_a_miss_whatever_the_damage(
    records: str, tmp_path: Path, damage: str
) -> None:
    with _client(records, (tmp_path / "payloads").as_uri()) as client:
        client.run("k", lambda: os.urandom(BIG))
        (path,) = _regular_files(tmp_path / "payloads")
        if damage == "truncated":
            path.write_bytes(path.read_bytes()[:-1])
        else:
            _flip(path)
        assert client.wait("k", timeout=5) is None  # the key looks free: the next ask computes
        with pytest.raises(dibs.WaitTimeout):
            client.wait("k", timeout=0.2, for_artifact=True)


def test_7_a_payload_url_naming_a_file_is_refused_when_the_client_is_built(
    records: str, tmp_path: Path
) -> None:
    not_a_folder = tmp_path / "payloads.txt"
    not_a_folder.write_text("a file")
    for url in (not_a_folder.as_uri(), f"local://{not_a_folder}"):
        with pytest.raises(dibs.ConfigurationError, match="not a folder"):
            dibs.Reservations(records, payloads=url)


def test_7_a_reference_to_a_reference_is_a_damaged_artifact_that_computes_again(
    records: str, tmp_path: Path
) -> None:
    from dibs.payloads import REFERENCE
    from dibs.payloads.references import decode, encode

    value, other = os.urandom(BIG), os.urandom(BIG)
    with _client(records, (tmp_path / "payloads").as_uri()) as client:
        store = client.store
        assert isinstance(store, ReferencingStore)
        client.run("k", lambda: value)
        raw = store.records.read(client.key("k")).artifact
        assert raw is not None and raw.serializer == REFERENCE
        payload, uri = decode(raw.payload, "test")
        # Another key's record names k's (intact) payload, claiming it holds a reference in its turn.
        forged = dibs.payloads.Payload(payload.sha256, payload.size, REFERENCE)
        key = client.key("forged")
        got = store.records.acquire(key, dibs.stores.AcquireRequest("forger", 60))
        assert isinstance(got, dibs.records.Granted)
        store.records.complete(
            key, got.lease.token, dibs.stores.NewArtifact(REFERENCE, encode(forged, uri), forged.checksum)
        )
        report = client.compute("forged", lambda: other)
        assert (report.role, report.value) == ("computed", other)

"""A Prefect filesystem block as the payload store of ``@reserved`` (prefect_dibs.payloads).

Against the session's Prefect API: the blocks are saved, and each flow run loads them by name (the
process's caches are cleared between runs, so the second run reads the block documents again). A
result over the 64 KiB inline limit is written under the block's base path; the dibs record holds
only the reference; the next run is a hit; a truncated payload makes the next run compute again.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("prefect")

import fsspec  # type: ignore[import-untyped]
from prefect.filesystems import SMB, LocalFileSystem, RemoteFileSystem
from pydantic import ValidationError

import dibs
from dibs.errors import ConfigurationError
from dibs.payloads import REFERENCE
from dibs.payloads.references import decode
from prefect import flow, task
from prefect_dibs import DibsStore, reserved
from prefect_dibs._clients import clear_cache
from tests.prefect.support import in_forked_child

BIG = 200_000  # bytes: over the 64 KiB inline limit


@pytest.fixture(autouse=True)
def _fresh_clients() -> Iterator[None]:
    clear_cache()
    yield
    clear_cache()


def _name(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:8]}"


def _handoff_flow(store: str, computed: list[bytes], **options: Any) -> Callable[[str], bytes]:
    """A flow whose reserved task returns ``BIG`` random bytes, counting its computations."""

    @reserved(store, key="artifact-{day}", serializer="bytes", **options)
    @task
    def produce(day: str) -> bytes:
        value = os.urandom(BIG)
        computed.append(value)
        return value

    @flow
    def handoff(day: str) -> bytes:
        return produce(day)

    return handoff


def _record(dibs_url: str, name: str) -> dibs.ArtifactRecord:
    """The key's artifact as the record store holds it (read without the payload store)."""
    with dibs.Reservations(dibs_url) as records:
        artifact = records.store.read(records.key(name)).artifact
    assert artifact is not None
    return artifact


def _run_twice_then_truncate(
    dibs_url: str,
    run: Callable[[str], bytes],
    computed: list[bytes],
    payload_file: Callable[[str], Any],
) -> None:
    """The scenario both block types share: ``payload_file(sha256)`` returns an fsspec-like (fs, path)."""
    first = run("d1")
    assert len(computed) == 1 and first == computed[0]
    record = _record(dibs_url, "artifact-d1")
    assert record.serializer == REFERENCE and len(record.payload) < 1024  # only the reference
    reference, _ = decode(record.payload, "artifact-d1")
    assert reference.size == BIG
    fs, path = payload_file(reference.sha256)
    assert fs.size(path) == BIG

    clear_cache()  # the next run loads the blocks by name again
    assert run("d1") == first and len(computed) == 1  # a hit, read through the block's file system

    with fs.open(path, "rb") as whole:
        head = whole.read(BIG // 2)
    with fs.open(path, "wb") as truncated:
        truncated.write(head)
    clear_cache()
    again = run("d1")
    assert len(computed) == 2 and again == computed[1]  # the damaged payload was a miss: computed again


def test_a_saved_local_file_system_block_keeps_the_payloads(dibs_url: str, tmp_path: Path) -> None:
    basepath = tmp_path / "prefect-results"
    storage = _name("results")
    LocalFileSystem(basepath=str(basepath)).save(storage)
    store = _name("dibs")
    DibsStore(url=dibs_url, payloads=LocalFileSystem.load(storage)).save(store)
    assert isinstance(DibsStore.load(store).payloads, LocalFileSystem)  # nested, by reference

    computed: list[bytes] = []
    local = fsspec.filesystem("file")

    def payload_file(sha256: str) -> tuple[Any, str]:
        found = list(basepath.rglob(f"{sha256}.*"))  # its one copy: <sha256>.<stamp>
        assert len(found) == 1, f"no payload {sha256} under the block's basepath {basepath}"
        return local, str(found[0])

    _run_twice_then_truncate(dibs_url, _handoff_flow(store, computed), computed, payload_file)


def test_reserved_takes_a_remote_file_system_block_by_its_slug(dibs_url: str) -> None:
    """``payloads="remote-file-system/<name>"``, as Prefect's ``result_storage=`` names a block: the
    payloads go through the block's own fsspec file system (an in-memory one here, so this test's
    flow runs stay in this process)."""
    root = f"memory://dibs-{uuid.uuid4().hex[:8]}/results"
    storage = _name("remote")
    RemoteFileSystem(basepath=root).save(storage)
    memory = fsspec.filesystem("memory")

    def payload_file(sha256: str) -> tuple[Any, str]:
        found = memory.find(f"{root.removeprefix('memory://')}/sha256/{sha256}")  # <sha256>/<stamp>
        assert len(found) == 1, f"no payload {sha256} under the block's basepath {root}"
        return memory, found[0]

    computed: list[bytes] = []
    run = _handoff_flow(dibs_url, computed, payloads=f"remote-file-system/{storage}")
    _run_twice_then_truncate(dibs_url, run, computed, payload_file)


def test_an_unsupported_block_is_refused_by_name(dibs_url: str) -> None:
    smb = SMB(share_path="/share/results", smb_host="files.internal")
    with pytest.raises(ValidationError, match="a SMB block cannot be dibs's payload store") as caught:
        DibsStore(url=dibs_url, payloads=smb)  # type: ignore[arg-type]  # what the check is for
    assert "LocalFileSystem or RemoteFileSystem" in str(caught.value)
    with pytest.raises(ConfigurationError, match="a SMB block cannot be dibs's payload store"):
        reserved(dibs_url, payloads=smb)
    storage = _name("smb")
    smb.save(storage)
    with pytest.raises(ConfigurationError, match="a SMB block cannot be dibs's payload store"):
        _handoff_flow(dibs_url, [], payloads=f"smb/{storage}")("d1")
    with pytest.raises(ValidationError, match="not both"):
        DibsStore(url=dibs_url, payloads_url="file:///tmp/x", payloads=LocalFileSystem(basepath="/tmp/y"))


def test_lock_managers_on_blocks_with_the_same_payload_block_are_interchangeable(
    dibs_url: str, tmp_path: Path
) -> None:
    """Prefect refuses to combine two *different* lock managers: the payload block is part of what
    makes them the same, compared without opening its file system."""

    def manager(basepath: Path) -> Any:
        return DibsStore(url=dibs_url, payloads=LocalFileSystem(basepath=str(basepath))).lock_manager()

    assert manager(tmp_path / "a") == manager(tmp_path / "a")
    assert manager(tmp_path / "a") != manager(tmp_path / "b")
    assert manager(tmp_path / "a") != DibsStore(url=dibs_url).lock_manager()


def test_remote_blocks_differing_only_by_a_secret_setting_are_two_payload_stores() -> None:
    """Prefect masks secret values when they are printed: two blocks whose credentials differ must
    still open two file systems, each with its own credentials, never share the first one's."""
    from pydantic import SecretStr

    from prefect_dibs.payloads import payload_store

    def block(secret: str) -> RemoteFileSystem:
        return RemoteFileSystem(
            basepath="memory://dibs-secret-settings", settings={"token": SecretStr(secret)}
        )

    assert payload_store(block("one")) is payload_store(block("one"))
    assert payload_store(block("one")) is not payload_store(block("two"))


def test_a_forked_child_opens_its_own_payload_store(tmp_path: Path) -> None:
    """The parent's payload store (its file system, connections, lock) is not the child's."""
    from prefect_dibs.payloads import payload_store

    block = LocalFileSystem(basepath=str(tmp_path))
    inherited = payload_store(block)
    assert payload_store(block) is inherited  # one per block in a process
    assert in_forked_child(lambda: payload_store(block) is not inherited)
    assert payload_store(block) is inherited  # the parent's is still its own


def test_the_payload_store_cache_keeps_no_secret_in_plain_text() -> None:
    """The cache lives as long as the process: its key holds a digest of the settings, not them."""
    from pydantic import SecretStr

    from prefect_dibs import payloads

    secret = "hunter2-" + uuid.uuid4().hex
    block = RemoteFileSystem(basepath="memory://dibs-cache-key", settings={"token": SecretStr(secret)})
    payloads.payload_store(block)
    assert secret not in repr(payloads.identity(block))
    assert not any(secret in repr(key) for key in payloads._STORES)

"""The payload store contract (:mod:`dibs.testing.payloads`, the suite dibs ships) on dibs's payload
stores: a folder, fsspec's local file system through a ``local://`` URL, fsspec's in-memory one (an
object store's semantics: no rename, no hard link) and Azure Blob on Azurite.

Each gives the suite its ``tamper`` fixture (a payload's bytes replaced behind the store's back, as a
failing disk or an edit would), and the stores on a file system its ``plant`` fixture (a FIFO, a
directory or a symlink out of the folder where a copy is).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dibs.payloads import PayloadStore
from dibs.payloads.files import FilePayloadStore
from dibs.payloads.fsspec import FsspecPayloadStore
from dibs.testing.payloads import PayloadStoreContract, opened_payload_stores


def _planted(path: Path, kind: str, outside: Path) -> None:
    """Something that is no payload at ``path`` (a copy's name), instead of the copy."""
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:  # a symlink out of the folder, to a FIFO: following it would block
        target = outside / f"outside-{uuid.uuid4().hex}"
        os.mkfifo(target)
        path.symlink_to(target)


class _LocalFiles:
    """``tamper`` and ``plant`` for a store whose copies are local files (found by their names)."""

    @pytest.fixture
    def tamper(self) -> Callable[[PayloadStore, str, bytes], None]:
        def tamper(store: PayloadStore, sha256: str, data: bytes) -> None:
            for path in _local_copies(store, sha256):
                path.write_bytes(data)  # in place: every hard link of it sees it

        return tamper

    @pytest.fixture
    def plant(self, tmp_path: Path) -> Callable[[PayloadStore, str, str], None]:
        def plant(store: PayloadStore, sha256: str, kind: str) -> None:
            for path in _local_copies(store, sha256):
                _planted(path, kind, tmp_path)

        return plant


def _local_copies(store: PayloadStore, sha256: str) -> list[Path]:
    if isinstance(store, FilePayloadStore):
        return [store.root / "sha256" / sha256[:2] / copy.copy for copy in store.copies(sha256)]
    assert isinstance(store, FsspecPayloadStore)
    return [Path(store.root, "sha256", sha256, copy.copy) for copy in store.copies(sha256)]


class TestFolder(_LocalFiles, PayloadStoreContract):
    @pytest.fixture
    def open_payload_store(self, tmp_path: Path) -> Iterator[Callable[[], PayloadStore]]:
        with opened_payload_stores(lambda: FilePayloadStore(tmp_path / "payloads")) as opener:
            yield opener


class TestFsspecLocal(_LocalFiles, PayloadStoreContract):
    @pytest.fixture
    def open_payload_store(self, tmp_path: Path) -> Iterator[Callable[[], PayloadStore]]:
        url = f"local://{tmp_path / 'payloads'}"
        with opened_payload_stores(lambda: FsspecPayloadStore.from_url(url)) as opener:
            yield opener


class TestFsspecMemory(PayloadStoreContract):
    """fsspec's in-memory file system: an object store's semantics (every copy a real copy)."""

    @pytest.fixture
    def open_payload_store(self) -> Iterator[Callable[[], PayloadStore]]:
        url = f"memory://payload-contract-{uuid.uuid4().hex}"
        with opened_payload_stores(lambda: FsspecPayloadStore.from_url(url)) as opener:
            yield opener

    @pytest.fixture
    def tamper(self) -> Callable[[PayloadStore, str, bytes], None]:
        def tamper(store: PayloadStore, sha256: str, data: bytes) -> None:
            assert isinstance(store, FsspecPayloadStore)
            for copy in store.copies(sha256):
                store.fs.pipe(f"{store.root}/sha256/{sha256}/{copy.copy}", data)

        return tamper


class TestAzureBlob(PayloadStoreContract):
    grace = 2.0  # Last-Modified is in whole seconds

    @pytest.fixture
    def open_payload_store(self, tmp_path: Path) -> Iterator[Callable[[], PayloadStore]]:
        from tests.backends import azure

        from dibs.payloads.azure import AzurePayloadStore

        with (
            azure.isolated_url(tmp_path) as url,
            opened_payload_stores(lambda: AzurePayloadStore.from_url(url)) as opener,
        ):
            yield opener

    @pytest.fixture
    def tamper(self) -> Callable[[PayloadStore, str, bytes], None]:
        def tamper(store: PayloadStore, sha256: str, data: bytes) -> None:
            from dibs.payloads.azure import AzurePayloadStore

            assert isinstance(store, AzurePayloadStore)
            # The SDK's own upload, behind the store's back: the blob's bytes change, its name does not.
            store._container.upload_blob(store._name(sha256), data, overwrite=True)

        return tamper

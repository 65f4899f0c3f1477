"""Payloads in a folder: ``file:///shared/dibs`` (a local disk, or a shared POSIX file system).

Layout (created on first use)::

    <root>/sha256/ab/<64 hex digits>    one payload, named by its SHA-256
    <root>/partial/<random>.part        a payload being written (moved into place once whole)

A payload is written under ``partial/``, flushed to disk, then renamed into ``sha256/``: a reader sees
a whole payload or none. On Linux, the disk write of each :data:`WRITEBACK` bytes is started while
the next ones are written (``sync_file_range``, a hint that waits only when the device's queue is
full), so the ``fsync`` at the end finds most of the payload on its way to disk already, as a
copy's would not: it is still what makes the payload durable, before it is named.

Two writers of the same bytes rename the same content onto one name, so the second one's rename is
harmless; a writer that finds the payload already there refreshes the payload's modification time
instead (see :mod:`dibs.payloads.collect` for why), and its copy is removed once the hand-off is
published (:meth:`FilePayloadStore.settle`), in a helper thread: freeing a large file's blocks takes
tens of milliseconds (100 MB: about 40 ms on ext4 mounted with ``discard``), and done meanwhile it
holds up the record store's commit on the same disk. A copy that no publish follows in this process
(an offload alone, a failure before the complete) goes with the next writer, ``close``, or at the
latest when the store is collected or the interpreter exits; one left by a process that died first
is removed as a dead writer's (:meth:`FilePayloadStore.discard_partial`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import sys
import threading
import urllib.parse
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from dibs.errors import ConfigurationError
from dibs.payloads.base import (
    Freed,
    PayloadStore,
    PayloadUnavailable,
    PayloadWriter,
    StoredPayload,
    checked_digest,
    is_digest,
)
from dibs.payloads.hashing import run_beside

__all__ = ["WRITEBACK", "FilePayloadStore"]

#: Every this many bytes written, their write to disk is started (Linux; see the module docstring).
WRITEBACK = 8 * 1024 * 1024


@functools.cache
def _writeback() -> Callable[[int, int, int], object] | None:
    """``sync_file_range(fd, offset, length, SYNC_FILE_RANGE_WRITE)`` (Linux: the standard library has
    no binding), or ``None`` where it cannot be had. ctypes releases the GIL during the call."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)  # the process's own symbols: the C library's
        function = libc.sync_file_range
        function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
        function.restype = ctypes.c_int
    except (ImportError, OSError, AttributeError):
        return None
    write = 2  # SYNC_FILE_RANGE_WRITE: start writing the range's dirty pages out, without waiting for them
    return lambda fd, offset, length: function(fd, offset, length, write)


def _unlink_all(paths: list[Path]) -> None:
    for path in paths:
        with contextlib.suppress(OSError):  # gone already, or left for discard_partial
            path.unlink()


class _FileWriter(PayloadWriter):
    def __init__(self, store: FilePayloadStore) -> None:
        super().__init__()
        self._store = store
        partial = store.root / "partial"
        partial.mkdir(parents=True, exist_ok=True)
        self._temp = partial / f"{secrets.token_hex(12)}.part"
        self._file = open(self._temp, "xb")  # noqa: SIM115 (closed by commit or abort)
        self._written = self._started = 0  # bytes written; bytes whose write to disk was started

    def _write(self, view: memoryview) -> None:
        self._file.write(view)
        self._written += len(view)
        if self._written - self._started >= WRITEBACK and (start := _writeback()) is not None:
            self._file.flush()  # the bytes reach the file first (a no-op: large writes skip the buffer)
            # A hint only: its result is not looked at (the fsync at the end reports what failed).
            start(self._file.fileno(), self._started, self._written - self._started)
            self._started = self._written

    def _flush(self) -> None:
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
        finally:
            self._file.close()

    def _commit(self, sha256: str) -> None:
        target = self._store.path(sha256)
        existing = self._store.stat(sha256)
        if existing is not None and existing.size == self.size:
            try:
                os.utime(target)  # put again: a writer is about to publish it (see collect)
            except FileNotFoundError:
                pass  # removed meanwhile: this copy takes its place
            else:
                self._store._leave(self._temp)  # removed once the hand-off is published (settle)
                return
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self._temp, target)  # a damaged or vanished copy is replaced by this whole one

    def _abort(self) -> None:
        self._file.close()
        self._temp.unlink(missing_ok=True)


class FilePayloadStore(PayloadStore):
    """Payloads in a folder (see the module docstring)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self._lock = threading.Lock()
        self._leftovers: list[Path] = []  # writers' copies of payloads that were there already
        # A put that nobody publishes in this process (a worker's offload, a failure before the
        # complete) leaves its copy for the next writer or close; at the latest it goes when the
        # store is collected or the interpreter exits, not only with a later prune's grace period.
        weakref.finalize(self, _unlink_all, self._leftovers)

    def _leave(self, copy: Path) -> None:
        with self._lock:
            self._leftovers.append(copy)

    def settle(self) -> None:
        with self._lock:  # emptied in place: the finalizer holds this very list
            leftovers = self._leftovers[:]
            self._leftovers.clear()
        if leftovers and not run_beside(_unlink_all, leftovers):  # no helper thread (shutdown): now
            _unlink_all(leftovers)

    @classmethod
    def from_url(cls, url: str) -> FilePayloadStore:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme != "file" or parsed.netloc not in ("", "localhost") or not parsed.path:
            raise ConfigurationError(
                f"a folder payload store URL is file:///absolute/folder, got {url!r}", setting="payloads"
            )
        return cls(urllib.parse.unquote(parsed.path))

    @property
    def url(self) -> str:
        return self.root.resolve().as_uri()

    def path(self, sha256: str) -> Path:
        digest = checked_digest(sha256)
        return self.root / "sha256" / digest[:2] / digest

    def writer(self) -> PayloadWriter:
        self.settle()  # a copy left by a put that nobody published, if any
        return _FileWriter(self)

    def open(self, sha256: str) -> IO[bytes]:
        try:
            return open(self.path(sha256), "rb")
        except FileNotFoundError:
            raise PayloadUnavailable(f"payload {self.uri(sha256)} is missing") from None
        except OSError as exc:
            raise PayloadUnavailable(f"payload {self.uri(sha256)} cannot be read: {exc}") from exc

    def stat(self, sha256: str) -> StoredPayload | None:
        try:
            found = self.path(sha256).stat()
        except FileNotFoundError:
            return None
        return StoredPayload(sha256, found.st_size, found.st_mtime)

    def delete(self, sha256: str, *, unchanged_since: float) -> int:
        found = self.stat(sha256)
        if found is None or found.modified >= unchanged_since:
            return 0
        try:
            self.path(sha256).unlink()
        except FileNotFoundError:
            return 0
        return found.size

    def list(self) -> Iterator[StoredPayload]:
        top = self.root / "sha256"
        if not top.is_dir():
            return
        for folder in sorted(top.iterdir()):
            if not folder.is_dir():
                continue
            for entry in os.scandir(folder):
                if is_digest(entry.name):
                    with contextlib.suppress(FileNotFoundError):
                        found = entry.stat(follow_symlinks=False)
                        yield StoredPayload(entry.name, found.st_size, found.st_mtime)

    def discard_partial(self, *, unchanged_since: float) -> Freed:
        freed = Freed()
        partial = self.root / "partial"
        if not partial.is_dir():
            return freed
        for entry in os.scandir(partial):
            with contextlib.suppress(FileNotFoundError):
                found = entry.stat(follow_symlinks=False)
                if entry.name.endswith(".part") and found.st_mtime < unchanged_since:
                    os.unlink(entry.path)
                    freed = freed + Freed(1, found.st_size)
        return freed

    def close(self) -> None:
        self.settle()

    def local_path(self, sha256: str) -> Path | None:
        return self.path(sha256)

    def uri(self, sha256: str) -> str:
        return self.path(sha256).resolve().as_uri()

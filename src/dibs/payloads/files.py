"""Payloads in a folder: ``file:///shared/dibs`` (a local disk, or a shared POSIX file system).

Layout (created on first use)::

    <root>/sha256/ab/<64 hex digits>.<stamp>    a copy of one payload: its SHA-256, and when it was made
    <root>/sha256/ab/<64 hex digits>            a copy made before copies had stamps (read, and collected)
    <root>/blake3/ab/<64 hex digits>.<stamp>    a copy of a payload named by its BLAKE3 (?digest=blake3)
    <root>/partial/<random>.part                a payload being written (moved into place once whole)

``file:///shared/dibs?digest=blake3`` names new payloads by BLAKE3 (the ``blake3`` extra), several
times SHA-256's speed, in their own folder; payloads named by SHA-256 are read as before, so the
setting may change at any time (or differ between processes) without a payload becoming unreadable.

A payload is written under ``partial/``, flushed to disk, then given its name in ``sha256/``: a reader
sees a whole payload or none. On Linux, the disk write of each :data:`WRITEBACK` bytes is started
while the next ones are written (``sync_file_range``, a hint that waits only when the device's queue
is full), so the ``fsync`` at the end finds most of the payload on its way to disk already, as a
copy's would not: it is still what makes the payload durable, before it is named.

**Every writer makes a copy of its own**, under a name nobody used before (the stamp: the time in
nanoseconds and 32 random bits). If the payload is there already with its size, the copy is a hard
link to it, so identical payloads are stored once, and the writer's own file is removed once the
hand-off is published (:meth:`FilePayloadStore.settle`, in a helper thread: freeing a large file's
blocks takes tens of milliseconds, and done meanwhile it holds up the record store's commit on the
same disk); else the writer's file is renamed to that name. A copy is never written to, renamed
onto or made again, so a collector that decided to remove a copy (:mod:`dibs.payloads.collect`),
however long it was paused since, can never take the one a writer made after: the payload a writer
publishes is there. The collection also removes the older copies of a payload once its latest one has
been there for the grace (they are hard links: names, not bytes).

Only regular files are copies. Every name is opened relative to the folders above it, none of them
through a symlink, with ``O_NOFOLLOW | O_NONBLOCK``: a FIFO, a directory, a device or a symlink (out
of the folder or not) at a payload's name is skipped as no copy, never opened in a way that blocks;
the next writer makes a copy beside it, and the collection removes it.

A writer's file that no publish follows in this process (an offload alone, a failure before the
complete) goes with the next writer, ``close``, or at the latest when the store is collected or the
interpreter exits; one left by a process that died first is removed as a dead writer's
(:meth:`FilePayloadStore.discard_partial`).
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import functools
import os
import re
import secrets
import shutil
import stat
import sys
import tempfile
import threading
import time
import urllib.parse
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from dibs.errors import ConfigurationError, ReservationError
from dibs.payloads.base import (
    Freed,
    PayloadStore,
    PayloadUnavailable,
    PayloadWriter,
    StoredPayload,
    address,
    is_digest,
    split_address,
    unavailable,
)
from dibs.payloads.hashing import DIGESTS, new_hash, run_beside
from dibs.stores import redact_url

__all__ = [
    "WRITEBACK",
    "FilePayloadStore",
    "enter_folder",
    "link",
    "modified",
    "new_stamp",
    "open_regular",
    "regular_copies",
    "stamp_time",
]

#: Every this many bytes written, their write to disk is started (Linux; see the module docstring).
WRITEBACK = 8 * 1024 * 1024

_STAMP = re.compile(r"[0-9a-f]{24}")
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_REGULAR = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: What ``open`` says of a name that is not a file or folder it may enter: ELOOP (a symlink, with
#: O_NOFOLLOW), ENXIO (a socket), EISDIR, ENOTDIR (O_DIRECTORY on a file), EOPNOTSUPP.
_NOT_A_FILE = frozenset({errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.ENOTDIR, errno.EOPNOTSUPP})


def new_stamp() -> str:
    """A copy's stamp: the time in nanoseconds, then 32 random bits (24 hex digits). Copies of one
    payload sort by it in about the order they were made; no two writers make the same one."""
    return f"{time.time_ns():016x}{secrets.token_hex(4)}"


def is_copy_name(sha256: str, name: str) -> bool:
    """Whether ``name`` names a copy of ``sha256`` in this layout (stamped, or from before stamps)."""
    return name == sha256 or (
        name.startswith(sha256) and name[64:65] == "." and _STAMP.fullmatch(name[65:]) is not None
    )


def open_regular(name: str | os.PathLike[str], dir_fd: int | None = None) -> IO[bytes] | None:
    """``name`` opened for reading if it is a regular file; ``None`` if it is missing or anything
    else (a FIFO, a directory, a device, a symlink). Never blocks: ``O_NONBLOCK`` keeps a FIFO's open
    from waiting for a writer, and it is dropped again once the file is known to be regular."""
    try:
        fd = os.open(name, _REGULAR, dir_fd=dir_fd)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    except OSError as exc:
        if exc.errno in _NOT_A_FILE:
            return None
        raise
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            os.close(fd)
            return None
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


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


def link(existing: str, name: str, folder: int) -> None:
    """Another name for the copy ``existing`` in ``folder`` (a descriptor), never through a symlink."""
    os.link(existing, name, src_dir_fd=folder, dst_dir_fd=folder, follow_symlinks=False)


def _unlink_all(paths: list[Path]) -> None:
    for path in paths:
        with contextlib.suppress(OSError):  # gone already, or left for discard_partial
            path.unlink()


def stamp_time(name: str) -> float:
    """When the copy named ``name`` was made, by its stamp (0 for a name without one)."""
    stamp = name.rpartition(".")[2] if "." in name else name
    return int(stamp[:16], 16) / 1e9 if _STAMP.fullmatch(stamp) else 0.0


def modified(name: str, found: os.stat_result) -> float:
    """When a copy was last written *or made*: a hard link keeps the bytes' modification time, so a
    copy made by one is as young as its stamp (the maker's clock, which the collection's grace
    covers as it covers the others)."""
    return max(found.st_mtime, stamp_time(name))


def regular_copies(folder: int, payload_of: Callable[[str], str | None]) -> list[StoredPayload]:
    """The copies in the open ``folder``, in :attr:`StoredPayload.copy` order: the regular files (a
    symlink is not followed, a name gone meanwhile is passed over) whose name ``payload_of`` maps to
    the payload's address (``None``: the name is no copy). The folder store and the fsspec store's
    local folders list their copies alike and differ only in how a copy is named."""
    found = []
    with os.scandir(folder) as entries:
        for entry in entries:
            payload = payload_of(entry.name)
            if payload is None:
                continue
            with contextlib.suppress(FileNotFoundError):
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISREG(info.st_mode):
                    when = modified(entry.name, info)
                    found.append(StoredPayload(payload, info.st_size, when, entry.name))
    return sorted(found, key=lambda copy: copy.copy)


def _modified(found: os.stat_result) -> float:
    """When something that is no copy (a writer's partial file, debris) was last changed."""
    return max(found.st_mtime, found.st_ctime)


class _Folder:
    """An open folder of the layout (``sha256/ab``), reached without following any symlink."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> _Folder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def enter_folder(parent: int, name: str, *, create: bool) -> int | None:
    """The folder ``name`` in ``parent`` (a descriptor), never through a symlink. ``create``: made if
    missing, and anything else in its place (a file, a symlink, a FIFO) removed first; else ``None``
    when it is not a folder."""
    for _ in range(8):
        try:
            return os.open(name, _DIRECTORY, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                return None
        except OSError as exc:
            if exc.errno not in _NOT_A_FILE:
                raise
            if not create:
                return None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=parent)  # no folder of ours: never a payload either
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, dir_fd=parent)
    raise OSError(f"{name!r} keeps being replaced while it is made")


class _FileWriter(PayloadWriter):
    def __init__(self, store: FilePayloadStore) -> None:
        super().__init__(store.url, store.digest)
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
        digest, hexdigest = split_address(sha256)
        name = f"{hexdigest}.{new_stamp()}"  # this writer's own: no collector ever decided about it
        with self._store._folder(sha256, create=True) as folder:
            for found in reversed(self._store._copies_in(folder, digest, hexdigest)):
                if found.size != self.size:
                    continue  # another size: not this payload (damaged), and never linked to
                try:
                    link(found.copy, name, folder.fd)
                except FileNotFoundError:
                    continue  # removed meanwhile: the next one, or this writer's file
                except OSError:
                    break  # no hard links here (EPERM, EMLINK): this writer's file becomes the copy
                self._store._leave(self._temp)  # stored once: removed once the hand-off is published
                return
            os.rename(self._temp, name, dst_dir_fd=folder.fd)

    def _abort(self) -> None:
        self._file.close()
        self._temp.unlink(missing_ok=True)


class FilePayloadStore(PayloadStore):
    """Payloads in a folder (see the module docstring)."""

    def __init__(self, root: str | os.PathLike[str], *, digest: str = "sha256") -> None:
        if digest not in DIGESTS:
            raise ConfigurationError(
                f"a folder payload store names payloads by {' or '.join(DIGESTS)}, got digest={digest!r}",
                setting="payloads",
            )
        new_hash(digest)  # a missing extra is said now, not at the first large complete
        self.root = Path(root)
        self.digest = digest
        self._lock = threading.Lock()
        self._leftovers: list[Path] = []  # writers' files that a hard link made redundant
        # A put that nobody publishes in this process (a worker's offload, a failure before the
        # complete) leaves its file for the next writer or close; at the latest it goes when the
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
                f"a folder payload store URL is file:///absolute/folder, got {redact_url(url)!r}",
                setting="payloads",
            )
        root = Path(urllib.parse.unquote(parsed.path))
        options = urllib.parse.parse_qs(parsed.query, keep_blank_values=True)
        unknown = sorted(set(options) - {"digest"})
        if unknown or len(options.get("digest", [])) > 1:
            raise ConfigurationError(
                f"payloads={redact_url(url)!r}: a folder payload store URL takes one option, "
                f"?digest={'|'.join(DIGESTS)}, got {parsed.query!r}",
                setting="payloads",
            )
        digest = options.get("digest", ["sha256"])[0]
        if digest not in DIGESTS:
            raise ConfigurationError(
                f"payloads={redact_url(url)!r}: digest={digest!r} is not a digest function dibs names "
                f"payloads by; use {' or '.join(DIGESTS)}",
                setting="payloads",
            )
        if root.exists() and not root.is_dir():
            raise ConfigurationError(
                f"payloads={redact_url(url)!r} is not a folder (a file is there): give the folder the "
                "payloads go to, e.g. file:///shared/dibs-payloads",
                setting="payloads",
            )
        return cls(root, digest=digest)

    @property
    def url(self) -> str:
        found = self.root.resolve().as_uri()
        return found if self.digest == "sha256" else f"{found}?digest={self.digest}"

    # -- where copies are ----------------------------------------------------------------------------
    def _folder(self, sha256: str, *, create: bool = False) -> _Folder:
        """``sha256/ab`` (``blake3/ab``) of the payload, open; :class:`FileNotFoundError` when it is
        not there."""
        digest, hexdigest = split_address(sha256)
        if create:
            self.root.mkdir(parents=True, exist_ok=True)
        root = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the root may be a symlink
        try:
            top = enter_folder(root, digest, create=create)
            if top is None:
                raise FileNotFoundError(self.root / digest)
            try:
                folder = enter_folder(top, hexdigest[:2], create=create)
            finally:
                os.close(top)
        finally:
            os.close(root)
        if folder is None:
            raise FileNotFoundError(self.root / digest / hexdigest[:2])
        return _Folder(folder)

    def _copies_in(
        self, folder: _Folder, digest: str, hexdigest: str | None = None
    ) -> builtins.list[StoredPayload]:
        """The copies in ``folder`` of the ``digest`` layout (of ``hexdigest`` only, when given), in
        :attr:`StoredPayload.copy` order."""

        def payload_of(name: str) -> str | None:
            named = name[:64] if hexdigest is None else hexdigest
            return address(digest, named) if is_copy_name(named, name) and is_digest(named) else None

        return regular_copies(folder.fd, payload_of)

    def copies(self, sha256: str) -> builtins.list[StoredPayload]:
        try:
            with self._folder(sha256) as folder:
                return self._copies_in(folder, *split_address(sha256))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise unavailable(self.url, f"listing payload {sha256}", exc) from exc

    def path(self, sha256: str) -> Path:
        """The file :meth:`open` would read (the latest copy), or where the payload's first copy goes."""
        digest, hexdigest = split_address(sha256)
        found = self.copies(sha256)
        name = found[-1].copy if found else hexdigest
        return self.root / digest / hexdigest[:2] / name

    # -- writing and reading -----------------------------------------------------------------------
    def writer(self) -> PayloadWriter:
        self.settle()  # a file left by a put that nobody published, if any
        return _FileWriter(self)

    def open(self, sha256: str) -> IO[bytes]:
        try:
            with self._folder(sha256) as folder:
                for found in reversed(self._copies_in(folder, *split_address(sha256))):
                    stream = open_regular(found.copy, dir_fd=folder.fd)
                    if stream is not None:
                        return stream
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise PayloadUnavailable(f"payload {self.uri(sha256)} cannot be read: {exc}") from exc
        raise PayloadUnavailable(f"payload {self.uri(sha256)} is missing")

    def spool(self) -> IO[bytes]:
        # Beside the payloads (on their disk, not a RAM-backed /tmp), and nameless: nothing to clean up.
        try:
            return tempfile.TemporaryFile(prefix="dibs-verified-", dir=self.root / "partial")
        except OSError:
            return super().spool()

    # -- removing -----------------------------------------------------------------------------------
    def remove(self, found: StoredPayload) -> Freed:
        if not is_copy_name(split_address(found.sha256)[1], found.copy):
            raise ValueError(f"not a copy of {found.sha256}: {found.copy!r}")
        try:
            with self._folder(found.sha256) as folder:
                info = os.stat(found.copy, dir_fd=folder.fd, follow_symlinks=False)
                os.unlink(found.copy, dir_fd=folder.fd)
        except FileNotFoundError:
            return Freed()
        except OSError as exc:
            raise unavailable(self.url, f"removing payload {found.sha256}", exc) from exc
        if info.st_nlink > 1:  # a hard link: its bytes stay with the other names
            return Freed(copies=1)
        return Freed(1, info.st_size, 1)

    def condemn(self, sha256: str, stream: IO[bytes]) -> int:
        try:
            read = os.fstat(stream.fileno())
        except (AttributeError, OSError, ValueError):  # not one of this store's files: cannot tell
            return 0
        try:
            removed = 0
            with self._folder(sha256) as folder:
                for found in self._copies_in(folder, *split_address(sha256)):
                    with contextlib.suppress(FileNotFoundError):
                        info = os.stat(found.copy, dir_fd=folder.fd, follow_symlinks=False)
                        if (info.st_dev, info.st_ino) == (read.st_dev, read.st_ino):
                            os.unlink(found.copy, dir_fd=folder.fd)
                            removed += 1
        except (OSError, ValueError) as exc:
            raise unavailable(self.url, f"removing damaged payload {sha256}", exc) from exc
        return removed

    def list(self) -> Iterator[StoredPayload]:
        try:
            yield from self._list()
        except ReservationError:
            raise
        except OSError as exc:
            raise unavailable(self.url, "listing payloads", exc) from exc

    def _list(self) -> Iterator[StoredPayload]:
        for digest, folder, _ in self._walk():
            with folder:
                found = self._copies_in(folder, digest)
            yield from found

    def _walk(self) -> Iterator[tuple[str, _Folder, builtins.list[str]]]:
        """Each ``sha256/ab`` and ``blake3/ab`` folder (never through a symlink), open, with its digest
        function and the names in it: whatever this store names new payloads by, it lists (and
        collects) the others too."""
        for digest in DIGESTS:
            top = self.root / digest
            try:
                fd = os.open(top, _DIRECTORY)
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as exc:
                if exc.errno in _NOT_A_FILE:
                    continue
                raise
            try:
                for prefix in sorted(os.listdir(fd)):
                    sub = enter_folder(fd, prefix, create=False)
                    if sub is not None:
                        folder = _Folder(sub)
                        yield digest, folder, os.listdir(sub)
            finally:
                os.close(fd)

    def discard_partial(self, *, unchanged_since: float) -> Freed:
        try:
            return self._discard_partial(unchanged_since)
        except OSError as exc:
            raise unavailable(self.url, "removing what dead writers left", exc) from exc

    def _discard_partial(self, unchanged_since: float) -> Freed:
        freed = Freed()
        partial = self.root / "partial"
        if partial.is_dir():
            for entry in os.scandir(partial):
                with contextlib.suppress(FileNotFoundError):
                    found = entry.stat(follow_symlinks=False)
                    if entry.name.endswith(".part") and _modified(found) < unchanged_since:
                        os.unlink(entry.path)
                        freed = freed + Freed(1, found.st_size, 1)
        for _, folder, names in self._walk():  # what is no payload at a payload's name: never read, removed
            with folder:
                for name in names:
                    with contextlib.suppress(FileNotFoundError):
                        info = os.stat(name, dir_fd=folder.fd, follow_symlinks=False)
                        if stat.S_ISREG(info.st_mode) or _modified(info) >= unchanged_since:
                            continue
                        if stat.S_ISDIR(info.st_mode):
                            shutil.rmtree(name, dir_fd=folder.fd)  # never follows a symlink inside
                        else:
                            os.unlink(name, dir_fd=folder.fd)
        return freed

    def close(self) -> None:
        self.settle()

    def local_path(self, sha256: str) -> Path | None:
        return self.path(sha256)

    def uri(self, sha256: str) -> str:
        """The payload's name in the folder, its copies' names without their stamps: ``<uri>.*``."""
        digest, hexdigest = split_address(sha256)
        return (self.root.resolve() / digest / hexdigest[:2] / hexdigest).as_uri()

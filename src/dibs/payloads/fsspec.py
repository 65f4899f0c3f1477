"""Payloads on any fsspec file system: ``s3://bucket/prefix``, ``gs://...``, ``abfs://...``, ``local://...``
(the ``fsspec`` extra, plus the file system's own package: s3fs, gcsfs, adlfs, ...).

fsspec is what Airflow's ``ObjectStoragePath`` is built on; credentials come the way the file system
finds them (environment, instance roles, its config files) or as URL options it understands. Layout
under the URL's path::

    <root>/sha256/<64 hex digits>/<stamp>   a copy of one payload: its SHA-256, and when it was made
    <root>/partial/<random>.part            a payload being uploaded (moved into place once whole)

A stream is spooled to a local temporary file while its digest is computed, uploaded under
``partial/``, then moved to its name (a rename where the file system has one; on object stores a
server-side copy, after which the object appears whole).

**Every writer makes a copy of its own**, under a name nobody used before (the stamp: the time in
nanoseconds and 32 random bits), even when the payload is there already: a copy is never written to,
moved onto or made again, so a collector that decided to remove a copy (:mod:`dibs.payloads.collect`),
however long it was paused since, never takes the one a writer made after. On a local file system the
copy is a hard link to one already there (stored once); elsewhere it is uploaded, and the collection
removes the older copies once the latest one has been there for the grace. A file system that
reports no modification time protects its payloads from collection altogether (they always look
just written).

Only regular files are copies: what ``info`` says is no file, or a link, is skipped; on a local file
system every copy is opened with ``O_NOFOLLOW | O_NONBLOCK`` (:func:`dibs.payloads.files.open_regular`),
so a FIFO, a directory or a symlink at a payload's name is no copy and never blocks a reader, and
the writer makes its copy beside it.

The file system is made on first use, not when the store is (an FTP or SFTP file system connects as
it is made): building a client sends nothing, and what the file system raises, whatever its type, is
a dibs error naming the store.
"""

from __future__ import annotations

import builtins
import contextlib
import datetime as dt
import os
import re
import secrets
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, cast

import fsspec  # type: ignore[import-untyped]
from fsspec.implementations.local import LocalFileSystem  # type: ignore[import-untyped]

from dibs.errors import ConfigurationError, ReservationError, StoreUnavailable
from dibs.payloads.base import (
    Freed,
    PayloadStore,
    PayloadUnavailable,
    PayloadUnwritable,
    PayloadWriter,
    StoredPayload,
    checked_digest,
    is_digest,
    named_otherwise,
    unavailable,
    unwritable,
)
from dibs.payloads.files import (
    enter_folder,
    link,
    new_stamp,
    open_regular,
    regular_copies,
    stamp_time,
)
from dibs.payloads.readers import SdkReader
from dibs.stores import redact_url

__all__ = ["FsspecPayloadStore"]

_STAMP = re.compile(r"[0-9a-f]{24}")
_TIMES = ("mtime", "LastModified", "last_modified", "updated", "created", "ctime")


def _modified(info: dict[str, Any]) -> float:
    """The latest of the times ``info`` gives (a local copy's ``ctime`` says when it was linked)."""
    found = []
    for name in _TIMES:
        value = info.get(name)
        if isinstance(value, dt.datetime):
            found.append(value.timestamp())
        elif isinstance(value, int | float) and not isinstance(value, bool):
            found.append(float(value))
        elif isinstance(value, str):
            with contextlib.suppress(ValueError):
                found.append(dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp())
    return max(found) if found else time.time()  # no time known: looks just written, never collected


def _copy_modified(name: str, info: dict[str, Any]) -> float:
    """A copy's time: the file system's, or its stamp's if later (:func:`dibs.payloads.files.modified`)."""
    return max(_modified(info), stamp_time(name))


def _local_modified(found: os.stat_result) -> float:
    """When debris (no copy) was last changed."""
    return max(found.st_mtime, found.st_ctime)


class _Translated(SdkReader):
    """A remote file system's file whose errors, whatever their type (botocore's, aiohttp's), reach
    the reader as ``OSError``, which the verifying reader reports as an unreadable payload."""

    def __init__(self, stream: Any) -> None:
        super().__init__()
        self._stream = stream
        self.path = getattr(stream, "path", None)
        size = getattr(stream, "size", None)
        self.size = size if isinstance(size, int) else None

    def _read(self, size: int) -> bytes:
        try:
            data: bytes = self._stream.read(size)
        except OSError:
            raise
        except Exception as exc:  # a file system's own error types: see the class docstring
            raise OSError(f"{type(exc).__name__}: {exc}") from exc
        return data

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._stream.close()
        super().close()


class _SpoolingWriter(PayloadWriter):
    def __init__(self, store: FsspecPayloadStore) -> None:
        super().__init__(store.url)
        self._store = store
        self._spool = tempfile.NamedTemporaryFile(prefix="dibs-payload-", delete=False)  # noqa: SIM115

    def _write(self, view: memoryview) -> None:
        self._spool.write(view)

    def _commit(self, sha256: str) -> None:
        self._spool.close()
        try:
            self._store._place(sha256, self._spool.name, self.size)
        finally:
            os.unlink(self._spool.name)

    def _abort(self) -> None:
        self._spool.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._spool.name)


class FsspecPayloadStore(PayloadStore):
    """Payloads under ``root`` of an fsspec file system (see the module docstring). ``fs`` may be
    ``None`` with ``connect`` making it on first use."""

    def __init__(
        self, fs: Any, root: str, url: str, *, connect: Callable[[], tuple[Any, str]] | None = None
    ) -> None:
        if fs is None and connect is None:
            raise ValueError("give a file system, or how to make one")
        self._fs = fs
        self._connect = connect
        self._made = threading.Lock()
        self._root = root.rstrip("/")
        self._url = redact_url(url)

    @classmethod
    def from_url(cls, url: str) -> FsspecPayloadStore:
        """The store at ``url``, checked as far as can be without contacting anything: fsspec knows
        every protocol in it, their packages are installed, and a local folder is no file."""
        shown = redact_url(url)
        try:
            for part in url.split("::"):
                protocol = fsspec.core.split_protocol(part)[0]
                found = fsspec.get_filesystem_class(protocol or "file")
            root = fsspec.core.strip_protocol(url.split("::", maxsplit=1)[0])
        except (ImportError, ValueError) as exc:
            raise ConfigurationError(
                f"payloads={shown!r}: fsspec cannot open it ({type(exc).__name__}: "
                f"{redact_url(str(exc))}); install the file system's package (s3fs for s3://, gcsfs "
                "for gs://, adlfs for abfs://)",
                setting="payloads",
            ) from None
        local = found is LocalFileSystem and "::" not in url
        if local and Path(root).exists() and not Path(root).is_dir():
            raise ConfigurationError(
                f"payloads={shown!r} is not a folder (a file is there): give the folder the payloads "
                "go to, e.g. local:///shared/dibs-payloads",
                setting="payloads",
            )

        def connect() -> tuple[Any, str]:
            fs, made_root = fsspec.core.url_to_fs(url)
            return fs, str(made_root)

        return cls(None, root, url, connect=connect)

    @property
    def fs(self) -> Any:
        """The file system, made on first use (a failure to make it is a dibs error)."""
        if self._fs is None:
            with self._made:
                if self._fs is None:
                    assert self._connect is not None
                    try:
                        fs, root = self._connect()
                    except Exception as exc:  # whatever the file system raises: see the module docstring
                        raise unavailable(self._url, "opening the file system", exc) from exc
                    self._root = root.rstrip("/")
                    self._fs = fs
        return self._fs

    @property
    def root(self) -> str:
        self.fs  # noqa: B018 (made first: the root is the file system's reading of the URL)
        return self._root

    @property
    def _local(self) -> bool:
        """Whether the file system is fsspec's own local one, whose paths are the operating system's:
        then copies are reached without fsspec (no symlink followed, nothing opened that could block)
        and linked. A subclass may map paths its own way, and is used through its methods."""
        return type(self.fs) is LocalFileSystem

    @property
    def url(self) -> str:
        return self._url

    @contextlib.contextmanager
    def _failing(self, doing: str, *, writing: bool = False) -> Iterator[None]:
        """Whatever the file system raises while ``doing`` as a dibs error naming the store. Every
        type, not only ``OSError``: fsspec's file systems raise their SDKs' own."""
        try:
            yield
        except PayloadUnwritable:
            raise
        except StoreUnavailable as exc:  # the file system could not be made
            if writing:
                raise unwritable(self._url, exc, exc.message) from exc
            raise
        except ReservationError:
            raise
        except Exception as exc:  # see the docstring
            raise (unwritable(self._url, exc) if writing else unavailable(self._url, doing, exc)) from exc

    def _folder(self, sha256: str) -> str:
        return f"{self.root}/sha256/{checked_digest(sha256)}"

    @contextlib.contextmanager
    def _local_folder(self, sha256: str | None, *, create: bool = False) -> Iterator[int | None]:
        """A local store's ``sha256`` folder (or that payload's folder in it) as a descriptor, reached
        without following a symlink below the root; ``None`` when it is not there. ``create``: made,
        and anything else in its place removed (a file a hostile user put there, a copy from before
        copies had folders: never a payload)."""
        if create:
            os.makedirs(self.root, exist_ok=True)
        try:
            fd: int | None = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            fd = None
        names = ["sha256"] if sha256 is None else ["sha256", checked_digest(sha256)]
        try:
            for name in names:
                if fd is None:
                    break
                inner = enter_folder(fd, name, create=create)
                os.close(fd)
                fd = inner
            yield fd
        finally:
            if fd is not None:
                os.close(fd)

    def uri(self, sha256: str) -> str:
        """The payload's folder (its copies are in it), named without making the file system: an
        error about an unreachable store names it too."""
        return f"{self._url.split('://', 1)[0]}://{self._root.lstrip('/')}/sha256/{checked_digest(sha256)}"

    def local_path(self, sha256: str) -> Path | None:
        if not self._local:
            return None
        found = self.copies(sha256)
        return Path(self._folder(sha256), found[-1].copy) if found else None

    # -- copies ---------------------------------------------------------------------------------------
    def copies(self, sha256: str) -> builtins.list[StoredPayload]:
        if named_otherwise(sha256):
            return []  # this store names payloads by SHA-256 only
        folder = self._folder(sha256)
        with self._failing(f"listing payload {sha256}"):
            if self._local:
                with self._local_folder(sha256) as fd:
                    return [] if fd is None else self._local_copies(sha256, fd)
            self.fs.invalidate_cache(folder)
            try:
                entries = self.fs.ls(folder, detail=True)
            except (FileNotFoundError, NotADirectoryError):
                return []
        found = []
        for info in entries:
            name = str(info.get("name", "")).rstrip("/").rpartition("/")[2]
            if _STAMP.fullmatch(name) and info.get("type") == "file" and not info.get("islink"):
                found.append(StoredPayload(sha256, int(info["size"]), _copy_modified(name, info), name))
        return sorted(found, key=lambda copy: copy.copy)

    def _local_copies(self, sha256: str, folder: int) -> builtins.list[StoredPayload]:
        return regular_copies(folder, lambda name: sha256 if _STAMP.fullmatch(name) else None)

    def list(self) -> Iterator[StoredPayload]:
        top = f"{self.root}/sha256"
        with self._failing("listing payloads"):
            if self._local:
                yield from self._local_list()
                return
            self.fs.invalidate_cache(top)
            try:
                found = self.fs.find(top, detail=True)
            except FileNotFoundError:
                return
        for path, info in found.items():
            head, _, name = str(path).rstrip("/").rpartition("/")
            digest = head.rpartition("/")[2]
            copy = is_digest(digest) and _STAMP.fullmatch(name) is not None
            if copy and info.get("type") == "file" and not info.get("islink"):
                yield StoredPayload(digest, int(info["size"]), _modified(info), name)

    def _local_list(self) -> Iterator[StoredPayload]:
        """A local folder's copies, walked without following any symlink (one out of the folder would
        lead a listing anywhere)."""
        with self._local_folder(None) as top:
            if top is None:
                return
            digests = sorted(name for name in os.listdir(top) if is_digest(name))
        for digest in digests:
            with self._local_folder(digest) as fd:
                found = [] if fd is None else self._local_copies(digest, fd)
            yield from found

    # -- reading --------------------------------------------------------------------------------------
    def open(self, sha256: str) -> IO[bytes]:
        if named_otherwise(sha256):
            raise PayloadUnavailable(f"payload {sha256} is missing: {self._url} keeps SHA-256 payloads only")
        if self._local:
            return self._local_open(sha256)
        folder = self._folder(sha256)
        for found in reversed(self.copies(sha256)):
            path = f"{folder}/{found.copy}"
            with self._failing(f"reading payload {sha256}"):
                try:
                    return cast(IO[bytes], _Translated(self.fs.open(path, "rb")))
                except FileNotFoundError:
                    continue  # removed since it was listed: the one before, if any
        raise PayloadUnavailable(f"payload {self.uri(sha256)} is missing")

    def _local_open(self, sha256: str) -> IO[bytes]:
        try:
            with self._local_folder(sha256) as fd:
                if fd is not None:
                    for found in reversed(self._local_copies(sha256, fd)):
                        stream = open_regular(found.copy, dir_fd=fd)
                        if stream is not None:
                            return stream
        except OSError as exc:
            raise PayloadUnavailable(f"payload {self.uri(sha256)} cannot be read: {exc}") from exc
        raise PayloadUnavailable(f"payload {self.uri(sha256)} is missing")

    # -- writing --------------------------------------------------------------------------------------
    def writer(self) -> PayloadWriter:
        return _SpoolingWriter(self)

    def _place(self, sha256: str, local: str, size: int) -> None:
        with self._failing(f"storing payload {sha256}", writing=True):
            folder = self._folder(sha256)
            target = f"{folder}/{new_stamp()}"  # this writer's own: no collector ever decided about it
            if self._local and self._link(sha256, target.rpartition("/")[2], size):
                return
            partial = f"{self.root}/partial/{secrets.token_hex(12)}.part"
            self.fs.makedirs(f"{self.root}/partial", exist_ok=True)
            self.fs.put_file(local, partial)
            for attempt in range(3):
                self._make_folder(folder)
                try:
                    self.fs.mv(partial, target)
                    return
                except FileNotFoundError:  # its (empty) folder removed meanwhile by a collection
                    if attempt == 2:
                        raise

    def _make_folder(self, folder: str) -> None:
        """The payload's folder (on a local file system, anything else in its place removed first)."""
        if self._local:
            with self._local_folder(folder.rpartition("/")[2], create=True):
                return
        self.fs.makedirs(folder, exist_ok=True)

    def _link(self, sha256: str, name: str, size: int) -> bool:
        """A hard link to a local copy of the payload there already, as ``name`` (stored once)."""
        with self._local_folder(sha256, create=True) as fd:
            assert fd is not None
            for found in reversed(self._local_copies(sha256, fd)):
                if found.size != size:
                    continue  # another size: not this payload (damaged), and never linked to
                try:
                    link(found.copy, name, fd)
                except FileNotFoundError:
                    continue
                except OSError:
                    return False  # no hard links here: this writer's upload becomes the copy
                return True
        return False

    # -- removing -------------------------------------------------------------------------------------
    def remove(self, found: StoredPayload) -> Freed:
        if not _STAMP.fullmatch(found.copy):
            raise ValueError(f"not a copy of {found.sha256}: {found.copy!r}")
        path = f"{self._folder(found.sha256)}/{found.copy}"
        with self._failing(f"removing payload {found.sha256}"):
            if self._local:
                with self._local_folder(found.sha256) as fd:
                    try:
                        if fd is None:
                            return Freed()
                        info = os.stat(found.copy, dir_fd=fd, follow_symlinks=False)
                        os.unlink(found.copy, dir_fd=fd)
                    except FileNotFoundError:
                        return Freed()
                return Freed(copies=1) if info.st_nlink > 1 else Freed(1, info.st_size, 1)
            try:
                self.fs.rm_file(path)
            except FileNotFoundError:
                return Freed()
        return Freed(1, found.size, 1)

    def condemn(self, sha256: str, stream: IO[bytes]) -> int:
        folder = self._folder(sha256)
        removed = 0
        with self._failing(f"removing damaged payload {sha256}"):
            if self._local:
                try:
                    read = os.fstat(stream.fileno())
                except (AttributeError, OSError, ValueError):  # not one of this store's files
                    return 0
                with self._local_folder(sha256) as fd:
                    for found in [] if fd is None else self._local_copies(sha256, fd):
                        with contextlib.suppress(FileNotFoundError):
                            info = os.stat(found.copy, dir_fd=fd, follow_symlinks=False)
                            if (info.st_dev, info.st_ino) == (read.st_dev, read.st_ino):
                                os.unlink(found.copy, dir_fd=fd)
                                removed += 1
                return removed
            path = getattr(stream, "path", None)
            if isinstance(path, str) and path.rpartition("/")[0].endswith(folder.lstrip("/")):
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm_file(path)
                    removed += 1
        return removed

    def discard_partial(self, *, unchanged_since: float) -> Freed:
        freed = Freed()
        with self._failing("removing what dead writers left"):
            try:
                found = self.fs.find(f"{self.root}/partial", detail=True)
            except FileNotFoundError:
                found = {}
            for path, info in found.items():
                if str(path).endswith(".part") and _modified(info) < unchanged_since:
                    with contextlib.suppress(FileNotFoundError):
                        self.fs.rm_file(path)
                        freed = freed + Freed(1, int(info["size"]), 1)
            if self._local:
                self._discard_local_debris(unchanged_since)
        return freed

    def _discard_local_debris(self, unchanged_since: float) -> None:
        """What is no payload in a local layout, untouched since then: anything but a folder at a
        payload's folder (a copy from before copies had folders, a FIFO), anything but a regular file
        in one, and an empty payload folder (a writer that finds its folder gone makes it again)."""
        with self._local_folder(None) as top:
            if top is None:
                return
            for name in os.listdir(top):
                with contextlib.suppress(FileNotFoundError):
                    info = os.stat(name, dir_fd=top, follow_symlinks=False)
                    if _local_modified(info) >= unchanged_since and not stat.S_ISDIR(info.st_mode):
                        continue
                    if not stat.S_ISDIR(info.st_mode):
                        os.unlink(name, dir_fd=top)
                        continue
                    fd = enter_folder(top, name, create=False)
                    if fd is None:
                        continue
                    try:
                        inside = os.listdir(fd)
                        for item in inside:
                            _discard_debris(fd, item, unchanged_since)
                    finally:
                        os.close(fd)
                    if not inside and _local_modified(info) < unchanged_since:
                        with contextlib.suppress(OSError):  # not empty any more: a writer came
                            os.rmdir(name, dir_fd=top)


def _discard_debris(folder: int, name: str, unchanged_since: float) -> None:
    """Remove ``name`` in ``folder`` unless it is a regular file or was changed since then."""
    import shutil

    with contextlib.suppress(FileNotFoundError):
        found = os.stat(name, dir_fd=folder, follow_symlinks=False)
        if stat.S_ISREG(found.st_mode) or _local_modified(found) >= unchanged_since:
            return
        if stat.S_ISDIR(found.st_mode):
            shutil.rmtree(name, dir_fd=folder)  # never follows a symlink inside
        else:
            os.unlink(name, dir_fd=folder)

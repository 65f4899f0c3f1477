"""Opening only regular files, for the file store and its index: a FIFO, a device, a directory or a
symbolic link put where a file of the store belongs can neither hang a caller (``O_NONBLOCK``) nor be
followed (``O_NOFOLLOW``), and a huge (say, sparse) file is never read whole. Each function raises
:class:`NotRegular` saying what is there instead; the caller decides what that means.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "MARKER_BYTES",
    "SAFE_OPEN",
    "NotRegular",
    "create_empty",
    "fsync_dir",
    "kind_of",
    "open_dir",
    "read_regular",
]

#: ``O_NONBLOCK``: opening a FIFO planted where a file belongs returns at once instead of waiting for
#: a writer (it is then refused as not a regular file); ``O_NOFOLLOW``: a symbolic link is refused.
SAFE_OPEN = getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
#: The marker is a few dozen bytes; more is not ours.
MARKER_BYTES = 4096


class NotRegular(OSError):
    """Something other than a regular file (directory, FIFO, socket, device) where a file belongs."""


def kind_of(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def read_regular(path: Path | str, limit: int, *, dir_fd: int | None = None) -> bytes | None:
    """At most ``limit + 1`` bytes of the regular file at ``path`` (relative to the open directory
    ``dir_fd`` when given), ``None`` if it does not exist.

    Only ever opens a regular file, without blocking and without following a link, so that a FIFO, a
    device or a directory put where a file belongs can neither hang a reader nor be read; and never
    reads more than ``limit + 1`` bytes, so a huge (say, sparse) file cannot fill the memory. Raises
    :class:`NotRegular` saying what is there instead; the caller decides what that means.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | SAFE_OPEN, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotRegular(errno.ELOOP, "a symbolic link") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegular(errno.EINVAL, kind_of(info.st_mode))
        chunks, size = [], 0
        while size <= limit and (chunk := os.read(fd, min(limit + 1 - size, 1 << 20))):
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


@contextlib.contextmanager
def open_dir(path: Path) -> Iterator[int]:
    """The directory ``path`` held open (``FileNotFoundError`` if it is not there), for reads relative
    to it: what they find missing is missing from that directory, even if it is renamed away (a share
    unmounted, a store folder moved) while they look. A symbolic link to a directory is followed here,
    as a store's own folders may be links an operator made; the files read through it never are."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


def create_empty(path: Path) -> bool:
    """Create the empty file ``path`` (mode 0o666 less the umask); ``False`` if a regular file is
    already there. ``O_EXCL`` never follows a link and never opens what is there, so a FIFO or a link
    planted at ``path`` is reported, not written through."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | SAFE_OPEN, 0o666)
    except FileExistsError:
        mode = os.lstat(path).st_mode
        if stat.S_ISREG(mode):
            return False
        raise NotRegular(errno.EEXIST, "a symbolic link" if stat.S_ISLNK(mode) else kind_of(mode)) from None
    os.close(fd)
    return True


def fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable. Some file systems cannot fsync a directory; they are
    then as durable as they can be, and atomicity (the rename) does not depend on it."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
    finally:
        os.close(fd)

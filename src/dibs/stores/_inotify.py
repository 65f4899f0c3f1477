"""A Linux inotify watch on one file, through ``ctypes`` (the standard library has no binding).

SQLite has no notifications, but in WAL mode every commit writes the database's ``-wal`` file, and
all the processes that use a WAL database share one host (they share its memory). So a watch on that
file hears every commit of every process at once, where a probe of ``data_version`` every few
milliseconds only finds it at the next look, and costs the idle process those looks.

The watch only says "look now": the caller still asks SQLite what changed, and keeps a slow look of
its own for what the watch can miss (a queue overflow, a file system that does not report writes).
:func:`watch` returns ``None`` wherever inotify cannot be had (not Linux, no ``inotify_init1`` in the
C library, the per-user limit of instances or watches reached): the caller then looks as it did before.

Two watches per :class:`FileWatch`: the file, for writes (``IN_MODIFY``: a commit, a truncating
checkpoint), and its directory, for the file's creation under that name (SQLite deletes the ``-wal``
file when the last connection closes, and the next one creates it again). One inotify descriptor and
one ``eventfd`` (so that another thread can cut a wait short) per watch, both close-on-exec, and
closed in a forked child, which never uses its parent's watches (see :mod:`dibs.runtime`).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import select
import struct
import sys
import threading
import weakref
from typing import Any

__all__ = ["ENABLED", "FileWatch", "watch"]

log = logging.getLogger(__name__)

#: Whether :func:`watch` may use inotify at all (tests turn it off to exercise the fallback).
ENABLED = sys.platform.startswith("linux")

# <sys/inotify.h>
IN_MODIFY = 0x00000002
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name

_LIVE: weakref.WeakSet[FileWatch] = weakref.WeakSet()


@functools.cache
def _load() -> Any:
    """The C library's inotify functions, or ``None`` (looked up once)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)  # the process's own symbols: the C library's
        for name in ("inotify_init1", "inotify_add_watch"):
            getattr(libc, name).restype = ctypes.c_int
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    except (ImportError, OSError, AttributeError) as exc:
        log.debug("no inotify: %s", exc)
        return None
    return libc


def watch(path: str) -> FileWatch | None:
    """A watch on ``path`` (which need not exist yet), or ``None`` if inotify cannot be had here."""
    if not ENABLED or not hasattr(os, "eventfd"):
        return None
    libc = _load()
    if libc is None:
        return None
    try:
        return FileWatch(libc, path)
    except OSError as exc:  # EMFILE, ENOSPC (the watch limit), ENOENT (no directory) ...
        log.debug("no inotify watch on %s: %s", path, exc)
        return None


class FileWatch:
    """Wakes when ``path`` is written or created; see the module docstring."""

    def __init__(self, libc: Any, path: str) -> None:
        self._libc = libc
        self._path = os.path.abspath(path)
        self._folder, name = os.path.split(self._path)
        self._name = os.fsencode(name)
        self._lock = threading.Lock()  # close() against poke() and the reads
        self._closed = False
        self._file_wd: int | None = None
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            raise _error(path)
        self._fd = fd
        try:
            self._poke_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        except OSError:
            os.close(fd)
            raise
        # A watch dropped without close() closes its descriptors when collected (the list is shared,
        # not the watch: the finalizer must not keep it alive); close() empties the list first.
        self._owned = [fd, self._poke_fd]
        # Not at interpreter exit (finalize's default): the hub's daemon thread may still be using a
        # live watch then, and would read closed descriptors (the exit closes them anyway).
        weakref.finalize(self, _close_owned, self._owned).atexit = False
        try:
            # the folder first: a file created between the two is heard of by the folder's watch
            self._folder_wd = self._add(self._folder, IN_CREATE | IN_MOVED_TO | IN_ONLYDIR)
            self._watch_file()
        except OSError:
            self._close_fds()
            raise
        self._poller = select.poll()  # not select(): no limit on descriptor numbers
        self._poller.register(self._fd, select.POLLIN)
        self._poller.register(self._poke_fd, select.POLLIN)
        self._poke_poller = select.poll()  # for hold(): a poke only
        self._poke_poller.register(self._poke_fd, select.POLLIN)
        _LIVE.add(self)

    def _add(self, path: str, mask: int) -> int:
        wd: int = self._libc.inotify_add_watch(self._fd, os.fsencode(path), mask)
        if wd < 0:
            raise _error(path)
        return wd

    def _watch_file(self) -> None:
        """Watch the file if it is there (else its creation will be heard of)."""
        try:
            self._file_wd = self._add(self._path, IN_MODIFY)
        except FileNotFoundError:
            self._file_wd = None

    @property
    def closed(self) -> bool:
        """Closed, or broken (its folder's watch is gone): the caller looks on its own from now on."""
        return self._closed

    def hold(self, timeout: float) -> None:
        """Block up to ``timeout`` seconds or until a :meth:`poke`, leaving events queued: the
        :meth:`wait` that follows takes every write heard meanwhile at once (the caller's minimum
        gap between looks). A poke is left for that wait too, which then ends at once."""
        if self._closed:
            return
        with contextlib.suppress(InterruptedError):
            self._poke_poller.poll(max(0, int(timeout * 1000 + 0.999)))

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds; whether the file was written or created meanwhile (or may
        have been: a queue overflow), as opposed to a timeout or a :meth:`poke`. Every queued event is
        read: writes heard together wake the caller once."""
        if self._closed:
            return False
        try:
            ready = self._poller.poll(max(0, int(timeout * 1000 + 0.999)))
        except InterruptedError:  # pragma: no cover - retried by Python since 3.5
            ready = []
        if not ready:
            return False
        with self._lock:
            if self._closed:
                return False
            with contextlib.suppress(BlockingIOError):
                os.read(self._poke_fd, 8)
            return self._drain()

    def _drain(self) -> bool:
        """Read every queued event (under the lock); whether one concerns the file."""
        written = False
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return written
            offset = 0
            while offset + _EVENT.size <= len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                name = data[offset + _EVENT.size : offset + _EVENT.size + length].rstrip(b"\0")
                offset += _EVENT.size + length
                if mask & IN_Q_OVERFLOW:
                    written = True
                elif wd == self._folder_wd:
                    if mask & IN_IGNORED:  # the folder is gone: nothing more will be heard
                        self._closed = True
                        written = True
                    elif name == self._name:  # (re)created: watch the new file
                        try:
                            self._watch_file()
                        except OSError as exc:  # the watch limit reached meanwhile, say
                            log.debug("no inotify watch on %s any more: %s", self._path, exc)
                            self._closed = True  # broken: the caller looks on its own
                        written = True
                elif wd == self._file_wd:
                    if mask & IN_IGNORED:  # deleted: its creation will be heard of
                        self._file_wd = None
                    written = True

    def poke(self) -> None:
        """Cut the current (or the next) :meth:`wait` short, from any thread."""
        with self._lock:
            if not self._closed:
                with contextlib.suppress(BlockingIOError):  # already poked (the counter is full)
                    os.eventfd_write(self._poke_fd, 1)

    def close(self) -> None:
        """Safe to call twice, from any thread."""
        with self._lock:
            self._close_fds()

    def _close_fds(self) -> None:
        self._closed = True
        owned = getattr(self, "_owned", None)
        if owned is not None:
            owned.clear()  # closed here: nothing left for the finalizer
        fds = [fd for fd in (getattr(self, "_fd", -1), getattr(self, "_poke_fd", -1)) if fd >= 0]
        self._fd = self._poke_fd = -1  # forgotten before closed: a fork in between closes nothing reused
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def _close_owned(owned: list[int]) -> None:
    """A collected watch's descriptors, unless :meth:`FileWatch.close` closed them."""
    while owned:
        with contextlib.suppress(OSError):
            os.close(owned.pop())


def _error(path: str) -> OSError:
    import ctypes

    code = ctypes.get_errno()
    return OSError(code, f"{os.strerror(code)} ({errno.errorcode.get(code, code)})", path)


def _close_in_child() -> None:
    # The parent's watches are not the child's (the runtime starts empty there), and a read here
    # would take the parent's events: close the child's copies, without the locks other threads held.
    for live in list(_LIVE):
        live._lock = threading.Lock()
        live._close_fds()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)

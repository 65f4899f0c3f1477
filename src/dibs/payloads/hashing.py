"""Digests beside the I/O: a payload's digest computed in a helper thread while the caller reads or
writes the bytes, instead of one pass after the other.

Two digest functions: SHA-256 (the default, in the standard library) and BLAKE3 (a payload store
URL's ``?digest=blake3``, with the ``blake3`` extra), the second digest function of the Remote
Execution API, several times SHA-256's speed on one core: where hashing, not the disk, limits a
hand-off, it is what brings it near a plain copy's speed.

hashlib and file I/O both release the GIL for large buffers, so a helper thread hashing one chunk
while the caller writes it (or reads the next) makes the two passes cost about the longer of the
two, not their sum: on a machine where SHA-256 and a file copy run at about the same speed, that is
most of a hand-off's time. The helper threads are a small shared pool, started on first use (a
forked child starts its own: a pool's threads do not survive ``fork``); chunks smaller than
:data:`INLINE` are hashed in the caller's thread, where a hand-over would cost more than it saves,
and so is a reader's last chunk (nothing follows it to overlap with).
"""

from __future__ import annotations

import hashlib
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

from dibs.errors import ConfigurationError

__all__ = ["DIGESTS", "INLINE", "Hasher", "Ready", "digest_beside", "new_hash", "run_beside"]

#: The digest functions payloads may be named by; the first is the default.
DIGESTS = ("sha256", "blake3")

#: Chunks up to this size are hashed in the caller's thread.
INLINE = 64 * 1024


class _Pool:
    """The helper threads, started on first use; a forked child starts its own (a pool's threads do
    not survive ``fork``, and a pool that believes it has idle ones would never run a task)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        if hasattr(os, "register_at_fork"):  # POSIX
            os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._lock = threading.Lock()
        self._executor = None

    def submit(self, function: Any, *args: Any) -> Future[Any] | None:
        """``function(*args)`` in a helper thread; ``None`` when none can be had (interpreter
        shutdown), and the caller runs it itself."""
        with self._lock:
            if self._executor is None:
                workers = max(2, os.cpu_count() or 1)
                self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dibs-hash")
            try:
                return self._executor.submit(function, *args)
            except RuntimeError:  # "cannot schedule new futures after (interpreter) shutdown"
                return None


_pool = _Pool()


class _Hash(Protocol):
    def update(self, data: bytes | bytearray | memoryview, /) -> object: ...

    def hexdigest(self) -> str: ...


def new_hash(digest: str = "sha256") -> _Hash:
    """A fresh hash of the digest function ``digest`` (one of :data:`DIGESTS`). BLAKE3 needs the
    ``blake3`` package: without it, a :class:`~dibs.errors.ConfigurationError` names the extra."""
    if digest == "sha256":
        return hashlib.sha256()
    if digest == "blake3":
        try:
            import blake3  # the extra: a Rust extension, which releases the GIL for large buffers
        except ModuleNotFoundError:
            raise ConfigurationError(
                "payload digests by BLAKE3 (?digest=blake3) need the 'blake3' extra "
                "(pip install 'dibs[blake3]'): the blake3 package is not installed",
                setting="payloads",
            ) from None
        found: _Hash = blake3.blake3()
        return found
    raise ValueError(f"not a payload digest function: {digest!r}; use one of {', '.join(DIGESTS)}")


def run_beside(function: Any, *args: Any) -> bool:
    """``function(*args)`` in a helper thread, its result and errors ignored (I/O the caller need not
    wait for); ``False`` when no helper thread can be had, and the caller runs it itself."""
    return _pool.submit(function, *args) is not None


class Hasher:
    """A digest (SHA-256 unless told) fed chunk by chunk, in order, each chunk hashed in a helper
    thread while the caller goes on. At most one chunk is in hand: :meth:`update` waits for the
    previous one first, so a chunk must stay unchanged until the next :meth:`update`, :meth:`wait`
    or :meth:`hexdigest`."""

    def __init__(self, digest: str = "sha256") -> None:
        self._hash = new_hash(digest)
        self._pending: Future[None] | None = None

    def update(self, chunk: bytes | bytearray | memoryview, *, last: bool = False) -> None:
        """Hash ``chunk`` after those before it. ``last``: nothing follows it for its hashing to overlap
        with, so it is hashed in the caller's thread (no hand-over: a payload read in one chunk is
        hashed as a direct call would)."""
        self.wait()
        if len(chunk) > INLINE and not last:
            self._pending = _pool.submit(self._hash.update, chunk)
            if self._pending is not None:
                return
        self._hash.update(chunk)

    def wait(self) -> None:
        """Return once every chunk handed over so far is hashed (the caller may then reuse them)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def hexdigest(self) -> str:
        self.wait()
        return self._hash.hexdigest()


class Ready:
    """A digest known already, with the interface of one being computed."""

    def __init__(self, digest: str) -> None:
        self._digest = digest

    def result(self) -> str:
        return self._digest


def digest_beside(data: memoryview, digest: str = "sha256") -> Future[str] | Ready:
    """The ``digest`` (hex) of ``data``, computed in a helper thread from now on: its ``result()``
    waits for it. ``data`` must not change until then."""
    found = new_hash(digest)  # a missing extra is the caller's error, raised here and now
    if len(data) > INLINE:
        future = _pool.submit(_hexdigest, found, data)
        if future is not None:
            return future
    return Ready(_hexdigest(found, data))


def _hexdigest(found: _Hash, data: memoryview) -> str:
    found.update(data)
    return found.hexdigest()

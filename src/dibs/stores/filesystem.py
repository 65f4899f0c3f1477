"""A store in a directory: ``file:///abs/dir``, shared by the processes of one machine (or a shared POSIX fs).

Layout (created on first use; every name below the root is derived from :attr:`Key.digest`, never from
the key itself, so no key can traverse a directory)::

    <root>/dibs-store.json                       marks the directory as a dibs store (layout format)
    <root>/records/ab/<digest>.json              one record per key (:mod:`dibs.stores.codec`)
    <root>/artifacts/ab/<digest>-<fence>.bin     the payload of the artifact written under <fence>
    <root>/locks/ab/<digest>.lock                empty; flocked while the key's record is replaced
    <root>/index/...                             empty files whose names say which keys hold a lease
                                                 and which artifacts and failures are newest
                                                 (:mod:`dibs.stores.file_index`)

How a change is made atomic (see :meth:`FileStore._swap`):

* Readers take no lock. Every file is written to a temporary name, fsynced and renamed into place,
  so a reader sees a whole old record or a whole new one, and a crashed or paused writer can never
  block a reader or a waiter (the common operations: hits and "busy" answers write nothing).
* A writer prepares its files outside any lock, then takes an exclusive ``flock`` on the key's lock
  file, checks that the record still has the exact bytes it decided from (the compare of the
  compare-and-swap), renames the payload and then the record into place, and unlocks. ``flock``
  rather than POSIX ``fcntl`` locks because it belongs to the open file, so threads of one process
  exclude each other too, and the kernel drops it when the holder dies: a killed process never
  leaves a key locked.
* A payload file is renamed in before the record that references it, and its name carries the
  artifact's fence. Fences never repeat for a key, so a stale payload file can never be mistaken for
  a newer artifact, and a fenced writer can never replace the payload of a stored artifact.

Limits (the contract's Time section assumes a store with its own clock; a directory has none):

* Expiry is judged by ``time.time()`` of whichever process asks. On one machine every process shares
  that clock. Processes on several machines sharing one directory must keep their clocks
  synchronized (NTP) to well within the shortest ttl, or exclusion breaks.
* On NFS, ``flock`` is emulated with byte-range locks (NFSv4, or NFSv3 with lockd); without working
  locks, or with aggressive attribute caching, exclusion is not guaranteed. Renames are atomic on the
  server. Prefer a database store across machines; use this one on NFS only after testing your mount.
* Record files and lock files are never deleted: ``forget``, ``prune``, ``reap`` and ``discard``
  leave a tombstone record (a few hundred bytes) that keeps the fence, so it keeps rising and no
  payload name is ever reused; deleting a lock file while processes run would let two of them lock
  different inodes. Deleting the whole directory while no process uses it resets the store.
* While ``records/`` is missing (the directory removed, or a share unmounted to its bare mount point)
  every read is an outage (:class:`StoreUnavailable`), which waiters ride out, never a new key: a
  record is looked up in that folder held open, so even a folder renamed away during the lookup is
  the one looked in.
* Processes of several users can share a store only if every file and directory it creates is
  writable by all of them: give them a common group and a umask of 002 (or a setgid directory with
  default ACLs).
* A write waits (briefly sleeping) for another process's critical section, at most ``lock_timeout``
  seconds; this is the one wait inside this store, the equivalent of a database's row lock.
* A crash can leave hidden ``.*.tmp`` files or a payload file no record references; they are harmless
  (never read) and can be removed while the store is idle. It can also leave an index file no record
  needs: reads pass it by, ``reap`` removes it.
* Only regular files are ever opened, without blocking and without following a symbolic link, and at
  most 1 MiB of a record (a payload: its recorded size) is read: a FIFO, a directory or a huge sparse
  file put where a record, lock or payload belongs is reported (``CorruptRecord``; skipped by ``list``
  and ``reap``) instead of hanging a caller or filling its memory. Under ``index/`` a FIFO, a link or a
  file where a folder belongs fails the write that needs that name (``StoreUnavailable``, naming it).
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import json
import logging
import os
import re
import secrets
import stat
import sys
import time
import urllib.parse
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from pathlib import Path

from dibs.backoff import Backoff, Retrying
from dibs.config import validate_seconds
from dibs.errors import ConfigurationError, CorruptRecord, StoreUnavailable
from dibs.keys import Key
from dibs.records import KeyState
from dibs.stores import codec, decoder, pages, redact_url, url_userinfo
from dibs.stores.base import Listing, Progress, RecordStore, Skipped, skip
from dibs.stores.feeds import ChangeFeed, PollingFeed, check_watch_interval
from dibs.stores.file_index import FileIndex
from dibs.stores.regular_files import (
    MARKER_BYTES,
    SAFE_OPEN,
    NotRegular,
    fsync_dir,
    kind_of,
    open_dir,
    read_regular,
)
from dibs.stores.transitions import empty

#: The pauses between two tries at a contended record lock: 1 ms, doubling, at most 50 ms apart.
_LOCK_PAUSES = Backoff(initial=0.001, maximum=0.05, jitter=0.0)

if sys.platform != "win32":
    import fcntl

__all__ = ["FileStore"]

log = logging.getLogger(__name__)

#: The format of the marker file; a future layout would bump it instead of misreading an old store.
LAYOUT_FORMAT = "dibs.filestore/1"
MARKER = "dibs-store.json"
_RECORD_NAME = re.compile(r"[0-9a-f]{64}\.json")
_EXAMPLE = "'file:///var/lib/dibs' (three slashes, then an absolute path)"
_URL_OPTIONS = ("lock_timeout", "watch_interval")
#: Default seconds a write waits for another process's critical section (a few renames).
LOCK_TIMEOUT = 30.0
#: Default seconds between two looks of the watch hub at the watched record files.
WATCH_INTERVAL = 0.005  # one look per 5 ms per process at the watched records: a hand-off within ~5 ms


@dataclasses.dataclass(frozen=True)
class _Version:
    """What :meth:`FileStore._load` saw: the record's exact bytes (``None``: no record yet) and the
    fence of the artifact it referenced, so :meth:`FileStore._swap` knows which payload file to add or
    drop."""

    raw: bytes | None
    artifact_fence: int | None = None


class FileStore(RecordStore):
    """Records in a directory. See the module docstring for the layout, the locking and the limits."""

    scheme = "file"
    clock = "this machine's clock (time.time()); processes on several machines must keep theirs in sync"

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        lock_timeout: float = LOCK_TIMEOUT,
        watch_interval: float = WATCH_INTERVAL,
    ) -> None:
        """Open (creating on first use) the store in ``root``.

        ``lock_timeout`` bounds how long a write waits for another process's critical section (a few
        renames) before reporting :class:`StoreUnavailable`: only a stopped (not killed) process or a
        hung file system holds it that long. ``watch_interval`` is how often the process's watch
        hub looks at the watched records (stretched when many keys are watched).
        """
        if sys.platform == "win32":  # pragma: no cover - the module relies on flock
            raise ConfigurationError(
                "the file store needs POSIX flock (Linux, macOS); on Windows use 'sqlite:///C:/path/dibs.db'"
            )
        self._root = Path(root)
        if not self._root.is_absolute():
            raise ConfigurationError(
                f"file store directory {str(root)!r} is not absolute; use an absolute path such as "
                "'/var/lib/dibs', so that every process names the same directory"
            )
        self._lock_timeout = validate_seconds("lock_timeout", lock_timeout, allow_zero=True) or 0.0
        self._watch_interval = check_watch_interval(
            validate_seconds("watch_interval", watch_interval) or WATCH_INTERVAL
        )
        self._index = FileIndex(self._root)
        self._create_layout()

    # -- URLs -------------------------------------------------------------------------------------

    @classmethod
    def from_url(cls, url: str) -> FileStore:
        """``file:///abs/dir`` (or ``file://localhost/abs/dir``), options as ``?lock_timeout=SECONDS``."""
        shown = redact_url(url)
        parts = urllib.parse.urlsplit(url)
        if parts.scheme.lower() != "file":
            raise ConfigurationError(f"not a file store URL: {shown!r}; expected e.g. {_EXAMPLE}")
        if url_userinfo(url) is not None:  # before urlsplit's host: a '/' in a password would cut it
            raise ConfigurationError(
                f"file store URL {shown!r} has a user name or password; a directory takes none: use e.g. "
                f"{_EXAMPLE}"
            )
        if parts.netloc not in ("", "localhost"):
            raise ConfigurationError(
                f"file store URL {shown!r} names the host {parts.hostname or parts.netloc!r}; the file "
                f"store is a local or mounted directory, so the host must be empty or 'localhost': "
                f"use e.g. {_EXAMPLE}; for the directory /{parts.hostname}{parts.path} write "
                f"'file:///{parts.hostname}{parts.path}'"
            )
        path = urllib.parse.unquote(parts.path)
        if not path:
            raise ConfigurationError(f"file store URL {shown!r} names no directory; use e.g. {_EXAMPLE}")
        if not path.startswith("/"):
            raise ConfigurationError(
                f"file store URL {shown!r} has the relative path {path!r}; "
                f"use an absolute one, e.g. {_EXAMPLE}"
            )
        if parts.fragment:
            raise ConfigurationError(f"file store URL {shown!r} has a '#' fragment; use e.g. {_EXAMPLE}")
        return cls(path, **_options(parts.query, shown))

    @property
    def url(self) -> str:
        query = {}
        if self._lock_timeout != LOCK_TIMEOUT:
            query["lock_timeout"] = f"{self._lock_timeout:g}"
        if self._watch_interval != WATCH_INTERVAL:
            query["watch_interval"] = f"{self._watch_interval:g}"
        suffix = "?" + urllib.parse.urlencode(query) if query else ""
        return "file://" + urllib.parse.quote(str(self._root)) + suffix

    @property
    def root(self) -> Path:
        return self._root

    # -- Where things are (public so that operators and tests can look) -----------------------------

    def record_path(self, key: Key) -> Path:
        return self._record_file(key.digest)

    def _record_file(self, digest: str) -> Path:
        """The record file of the key whose digest is ``digest`` (the index names keys by digest)."""
        return self._root / "records" / digest[:2] / f"{digest}.json"

    def artifact_path(self, key: Key, fence: int) -> Path:
        return self._root / "artifacts" / key.digest[:2] / f"{key.digest}-{fence}.bin"

    def lock_path(self, key: Key) -> Path:
        return self._lock_file(key.digest)

    def _lock_file(self, digest: str) -> Path:
        return self._root / "locks" / digest[:2] / f"{digest}.lock"

    # -- The compare-and-swap ---------------------------------------------------------------------

    def _load(self, key: Key) -> tuple[KeyState, object]:
        """The record as one atomic snapshot, with its artifact's payload, read without any lock.

        A payload file can vanish between reading the record and opening it (``forget`` ran), so a
        missing payload is only believed when the record still references it afterwards; then the
        artifact is returned with an empty payload, which its integrity check reports, and ``forget``
        can still repair the key.
        """
        path = self.record_path(key)
        raw = self._read_own_record(key)
        for _ in range(self.max_swap_attempts):
            now = time.time()
            if raw is None:
                return empty(key, now), _Version(None)
            state = codec.decode(raw, key, now, where=str(path))
            if state.artifact is None:
                return state, _Version(raw)
            version = _Version(raw, state.artifact.fence)
            payload_path = self.artifact_path(key, state.artifact.fence)
            payload = _read_payload(payload_path, state.artifact.size)
            if payload is not None:
                artifact = dataclasses.replace(state.artifact, payload=payload)
                return dataclasses.replace(state, artifact=artifact), version
            again = self._read_own_record(key)
            if again == raw:
                log.warning("the payload of %s is missing (%s); its record was kept", key, payload_path)
                return state, version
            raw = again
        raise StoreUnavailable(
            f"{key} changed {self.max_swap_attempts} times while this client read it ({path})",
            key=str(key),
            path=str(path),
        )

    def _read_own_record(self, key: Key) -> bytes | None:
        """The key's record file's bytes (``None``: no record), looked up in the store's ``records``
        folder held open.

        A missing record means a new key only if the folder that holds every record is there while
        it is looked up. A share being unmounted or put back shows a bare mount point, or nothing, for
        a moment: "no record" then would tell a waiter that nobody holds a key that is held. Holding
        the folder open first makes its absence an outage (:class:`StoreUnavailable`), and a folder
        renamed away during the lookup is still the one looked in. One more ``open`` per read.
        """
        records = self._root / "records"
        relative = self._record_file(key.digest).relative_to(records)
        with _translating("read", records), open_dir(records) as folder:
            return _read_record(relative, key, dir_fd=folder, shown=records / relative)

    def _swap(self, key: Key, version: object, new: KeyState, old: KeyState) -> bool:
        """Write ``new`` if the record still holds the bytes :meth:`_load` saw.

        The slow part (writing and fsyncing the temporary files) happens before the lock; under it are
        only a small read, the index files the new record needs, and one or two renames. The payload
        and the index files come before the record, so a record never references a payload that is
        not there and is never missing from the index; index files it no longer needs are removed
        after it, still under the lock (:mod:`dibs.stores.file_index`).
        """
        assert isinstance(version, _Version)
        record = self.record_path(key)
        artifact = new.artifact
        publish = artifact if artifact is not None and artifact.fence != version.artifact_fence else None
        drop = version.artifact_fence is not None and (
            artifact is None or artifact.fence != version.artifact_fence
        )
        payload_target = None if publish is None else self.artifact_path(key, publish.fence)
        staged: list[Path] = []
        try:
            with _translating("write", record):
                if publish is not None and payload_target is not None:
                    staged.append(self._stage(payload_target, publish.payload))
                staged.append(self._stage(record, codec.encode(new)))
            with self._locked(key):
                if _read_record(record, key) != version.raw:
                    return False
                index = self._index.plan(old, new)
                with _translating("index", record):
                    self._index.add(index.before)
                with _translating("publish", record):
                    if payload_target is not None:
                        os.replace(staged[0], payload_target)
                        fsync_dir(payload_target.parent)
                    os.replace(staged[-1], record)
                    fsync_dir(record.parent)  # on disk before an index file it needed goes
                staged.clear()
                self._index.remove(index.after)  # still under the lock: the next holder's come after
        finally:
            for leftover in staged:
                leftover.unlink(missing_ok=True)
        if drop:
            assert version.artifact_fence is not None
            self._drop_payload(key, version.artifact_fence)
        return True

    def _drop_payload(self, key: Key, fence: int) -> None:
        """Delete the payload of the artifact written under ``fence``, which the record no longer names.

        This runs after the record was replaced, outside the key's lock, so a remover may be paused
        here while a new holder computes and stores the key. That is safe only because the record is
        never deleted (removal writes a tombstone that keeps the fence): the new holder's fence is
        higher, so its payload has another name, and no later record can name this one again.
        """
        path = self.artifact_path(key, fence)
        with _translating("remove", path):
            path.unlink(missing_ok=True)

    # -- Listing and watching ---------------------------------------------------------------------

    def list(self, namespace: str | None = None) -> Listing:
        """Every readable record (artifacts without payloads), sorted by key.

        A damaged or foreign file (or a directory, FIFO or link where a record belongs) is skipped,
        logged and counted (see :class:`~dibs.stores.base.Listing`): one bad file must not stop
        ``dibs ls`` or the reaper from seeing every other key. Reading that key directly reports it.
        """
        states: builtins.list[KeyState] = []
        skipped: builtins.list[Skipped] = []
        for path in self._record_files():
            try:
                state = self._list_one(path)
            except CorruptRecord as exc:
                skip(skipped, str(path), exc)
                continue
            if state is not None and (namespace is None or state.key.namespace == namespace):
                states.append(state)
        return Listing(states, skipped)

    # -- The reads a person makes, through the index (dibs.stores.file_index) ----------------------

    def _through_index(self, namespace: str | None) -> bool:
        """Whether a read of ``namespace`` goes through the index: one namespace (the index is kept
        per namespace), and the index complete. Otherwise the read scans, as the defaults do."""
        if namespace is None:
            return False
        with _translating("read", self._index.ready_path):
            return self._index.is_ready()

    def _reader(self, skipped: builtins.list[Skipped]) -> Callable[[str], KeyState | None]:
        """Reads a record by its key's digest; one that cannot be read is skipped into ``skipped``."""

        def read(digest: str) -> KeyState | None:
            path = self._record_file(digest)
            try:
                return self._list_one(path)
            except CorruptRecord as exc:
                skip(skipped, str(path), exc)
                return None

        return read

    def _live(self, namespace: str) -> Listing:
        """The namespace's records that hold a lease, in key order, found through the index."""
        skipped: builtins.list[Skipped] = []
        with _translating("list", self._root / "index"):
            states = self._index.live(namespace, self._reader(skipped))
        return Listing(states, skipped)

    def _live_query(self, query: pages.Query) -> bool:
        held = query.state in ("held", "expired") and query.older_than is None
        return held and self._through_index(query.namespace)

    def page(self, query: pages.Query) -> pages.Page:
        """As :meth:`Store.page <dibs.stores.base.Store.page>`; a page of held or expired keys of one
        namespace reads the records the index names (the keys holding a lease), not every record."""
        if self._live_query(query):
            assert query.namespace is not None
            return pages.page_of(self._live(query.namespace), query)
        return super().page(query)

    def _pages(self, query: pages.Query, first: int | None = None) -> Iterator[pages.Page]:
        if self._live_query(query):
            assert query.namespace is not None
            return pages.pages_of(self._live(query.namespace), query)
        return super()._pages(query, first)

    def leases(self, namespace: str | None, *, expired: bool, limit: int) -> builtins.list[KeyState]:
        """As :meth:`Store.leases <dibs.stores.base.Store.leases>`, through the index when it can."""
        pages.check_limit(limit)
        if self._through_index(namespace):
            assert namespace is not None
            return pages.leases_of(self._live(namespace), expired=expired, limit=limit)
        return super().leases(namespace, expired=expired, limit=limit)

    def latest(self, namespace: str | None, kind: pages.Kind, *, limit: int) -> builtins.list[KeyState]:
        """As :meth:`Store.latest <dibs.stores.base.Store.latest>`, through the index when it can: the
        newest ``made`` names first, a record read for each shown."""
        pages.check_limit(limit)
        pages.made_at(kind)  # refuses a bad kind before anything is read
        if self._through_index(namespace):
            assert namespace is not None
            with _translating("list", self._root / "index"):
                return self._index.latest(namespace, kind, limit, self._reader([]))
        return super().latest(namespace, kind, limit=limit)

    def overview(
        self, namespace: str | None, *, leases: int, recent: int, up_to: int = pages.COUNT_CAP
    ) -> pages.Overview:
        """As :meth:`Store.overview <dibs.stores.base.Store.overview>` (``dibs top``), through the index
        when it can (:meth:`FileIndex.overview <dibs.stores.file_index.FileIndex.overview>`): it reads
        the records it shows and the index's names, not every record of the store."""
        for limit in (leases, recent, up_to):
            pages.check_limit(limit)
        if self._through_index(namespace):
            assert namespace is not None
            with _translating("list", self._root / "index"):
                return self._index.overview(
                    namespace, self._reader([]), leases=leases, recent=recent, up_to=up_to
                )
        return super().overview(namespace, leases=leases, recent=recent, up_to=up_to)

    def reap(self, namespace: str | None = None, *, progress: Progress | None = None) -> int:
        """As :meth:`Store.reap <dibs.stores.base.Store.reap>`; then the index. A store without one (an
        older dibs created it) is indexed whole (:meth:`rebuild_index`). Otherwise the records of
        ``namespace`` get the index files they lack (written by a process of an older dibs during an
        upgrade), and the files no record needs (a killed process's) are removed, each under its key's
        lock once its record, read again, does not need it. The index's part never fails the reap
        (its changes have landed): it is logged."""
        reaped = super().reap(namespace, progress=progress)
        try:
            if not self._index.is_ready():
                self.rebuild_index()
                return reaped
            with _translating("index", self._root / "index"):
                added = self._index.ensure(self.list(namespace))
            swept = self._sweep(namespace)
            if added or swept:
                log.info("index of %s: %d files added, %d left over removed", self._root, added, swept)
        except (OSError, ConfigurationError, StoreUnavailable, CorruptRecord) as exc:
            log.warning("reap could not bring the index of %s up to date: %s", self._root, exc)
        return reaped

    def _sweep(self, namespace: str | None) -> int:
        """Remove the index files no record needs (see :meth:`reap`); returns how many."""
        swept = 0
        read = self._reader([])
        with _translating("list", self._root / "index"):
            leftovers = builtins.list(self._index.leftovers(namespace, read))
        for path, digest in leftovers:
            try:
                with self._locked_at(self._lock_file(digest), None):
                    if not self._index.needed(path, read(digest)):
                        path.unlink(missing_ok=True)
                        swept += 1
            except (OSError, ConfigurationError, StoreUnavailable, CorruptRecord) as exc:
                log.warning("could not remove the left-over index file %s: %s", path, exc)
        return swept

    def rebuild_index(self) -> int:
        """Index every record (index files already there are kept), then mark the index complete;
        returns how many index files were created. For a store written before the index, or by
        processes of an older dibs (upgrade them first): ``reap`` does it when the index is missing.
        Run it as the user the store's processes run as (or with their group and umask), as the
        files it creates must be theirs to remove."""
        records = (state for path in self._record_files() if (state := self._list_quietly(path)) is not None)
        with _translating("index", self._root / "index"):
            return self._index.rebuild(records, self._stage)

    def _list_quietly(self, path: Path) -> KeyState | None:
        try:
            return self._list_one(path)
        except CorruptRecord:
            return None  # reported by the reads that list; nothing to index

    def change_feed(self) -> ChangeFeed:
        """One poller per process that ``stat``\\s every watched record file: no lock, no file kept open."""
        return _StatFeed(self, self._watch_interval)

    def close(self) -> None:
        """No file is held open between operations; only the watch hub is stopped."""
        super().close()

    # -- Files ------------------------------------------------------------------------------------

    def _create_layout(self) -> None:
        """Create the root (its parent must exist), the top directories and the marker, race-free; the
        process that creates ``records/`` marks the index complete (there is no record to index).

        Only the root itself is created, never its parents: a mistyped mount point must fail here
        instead of silently becoming a directory private to this machine.
        """
        root = self._root
        with _translating("open", root, config=True):
            if not root.parent.is_dir():
                raise ConfigurationError(
                    f"cannot create the file store {root}: its parent directory {root.parent} does not "
                    "exist (or is not a directory); create it, or mount the shared directory, first",
                    path=str(root),
                )
            if root.exists() and not root.is_dir():
                raise ConfigurationError(
                    f"the file store path {root} exists and is not a directory; point the URL at a directory",
                    path=str(root),
                )
            fresh = False
            for directory in (root, root / "records", root / "artifacts", root / "locks"):
                try:
                    directory.mkdir()
                except FileExistsError:
                    continue
                fresh = fresh or directory.name == "records"
            self._write_marker(root / MARKER)
            if fresh:  # no record yet: every one will be written with its index files
                self._index.mark_ready(self._stage)

    def _write_marker(self, marker: Path) -> None:
        """Write the marker with ``link`` so that of several racing creators one wins, whole, and the
        others read its complete content."""
        if not marker.exists():
            temp = self._stage(marker, json.dumps({"format": LAYOUT_FORMAT}).encode())
            try:
                os.link(temp, marker)
            except FileExistsError:
                pass
            finally:
                temp.unlink()
        try:
            with _translating("read", marker, config=True):
                found = json.loads(read_regular(marker, MARKER_BYTES) or b"").get("format")
        except (ValueError, AttributeError, RecursionError, NotRegular):
            found = None
        if found != LAYOUT_FORMAT:
            raise ConfigurationError(
                f"{self._root} is not a dibs file store of this version: {marker} says format {found!r}, "
                f"expected {LAYOUT_FORMAT!r}; use another directory",
                path=str(self._root),
            )

    @staticmethod
    def _stage(target: Path, data: bytes) -> Path:
        """Write ``data`` to a new hidden file beside ``target`` and fsync it; the caller renames it.

        The name is random and created with ``O_EXCL``, so racing writers never share a temporary file.
        """
        with contextlib.suppress(FileExistsError):
            target.parent.mkdir()
        temp = target.parent / f".{target.name}.{secrets.token_hex(8)}.tmp"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        try:
            with open(fd, "wb", closefd=False) as file:
                file.write(data)  # a large payload is written from the caller's bytes, not copied
            os.fsync(fd)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        return temp

    def _locked(self, key: Key) -> contextlib.AbstractContextManager[None]:
        """Hold the key's exclusive flock."""
        return self._locked_at(self.lock_path(key), key)

    @contextlib.contextmanager
    def _locked_at(self, path: Path, key: Key | None) -> Iterator[None]:
        """Hold the exclusive flock of the lock file ``path`` (of ``key``, when known: for errors).
        ``LOCK_UN`` before closing, so that a descriptor inherited by a forked child cannot keep the
        lock alive."""
        with _translating("lock", path):
            with contextlib.suppress(FileExistsError):
                path.parent.mkdir()
            # O_RDONLY is enough for flock, so read-only access to an existing lock file suffices.
            # O_NONBLOCK: a FIFO planted here must not block the open; it is refused below.
            fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC | SAFE_OPEN, 0o666)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise decoder.corrupt(key, str(path), f"the lock file is {kind_of(os.fstat(fd).st_mode)}")
            self._flock(fd, path)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def _flock(self, fd: int, path: Path) -> None:
        """Take the flock, retrying after short pauses until ``lock_timeout`` (0: try once)."""
        retrying = Retrying(_LOCK_PAUSES, self._lock_timeout)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                pass
            except OSError as exc:
                raise StoreUnavailable(
                    f"cannot lock {path}: {exc.strerror}; the file system must support flock",
                    path=str(path),
                ) from exc
            if not retrying.sleep():
                raise StoreUnavailable(
                    f"{path} stayed locked for {self._lock_timeout:g}s; another process is stuck inside a "
                    "write (stopped, or on a hung file system). A killed process releases it at once",
                    path=str(path),
                )

    def _record_files(self) -> Iterator[Path]:
        records = self._root / "records"
        with _translating("list", records):
            shards = sorted(records.iterdir())
        for shard in shards:
            with _translating("list", shard):
                names = sorted(shard.iterdir()) if shard.is_dir() else []
            yield from (path for path in names if _RECORD_NAME.fullmatch(path.name))

    @staticmethod
    def _list_one(path: Path) -> KeyState | None:
        """The record at ``path`` (found by listing: its name is the digest of the key it must hold)."""
        raw = _read_record(path, None)
        if raw is None:
            return None
        return codec.decode(raw, None, time.time(), where=str(path), digest=path.name.removesuffix(".json"))


class _StatFeed(PollingFeed):
    """Looks at every watched record file each interval: every write renames a new file into place, so
    any change gives the path a new inode (or time, or size)."""

    #: ``stat`` costs microseconds: a look at 1,000 records may take this long per key before the
    #: interval is stretched, so polling never costs more than a few percent of a core.
    per_key = 0.00005

    def __init__(self, store: FileStore, interval: float) -> None:
        super().__init__()
        self._store = store
        self.min_interval = self.max_interval = interval

    def tokens(self, keys: Iterable[Key]) -> Mapping[str, Hashable]:
        return {key.digest: _signature(self._store.record_path(key)) for key in keys}


def _signature(path: Path) -> tuple[int, int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_ino, stat.st_mtime_ns, stat.st_size


def _options(query: str, shown: str) -> dict[str, float]:
    """The URL's query as keyword arguments; anything unknown or unparsable is a configuration error."""
    options: dict[str, float] = {}
    for name, value in urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=False):
        if name not in _URL_OPTIONS:
            raise ConfigurationError(
                f"unknown option {name!r} in file store URL {shown!r}; known: {', '.join(_URL_OPTIONS)} "
                "(e.g. 'file:///var/lib/dibs?lock_timeout=30')"
            )
        try:
            options[name] = float(value)
        except ValueError:
            raise ConfigurationError(
                f"option {name}={value!r} in file store URL {shown!r} is not a number of seconds"
            ) from None
    return options


def _read_record(
    path: Path, key: Key | None, *, dir_fd: int | None = None, shown: Path | None = None
) -> bytes | None:
    """A record file's bytes (``None``: no record); anything but a small regular file is corrupt.
    ``path`` is relative to the open folder ``dir_fd`` when given; ``shown`` is its full path."""
    where = shown if shown is not None else path
    with _translating("read", where):
        try:
            data = read_regular(path, decoder.MAX_RECORD_BYTES, dir_fd=dir_fd)
        except NotRegular as exc:
            raise decoder.corrupt(key, str(where), f"it is {exc.strerror}, not a file") from None
    if data is not None and len(data) > decoder.MAX_RECORD_BYTES:
        raise decoder.corrupt(key, str(where), f"it is more than {decoder.MAX_RECORD_BYTES} bytes")
    return data


def _read_payload(path: Path, size: int) -> bytes | None:
    """An artifact's payload (``None``: missing), at most ``size + 1`` bytes: a longer or non-regular
    file is served as far as read (empty if not a file), so the integrity check refuses it and
    ``dibs forget`` can still repair the key."""
    with _translating("read", path):
        try:
            return read_regular(path, size)
        except NotRegular as exc:
            log.warning("the payload of an artifact, %s, is %s; it cannot be read", path, exc.strerror)
            return b""


@contextlib.contextmanager
def _translating(action: str, path: Path, *, config: bool = False) -> Iterator[None]:
    """Turn an ``OSError`` into the dibs error the caller can act on, naming the path.

    Permission errors are configuration (they will not pass by retrying); anything else (a full disk,
    a vanished directory, an I/O error) is the store being unavailable. ``config`` makes every error
    a configuration error, for opening the store.
    """
    try:
        yield
    except PermissionError as exc:
        raise ConfigurationError(
            f"permission denied: cannot {action} {path}; every process using the file store needs read and "
            "write access to its whole directory",
            path=str(path),
        ) from exc
    except OSError as exc:
        error = ConfigurationError if config else StoreUnavailable
        if isinstance(exc, FileNotFoundError):
            why = (
                "it or its directory is missing (was the store directory removed or unmounted while in use?)"
            )
        else:
            why = str(exc.strerror or exc)
        raise error(f"cannot {action} {path}: {why}", path=str(path)) from exc

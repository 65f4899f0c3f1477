"""The file store's index: empty files whose *names* say which keys hold a lease and which artifacts
and failures are newest, so ``dibs top``, ``ls --state held|expired`` and the Reservations page read
what they show instead of every record file of the store (issue 30).

The names are the Azure store's (:mod:`dibs.stores.name_index`), as files under the store's root::

    index/live/<ns>/<key digest>                      the key's record holds a lease (held or expired)
    index/made/a/<ns>/<inverted time>-<key digest>    its artifact was made then (newest first by name)
    index/made/f/<ns>/<inverted time>-<key digest>    its last failure was recorded then
    index/ready                                       {"format": FORMAT}: every record is in the index

The rules that keep it true
    Under the key's ``flock``, a write creates the index files its new record needs *before* it
    renames the record into place, and removes those the record no longer needs *after*, still under
    the lock: a record that holds a lease always has its ``live`` file, one with an artifact or a
    failure its ``made`` file. Every writer of a key holds that lock while it does so, so the next
    holder's ``live`` file cannot be removed by the one before. The reverse is not kept: an index
    file may outlive its reason (a process killed between the rename and the removal, a write refused
    after its files were made), so a reader reads the record a name points to and trusts the record,
    and ``reap`` removes what is left over, under each key's lock.

    Durability: a write fsyncs the folder of every file its record needs (made by it or found there:
    another process may have made it and been killed before its fsync), and each index folder once
    in its parent, before the record's rename; it fsyncs the record's folder before it removes a file.

Stores written before the index (or by an older dibs)
    A store is read through the index once ``index/ready`` holds :data:`FORMAT`. A store created by
    this version is marked when it is created; an older one is indexed by its next ``reap`` (or
    :meth:`FileStore.rebuild_index <dibs.stores.filesystem.FileStore.rebuild_index>`), which lists the
    records once, as every read did before. Reads never write: until then they scan, as they did.
    Processes of an older dibs write records without index files: until they are all upgraded, the
    leases they take are missing from the index; each ``reap`` adds what the records of its namespace
    lack.

Only regular files and folders are created and read (:mod:`dibs.stores.regular_files`): a FIFO, a
link, or a file where a folder belongs, planted under ``index/``, is reported, never opened or
followed.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dibs.records import KeyState
from dibs.stores import name_index, pages
from dibs.stores.name_index import MADE_NAME, Layout, is_digest, micros
from dibs.stores.regular_files import MARKER_BYTES, NotRegular, create_empty, fsync_dir, kind_of, read_regular

__all__ = ["FORMAT", "FileIndex", "IndexWrite"]

log = logging.getLogger(__name__)

#: What ``index/ready`` says; another value (or none) means the index is not (yet) complete.
FORMAT = "dibs.fileindex/1"
#: Reads a record by its key's digest: ``None`` when there is none, or it cannot be read (the store
#: counts it as skipped).
ReadDigest = Callable[[str], KeyState | None]


@dataclass
class IndexWrite:
    """What one record write does to the index: the files made before it, those removed after."""

    before: list[Path] = field(default_factory=list)
    after: list[Path] = field(default_factory=list)


class FileIndex:
    """The index of one :class:`~dibs.stores.filesystem.FileStore`, under its root."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.layout = Layout("")
        self.ready_path = root / self.layout.ready
        #: The index folders this process has seen as folders, each fsynced in its parent once: a
        #: folder another process created may not be on disk yet (killed before its fsync).
        self._durable: set[Path] = set()

    def _path(self, name: str) -> Path:
        return self.root / name

    # -- writes (under the key's lock) --------------------------------------------------------------

    def plan(self, old: KeyState, new: KeyState) -> IndexWrite:
        """The index files a write from ``old`` to ``new`` makes before and removes after."""
        change = name_index.changes(self.layout, old, new)
        plan = IndexWrite(
            before=[self._path(name) for name in change.made_before],
            after=[self._path(name) for name in change.stale_after],
        )
        if change.takes_lease:
            plan.before.append(self._path(self.layout.live(new.key)))
        if change.ends_lease:
            plan.after.append(self._path(self.layout.live(old.key)))
        return plan

    def add(self, paths: Iterable[Path]) -> None:
        """Create the files (a regular one already there is kept: another process may have created
        it and been killed before its fsync, so its folder is fsynced all the same), so that they are
        on disk before the record that needs them. Raises ``OSError`` naming what is in the way (the
        write then fails, its record unchanged)."""
        folders: set[Path] = set()
        for path in paths:
            self._make_folder(path.parent)
            _create(path)
            folders.add(path.parent)
        for folder in folders:
            fsync_dir(folder)

    def remove(self, paths: Iterable[Path]) -> None:
        """Remove files the record no longer needs. The record has landed, so a failure here is
        logged, not raised: the file is left over, which readers pass by and ``reap`` removes."""
        for path in paths:
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:
                log.warning("could not remove the index file %s (%s); reap removes it", path, exc)

    def _make_folder(self, folder: Path) -> None:
        """Create ``folder`` and the index folders above it (up to the root), each fsynced in its
        parent once by this process. A link or a file where a folder belongs is refused, never
        followed."""
        for each in _below(self.root, folder):
            try:
                each.mkdir()
            except FileExistsError:
                _check_folder(each)
                if each in self._durable:
                    continue
            fsync_dir(each.parent)
            self._durable.add(each)

    def _exists(self, folder: Path) -> bool:
        """Whether ``folder`` is there, each folder down to it a folder (a link or a file where one
        belongs is refused, never followed)."""
        for each in _below(self.root, folder):
            try:
                _check_folder(each)
            except FileNotFoundError:
                return False
        return True

    # -- whether it is complete ----------------------------------------------------------------------

    def is_ready(self) -> bool:
        """Whether every record is in the index (``index/ready`` says :data:`FORMAT`); not when
        anything but the store's own folder and file is in the way (the reads then scan)."""
        try:
            if not self._exists(self.ready_path.parent):
                return False
            data = read_regular(self.ready_path, MARKER_BYTES)
        except (NotRegular, NotADirectoryError):
            return False
        if data is None:
            return False
        try:
            return bool(json.loads(data).get("format") == FORMAT)
        except (ValueError, AttributeError, RecursionError):
            return False

    def mark_ready(self, stage: Callable[[Path, bytes], Path]) -> None:
        """Write ``index/ready`` (staged by the store: a whole file renamed into place)."""
        self._make_folder(self.ready_path.parent)
        os.replace(stage(self.ready_path, json.dumps({"format": FORMAT}).encode()), self.ready_path)
        fsync_dir(self.ready_path.parent)

    def ensure(self, records: Iterable[KeyState]) -> int:
        """Create the index files these records need that are missing (an older dibs wrote them, or
        a store written before the index); returns how many were created. Needs no lock: a writer
        that changes a record meanwhile makes the files its new record needs itself, so at worst a
        file is left over. Each folder is fsynced once, after its files, not once per file."""
        created = 0
        folders: set[Path] = set()
        for state in records:
            names = name_index.made_names(self.layout, state)
            if state.lease is not None:
                names.add(self.layout.live(state.key))
            for name in sorted(names):
                path = self._path(name)
                self._make_folder(path.parent)
                created += _create(path)
                folders.add(path.parent)
        for folder in folders:
            fsync_dir(folder)
        return created

    def rebuild(self, records: Iterable[KeyState], stage: Callable[[Path, bytes], Path]) -> int:
        """:meth:`ensure` every record of the store, then mark the index complete."""
        created = self.ensure(records)
        self.mark_ready(stage)
        return created

    # -- reads ---------------------------------------------------------------------------------------

    def _names(self, folder: Path) -> Iterator[str]:
        """The names of the regular files in ``folder`` (none if it does not exist)."""
        if not self._exists(folder):
            return
        with os.scandir(folder) as entries:
            yield from (entry.name for entry in entries if entry.is_file(follow_symlinks=False))

    def _folders(self, every: Path, namespace_folder: Path | None) -> list[Path]:
        """``namespace_folder``, or (``None``) each namespace's folder under ``every``."""
        if namespace_folder is not None:
            return [namespace_folder]
        if not self._exists(every):
            return []
        with os.scandir(every) as entries:
            names = sorted(entry.name for entry in entries if entry.is_dir(follow_symlinks=False))
        return [every / name for name in names]

    def _live_files(self, namespace: str | None) -> Iterator[tuple[Path, str]]:
        """The ``live`` files (of every namespace: ``None``) and the digests they name."""
        mine = None if namespace is None else self._path(self.layout.live_prefix(namespace))
        for folder in self._folders(self._path(self.layout.live_prefix(None)), mine):
            yield from ((folder / name, name) for name in self._names(folder) if is_digest(name))

    def live(self, namespace: str, read: ReadDigest) -> list[KeyState]:
        """The namespace's records that hold a lease, in key order, read through their ``live`` files."""
        found = [
            state
            for _, digest in self._live_files(namespace)
            if (state := read(digest)) is not None
            and state.lease is not None
            and state.key.namespace == namespace
        ]
        found.sort(key=lambda state: state.key)
        return found

    def made(self, kind: pages.Kind, namespace: str) -> list[str]:
        """The names of the namespace's ``made`` files of ``kind``, newest first (name order; parsed
        only when read: a namespace's history is many names)."""
        return sorted(self._names(self._path(self.layout.made_prefix(kind, namespace))))

    def latest(
        self,
        namespace: str,
        kind: pages.Kind,
        limit: int,
        read: ReadDigest,
        names: list[str] | None = None,
    ) -> list[KeyState]:
        """The ``limit`` newest artifacts (or failures) of the namespace, newest first, ties in key
        order (as :func:`~dibs.stores.pages.latest_of` has them): the ``made`` files newest first
        (``names``: as :meth:`made` listed them, when the caller has), each record read and kept only
        when it still holds what its name says (a file left over is passed by). A name holds whole
        microseconds, so every file of the last microsecond kept is read before the exact times and
        keys decide."""
        pages.check_limit(limit)
        made_at = pages.made_at(kind)
        found: list[KeyState] = []
        shown: set[str] = set()
        last: int | None = None
        for name in self.made(kind, namespace) if names is None else names:
            made = self.layout.parse_made(name)
            if made is None:
                continue
            if last is not None and made.at < last:
                break
            if made.digest in shown:
                continue
            state = read(made.digest)
            at = None if state is None else made_at(state)
            if state is None or at is None or micros(at) != made.at or state.key.namespace != namespace:
                continue
            shown.add(made.digest)
            found.append(state)
            if last is None and len(found) == limit:
                last = made.at
        found.sort(key=lambda state: (-(made_at(state) or 0.0), state.key.namespace, state.key.name))
        return found[:limit]

    def overview(
        self, namespace: str, read: ReadDigest, *, leases: int, recent: int, up_to: int
    ) -> pages.Overview:
        """``dibs top`` through the index: the leases from the ``live`` files (counted exactly, each
        record read), the newest artifacts and failures from the ``made`` files, and the done and
        failed keys counted from the ``made`` names alone (no record read): a key with an artifact is
        done unless it is held, one with a failure is failed unless it has an artifact or a lease.
        A file left over by a killed process counts until ``reap`` removes it."""
        live = self.live(namespace, read)
        counts = pages.count_of(live, up_to)
        artifacts, failures = self.made("artifact", namespace), self.made("failure", namespace)
        with_artifact = _digests(artifacts)
        with_failure = _digests(failures)
        held = {state.key.digest for state in live if state.status == "held"}
        leased = {state.key.digest for state in live}
        counts["done"] = min(up_to, len(with_artifact - held))
        counts["failed"] = min(up_to, len(with_failure - with_artifact - leased))
        return pages.Overview(
            counts=counts,
            held=pages.leases_of(live, expired=False, limit=leases),
            expired=pages.leases_of(live, expired=True, limit=leases),
            artifacts=self.latest(namespace, "artifact", recent, read, artifacts),
            failures=self.latest(namespace, "failure", recent, read, failures),
        )

    # -- what is left over ---------------------------------------------------------------------------

    def leftovers(self, namespace: str | None, read: ReadDigest) -> Iterator[tuple[Path, str]]:
        """The index files (and the digests they name) whose record does not need them as read now;
        the caller removes each under its key's lock after reading the record again (:meth:`needed`)."""
        for path, digest in self._live_files(namespace):
            if not self.needed(path, read(digest)):
                yield path, digest
        for kind in name_index.KINDS:
            every = self._path(self.layout.made_prefix(kind, None))
            mine = None if namespace is None else self._path(self.layout.made_prefix(kind, namespace))
            for folder in self._folders(every, mine):
                for name in self._names(folder):
                    made = self.layout.parse_made(name)
                    if made is not None and not self.needed(folder / name, read(made.digest)):
                        yield folder / name, made.digest

    def needed(self, path: Path, state: KeyState | None) -> bool:
        """Whether the record ``state`` (``None``: none) needs the index file at ``path``."""
        if state is None:
            return False
        relative = path.relative_to(self.root).as_posix()
        if self.layout.parse_live(relative) is not None:
            return state.lease is not None
        return relative in name_index.made_names(self.layout, state)


def _digests(names: list[str]) -> set[str]:
    """The key digests ``made`` names hold (other names left out)."""
    return {name[18:] for name in names if MADE_NAME.fullmatch(name)}


def _below(root: Path, folder: Path) -> list[Path]:
    """The folders from the one below ``root`` down to ``folder``."""
    return [
        root.joinpath(*folder.relative_to(root).parts[: i + 1])
        for i in range(len(folder.relative_to(root).parts))
    ]


def _check_folder(folder: Path) -> None:
    """Refuse anything but a folder at ``folder`` (a link to one too); ``FileNotFoundError`` if none."""
    mode = os.lstat(folder).st_mode
    if not stat.S_ISDIR(mode):
        what = "a symbolic link" if stat.S_ISLNK(mode) else kind_of(mode)
        raise NotRegular(errno.ENOTDIR, f"{folder} is {what}, not a folder", str(folder))


def _create(path: Path) -> bool:
    """:func:`create_empty`, its error naming the path (what is in the way must be found to be removed)."""
    try:
        return create_empty(path)
    except NotRegular as exc:
        raise NotRegular(exc.errno, f"{path} is {exc.strerror}", str(path)) from None

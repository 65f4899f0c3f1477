"""A record store whose large artifacts live in a payload store: what ``Reservations(payloads=...)`` uses.

:class:`ReferencingStore` is a :class:`~dibs.stores.Store` around any record store, so every caller
(the client, the flow, the Airflow and Prefect front ends, the CLI, the contract suite) goes through
it unchanged:

* ``complete`` with a payload larger than the inline limit puts the payload in the payload store
  first, then completes the record with a small reference (:mod:`.references`), fenced by the record
  store as always. A refused (fenced-out) complete leaves the payload unpublished, and it is removed
  by the collector's rule (:mod:`.collect`);
* what it reads back carries a :class:`ReferencedArtifact`: it looks like the artifact that was
  stored (its serializer, size and checksum), and its :meth:`~ReferencedArtifact.verified_payload`
  reads the payload and checks size and SHA-256;
* a missing, truncated or mismatched payload is a **miss**, never an error and never a wrong value:
  ``acquire`` reads the payload of a hit before returning it, and on a bad one asks again taking only
  a newer artifact (``min_fence``), so the caller gets the lease and computes again; ``read_many``
  and ``view_many`` (the watch hub's read, for this store's waiters, and ``wait``'s) read a finished
  key's payload once for all of them, and leave the artifact out if it is bad; ``read`` (``status``)
  checks that a finished key's payload is there whole, and reads it only when asked to. Its unread
  twins (``load=False``, :func:`~dibs.payloads.unread`) hand a hit out without loading it: checked
  to its end into a private spool file that the caller prints from (``dibs run``, ``dibs wait``), or
  only checked to be there whole (what a record-only ``wait(decode=False)`` and Airflow's triggerer
  read through). A warning names the payload's URI. What remains is a payload that goes bad between
  ``read`` and the caller's decode: that one raises :class:`~dibs.payloads.PayloadUnavailable` (still
  never a wrong value), and ``wait`` takes it as the miss it is;
* ``forget``, ``prune`` and ``reap`` then remove the payloads no record refers to (:mod:`.collect`);
  a collection that fails is a :class:`~dibs.errors.StoreUnavailable` saying what the records' part did.
"""

from __future__ import annotations

import builtins
import dataclasses
import logging
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any, Literal, TypeAlias, TypeVar

from dibs.errors import ArtifactCorrupted, LeaseLost, StoreUnavailable
from dibs.keys import Key
from dibs.payloads.base import Freed, Payload, PayloadStore, PayloadUnavailable
from dibs.payloads.collect import DEFAULT_GRACE, collect, referenced_digest
from dibs.payloads.references import REFERENCE, decode, encode
from dibs.payloads.verify import read_verified, spool_verified
from dibs.records import ArtifactRecord, KeyState, LeaseRecord, LeaseToken, Present, StoreOutcome
from dibs.stores import pages
from dibs.stores.base import Progress, Store
from dibs.stores.feeds import ChangeFeed
from dibs.stores.requests import AcquireRequest, NewArtifact

__all__ = ["DEFAULT_INLINE_LIMIT", "ReferencedArtifact", "ReferencingStore"]

log = logging.getLogger("dibs.payloads")

T = TypeVar("T")

#: Artifacts up to this many bytes stay in the record (64 KiB).
DEFAULT_INLINE_LIMIT = 64 * 1024
#: How many bad payloads in a row one ask steps over before it gives up (each is a newer artifact).
_MAX_MISSES = 8


@dataclasses.dataclass(frozen=True)
class ReferencedArtifact(ArtifactRecord):
    """An artifact whose payload is in a payload store. ``payload`` is the reference document;
    ``serializer``, ``size`` and ``checksum`` are the payload's. :meth:`verified_payload` returns its
    bytes, checked (:class:`~dibs.payloads.PayloadUnavailable` if they are not the recorded ones)."""

    # Keyword-only: whatever fields ArtifactRecord gains (with defaults or not), these stay valid.
    reference: Payload = dataclasses.field(kw_only=True)
    uri: str = dataclasses.field(kw_only=True)
    source: PayloadStore = dataclasses.field(kw_only=True, compare=False, repr=False)
    #: The payload's bytes when they were read (and checked) already.
    loaded: bytes | None = dataclasses.field(default=None, kw_only=True, compare=False, repr=False)
    #: What keeps ``loaded`` shared while this record lives (see :meth:`ReferencingStore._load`).
    keep: object = dataclasses.field(default=None, kw_only=True, compare=False, repr=False)
    #: The payload checked into a private spool file already (see :meth:`verified_spool`).
    spooled: IO[bytes] | None = dataclasses.field(default=None, kw_only=True, compare=False, repr=False)

    @classmethod
    def of(
        cls, artifact: ArtifactRecord, document: bytes, payload: Payload, **where: Any
    ) -> ReferencedArtifact:
        """``artifact`` (as its record store has it: every field it has is kept) standing for ``payload``."""
        fields = {field.name: getattr(artifact, field.name) for field in dataclasses.fields(ArtifactRecord)}
        fields |= {"serializer": payload.serializer, "payload": document, "size": payload.size}
        fields["checksum"] = payload.checksum
        return cls(**fields, reference=payload, **where)

    def verified_payload(self, key: Key) -> bytes:
        if self.loaded is not None:
            return self.loaded
        return _naming(key, self.uri, lambda: read_verified(self.source, self.reference, self.uri))

    def verified_spool(self, key: Key) -> IO[bytes]:
        """The payload in a private temporary file, checked to its end before it is handed out (a
        chunk or two in memory): what a stream is read from. Read it by position
        (:func:`~dibs.payloads.verify.copy_out`): the spool may be shared."""
        if self.spooled is not None:
            return self.spooled
        return _naming(key, self.uri, lambda: spool_verified(self.source, self.reference, self.uri))


def _naming(key: Key, uri: str, read: Callable[[], T]) -> T:
    try:
        return read()
    except PayloadUnavailable as exc:  # the same kind (damaged or not), naming the key
        raise type(exc)(f"artifact of {key}: {exc}", key=str(key), uri=uri) from None


#: How a hit handed out unread is checked when it is found (see :attr:`ReferencingStore.unread_check`).
UnreadCheck: TypeAlias = Literal["digest", "size"]


class _Loading:
    """One payload being read, or read: shared while any record that carries it lives."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.data: bytes | None = None


class ReferencingStore(Store):
    """``records`` for the coordination, ``payloads`` for artifacts above ``inline_limit`` bytes."""

    def __init__(
        self,
        records: Store,
        payloads: PayloadStore,
        *,
        inline_limit: int = DEFAULT_INLINE_LIMIT,
        grace: float = DEFAULT_GRACE,
        load: bool = True,
        unread_check: UnreadCheck = "digest",
    ) -> None:
        self.records = records
        self.payloads = payloads
        self.inline_limit = inline_limit
        self.grace = grace
        #: Whether a hit's payload is read (and checked) into memory before it is handed out.
        #: ``False``: it is handed out unread, as :attr:`unread_check` says.
        self.load = load
        #: How a hit handed out unread (``load=False``) is checked when it is found: ``"digest"``
        #: checks it to its end into a private spool file (:attr:`ReferencedArtifact.spooled`), which
        #: the caller then streams from (``dibs run`` and ``dibs wait`` print it: never a byte that
        #: was not checked, never the whole payload in memory); ``"size"`` only asks the payload
        #: store whether it is there with its recorded size, for a caller that hands on a reference
        #: whose reader checks it before using it (a record-only ``wait``, the Airflow provider's
        #: reserved tasks: a hit then costs a stat, not a read of the payload).
        self.unread_check = unread_check
        self._lock = threading.Lock()
        self._loading: weakref.WeakValueDictionary[str, _Loading] = weakref.WeakValueDictionary()
        #: Everything this store's collections removed so far (``dibs prune`` reports the difference).
        self.freed = Freed()

    @property
    def record_store(self) -> Store:
        return self.records.record_store

    @property
    def view_loads(self) -> bool:
        return self.load or self.records.view_loads

    @property
    def url(self) -> str:
        return self.records.url

    def __repr__(self) -> str:
        return f"ReferencingStore({self.records.url!r}, payloads={self.payloads.url!r})"

    # -- reading ------------------------------------------------------------------------------------
    def _referenced(self, key: Key, artifact: ArtifactRecord) -> ReferencedArtifact:
        payload, uri = decode(artifact.payload, f"artifact of {key}")
        return ReferencedArtifact.of(artifact, artifact.payload, payload, uri=uri, source=self.payloads)

    def _load(self, key: Key, referenced: ReferencedArtifact) -> tuple[bytes, _Loading]:
        """The payload's bytes, checked, read once however many threads of the process ask at the same
        time (the watch hub for its waiters, a waiter's own ask): one copy in memory, not one each."""
        digest = referenced.reference.sha256
        with self._lock:
            loading = self._loading.get(digest)
            if loading is None:
                loading = self._loading[digest] = _Loading()
        with loading.lock:
            if loading.data is None:
                loading.data = referenced.verified_payload(key)
            return loading.data, loading

    def _miss(self, key: Key, error: Exception) -> None:
        log.warning("%s: its artifact is treated as missing, and the key computes again: %s", key, error)

    def _checked(self, state: KeyState, *, load: bool = False) -> KeyState:
        """``state`` with its reference resolved, or without its artifact if that one cannot be served;
        with ``load``, a finished key's payload is read (and checked) now, for the waiters to take."""
        artifact = state.artifact
        if artifact is None or artifact.serializer != REFERENCE:
            return state
        try:
            referenced = self._referenced(state.key, artifact)
        except ArtifactCorrupted as exc:
            self._miss(state.key, exc)
            return dataclasses.replace(state, artifact=None)
        if state.live_lease is None and load and self.load:
            try:
                loaded, keep = self._load(state.key, referenced)
            except ArtifactCorrupted as exc:
                self._miss(state.key, exc)
                return dataclasses.replace(state, artifact=None)
            return dataclasses.replace(
                state, artifact=dataclasses.replace(referenced, loaded=loaded, keep=keep)
            )
        if state.live_lease is None:  # a finished key: a waiter is about to take it
            try:
                # Read for the waiters (load): an unread store checks it as it hands hits out; a look
                # (status, a live line's poll) only asks whether it is there whole.
                taken = load and not self.load
                referenced = self._unread(state.key, referenced) if taken else self._whole(referenced)
            except PayloadUnavailable as exc:
                self._miss(state.key, exc)
                return dataclasses.replace(state, artifact=None)
        return dataclasses.replace(state, artifact=referenced)

    def _unread(self, key: Key, referenced: ReferencedArtifact) -> ReferencedArtifact:
        """A hit handed out unread, checked as :attr:`unread_check` says."""
        if self.unread_check == "size":
            return self._whole(referenced)  # its reader checks the digest before using it
        return dataclasses.replace(referenced, spooled=referenced.verified_spool(key))

    def _whole(self, referenced: ReferencedArtifact) -> ReferencedArtifact:
        """``referenced``, once the payload store says it is there with its recorded size;
        :class:`PayloadUnavailable` otherwise."""
        found = self.payloads.stat(referenced.reference.sha256)
        if found is None or found.size != referenced.size:
            why = "is missing" if found is None else f"has {found.size:,} bytes, {referenced.size:,} recorded"
            raise PayloadUnavailable(f"payload {referenced.uri} {why}")
        return referenced

    def read(self, key: Key) -> KeyState:
        return self._checked(self.records.read(key))

    def read_many(self, keys: Sequence[Key]) -> builtins.list[KeyState]:
        return self.view_many(self.records.read_many(keys))

    def view_many(self, states: Sequence[KeyState]) -> builtins.list[KeyState]:
        # The watch hub's read for this store's waiters: one load of a finished key's payload serves
        # every waiter of the process (an unread store only checks it is there whole, opening nothing).
        return [self._checked(state, load=True) for state in self.records.view_many(states)]

    def list(self, namespace: str | None = None) -> Iterator[KeyState]:
        return self.records.list(namespace)  # listings carry no payloads: references stay as they are

    # The reads a person makes: records as listed, references as they are (no payload is read).
    def page(self, query: pages.Query) -> pages.Page:
        return self.records.read_page(query)

    def latest(self, namespace: str | None, kind: pages.Kind, *, limit: int) -> builtins.list[KeyState]:
        return self.records.latest(namespace, kind, limit=limit)

    def leases(self, namespace: str | None, *, expired: bool, limit: int) -> builtins.list[KeyState]:
        return self.records.leases(namespace, expired=expired, limit=limit)

    def count_states(self, namespace: str | None, *, up_to: int = pages.COUNT_CAP) -> dict[str, int]:
        return self.records.count_states(namespace, up_to=up_to)

    @property
    def scans(self) -> bool:  # type: ignore[override]  # the record store's, whatever it is
        return self.records.scans

    def overview(
        self, namespace: str | None, *, leases: int, recent: int, up_to: int = pages.COUNT_CAP
    ) -> pages.Overview:
        return self.records.overview(namespace, leases=leases, recent=recent, up_to=up_to)

    def acquire(self, key: Key, request: AcquireRequest) -> StoreOutcome:
        outcome = self.records.acquire(key, request)
        for _ in range(_MAX_MISSES):
            if not isinstance(outcome, Present) or outcome.artifact.serializer != REFERENCE:
                return outcome
            artifact = outcome.artifact
            try:
                referenced = self._referenced(key, artifact)
                if not self.load:
                    # Streamed out later: checked now, so that a damaged payload is a miss that
                    # computes again, never bytes printed and then refused.
                    return Present(self._unread(key, referenced))
                loaded, keep = self._load(key, referenced)
                return Present(dataclasses.replace(referenced, loaded=loaded, keep=keep))
            except ArtifactCorrupted as exc:
                self._miss(key, exc)
            # Only a newer artifact counts now: the lease is granted beside this one, which the new
            # artifact replaces (as a refresh does).
            request = dataclasses.replace(request, min_fence=max(request.min_fence or 0, artifact.fence + 1))
            outcome = self.records.acquire(key, request)
        return outcome

    # -- writing ------------------------------------------------------------------------------------
    def offload(self, serializer: str, payload: bytes) -> Payload | None:
        """``payload`` written to the payload store when it is larger than the inline limit (``None``
        when it stays in the record): the lease's hand-off, in one pass over the bytes, since its
        SHA-256 is computed as it is written. The lease then completes with the reference
        (serializer :data:`~dibs.payloads.references.REFERENCE`), whose checksum is the payload's:
        a complete whose reply was lost is recognised by it, and sent again without writing again."""
        if len(payload) <= self.inline_limit:
            return None
        return self.payloads.put(payload, serializer)

    def loaded(self, record: ArtifactRecord, data: bytes) -> ArtifactRecord:
        """``record`` (a published reference) carrying ``data``, its payload's bytes, as read already."""
        if isinstance(record, ReferencedArtifact) and record.loaded is None:
            return dataclasses.replace(record, loaded=data)
        return record

    def complete(self, key: Key, token: LeaseToken, artifact: NewArtifact) -> ArtifactRecord:
        payload, checksum = artifact.payload, artifact.checksum
        if artifact.serializer == REFERENCE:  # the payload is in the payload store already (streamed)
            stored, _ = decode(payload, f"artifact of {key}")
            return self._publish(key, token, stored, None, artifact.compute_seconds)
        if len(payload) <= self.inline_limit:
            return self.records.complete(key, token, artifact)
        if not checksum.startswith("sha256:"):
            raise ArtifactCorrupted(
                f"artifact of {key}: not a checksum dibs writes: {checksum!r}", key=str(key)
            )
        # The lease computed the checksum from these very bytes: the writer does not hash them again.
        stored = self.payloads.put(payload, artifact.serializer, sha256=checksum.removeprefix("sha256:"))
        return self._publish(key, token, stored, payload, artifact.compute_seconds)

    def _publish(
        self,
        key: Key,
        token: LeaseToken,
        stored: Payload,
        data: bytes | None,
        compute_seconds: float | None = None,
    ) -> ArtifactRecord:
        uri = self.payloads.uri(stored.sha256)
        document = encode(stored, uri)
        reference = NewArtifact(REFERENCE, document, stored.checksum, compute_seconds)
        try:
            record = self.records.complete(key, token, reference)
        except LeaseLost:
            self.collect([stored.sha256])  # never published: removed unless someone else needs it
            raise
        finally:
            self.payloads.settle()  # the writer's leftovers go now, not during the records' commit
        return ReferencedArtifact.of(record, document, stored, uri=uri, source=self.payloads, loaded=data)

    def heartbeat(self, key: Key, token: LeaseToken, ttl: float) -> LeaseRecord:
        return self.records.heartbeat(key, token, ttl)

    def release(self, key: Key, token: LeaseToken, error: str | None = None, *, counted: bool = True) -> None:
        self.records.release(key, token, error, counted=counted)

    def force_release(self, key: Key) -> bool:
        return self.records.force_release(key)

    # -- removal ------------------------------------------------------------------------------------
    def collect(self, candidates: Sequence[str] | None = None) -> Freed:
        """Remove the payloads no record refers to (only ``candidates``, when given), see :mod:`.collect`."""
        freed = collect(self.records, self.payloads, grace=self.grace, candidates=candidates)
        with self._lock:
            self.freed = self.freed + freed
        return freed

    def _collect_after(self, done: str, candidates: Sequence[str] | None = None) -> None:
        """The collection that follows a removal of records (``done`` says what it did): its failure
        says that the records' part is done, and that a later collection takes what is left."""
        try:
            self.collect(candidates)
        except StoreUnavailable as exc:
            raise StoreUnavailable(
                f"{done}, but removing the payloads no record refers to failed: {exc}; "
                "a later prune or reap removes them",
                payloads=self.payloads.url,
            ) from exc

    def forget(self, key: Key) -> bool:
        before = self.records.read(key).artifact
        forgotten = self.records.forget(key)
        digest = None if before is None else referenced_digest(before.serializer, before.checksum)
        if forgotten and digest is not None:
            self._collect_after(f"forgot {key}", [digest])
        return forgotten

    def discard(self, key: Key) -> bool:
        return self.records.discard(key)  # only records that hold nothing: no payload to remove

    def reap(self, namespace: str | None = None, *, progress: Progress | None = None) -> int:
        reaped = self.records.reap(namespace, progress=progress) if progress else self.records.reap(namespace)
        self._collect_after(f"reaped {reaped} record(s)")  # a writer killed mid-upload leaves a payload
        return reaped

    def prune(self, namespace: str | None, older_than: float, *, progress: Progress | None = None) -> int:
        records = self.records
        pruned = (
            records.prune(namespace, older_than, progress=progress)
            if progress
            else records.prune(namespace, older_than)
        )
        self._collect_after(f"pruned {pruned} record(s)")
        return pruned

    def change_feed(self) -> ChangeFeed | None:
        return self.records.change_feed()

    def close(self) -> None:
        """Nothing of its own to release: the watch hub its waiters use is its record store's (shared by
        every store wrapped around those records, stopped when the record store closes), and the record
        and payload stores belong to whoever opened them."""
        super().close()

"""The Azure Blob store: one JSON record blob per key, replaced by an ETag compare-and-swap, and each
artifact's payload in a blob of its own. The layout and the rules are in :mod:`dibs.stores.azure`."""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import email.utils
import functools
import hashlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any, ClassVar, TypeVar

from azure.core import MatchConditions
from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
)
from azure.storage.blob import BlobServiceClient, ContainerClient, ContentSettings

from dibs.errors import ConfigurationError, CorruptRecord, LeaseLost, ReservationError, StoreUnavailable
from dibs.keys import Key
from dibs.records import ArtifactRecord, KeyState, LeaseToken, Present, StoreOutcome
from dibs.stores import codec, decoder, pages, redact_url, transitions
from dibs.stores.azure import blobs, copies, index, reads
from dibs.stores.azure.clock import Exchange, PagedExchanges, ServiceClock
from dibs.stores.azure.connection import connect, describe, endpoint_of, no_credential
from dibs.stores.azure.copies import Echo
from dibs.stores.azure.feed import EtagFeed
from dibs.stores.azure.indexed import IndexedReads
from dibs.stores.azure.reads import Entry
from dibs.stores.azure.settings import (
    CONNECTION_STRING_ENV,
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_RETRIES,
    DEFAULT_TIMEOUT,
    parse_url,
)
from dibs.stores.azure.summary import metadata_of, summary_of
from dibs.stores.base import Listing, Loaded, Progress, RecordStore, Skipped, skip
from dibs.stores.feeds import ChangeFeed
from dibs.stores.requests import AcquireRequest, NewArtifact

__all__ = ["ARTIFACT_FORMAT", "MAX_RECORD_BYTES", "AzureBlobStore"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
X = TypeVar("X")

#: A record is a few hundred bytes; anything bigger in ``records/`` is not ours and is not downloaded.
MAX_RECORD_BYTES = decoder.MAX_RECORD_BYTES
#: Reads of one record before a missing service time is an error (see AzureBlobStore._timed_read).
_READS_FOR_A_TIME = 3

ARTIFACT_FORMAT = "dibs.artifact/1"


#: The newest done keys of each namespace a rebuild of the index gives their record copies
#: (:mod:`.copies`): a Reservations page's worth. Older ones are downloaded when shown.
REBUILD_COPIES = 500


class AzureBlobStore(RecordStore):
    """Reservations in an Azure Blob Storage container. See :mod:`dibs.stores.azure` for layout and rules."""

    scheme = "azure"
    clock = "the Blob service's clock (response Date header)"
    # The admin reads list the records' metadata (one request per 5,000 keys) and download only the
    # records they return: five such reads cost less than one listing that downloads every record.
    scans = False

    #: How often a read retries when a payload vanished under it (a concurrent ``forget``).
    payload_read_attempts: ClassVar[int] = 3

    def __init__(
        self,
        service: BlobServiceClient,
        container: str,
        *,
        prefix: str = "",
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        credential_source: str = "the given client",
        url_options: Mapping[str, str] | None = None,
        secrets: tuple[str, ...] = (),
        owned_credential: Any = None,
    ) -> None:
        """Use ``container`` of an existing client (``from_url`` is the usual way in).

        ``prefix`` must be empty or end with ``/``; ``secrets`` are values to keep out of error messages.
        """
        if prefix and not prefix.endswith("/"):
            raise ConfigurationError(f"prefix {prefix!r} must end with '/'")
        self._service = service
        self._container: ContainerClient = service.get_container_client(container)
        self.container = container
        self.prefix = prefix
        self.credential_source = credential_source
        self._max_concurrency = max_concurrency
        self._url_options = dict(url_options or {})
        self._secrets = secrets
        self._owned_credential = owned_credential
        self._endpoint = endpoint_of(service)
        self._clock = ServiceClock()
        self._index = index.Layout(prefix)
        self._index_ready = False  # index/ready was seen (or written by this store's rebuild)
        self._index_failed = False  # this process could not build the index: read by listing
        self._indexed_reads = IndexedReads(self)
        self._closed = False

    @classmethod
    def from_url(cls, url: str, **client_options: Any) -> AzureBlobStore:
        """Open the store an ``azure://`` URL names; ``client_options`` go to the SDK client as they are
        (a custom ``transport``, ``proxies``, ...). No request is sent until the first operation."""
        settings = parse_url(url)
        connection = connect(settings, client_options=client_options)
        options = {}
        if settings.timeout != DEFAULT_TIMEOUT:
            options["timeout"] = f"{settings.timeout:g}"
        if settings.retries != DEFAULT_RETRIES:
            options["retries"] = str(settings.retries)
        if settings.max_concurrency != DEFAULT_MAX_CONCURRENCY:
            options["max_concurrency"] = str(settings.max_concurrency)
        return cls(
            connection.service,
            settings.container,
            prefix=settings.prefix,
            max_concurrency=settings.max_concurrency,
            credential_source=connection.source,
            url_options=options,
            secrets=settings.secrets,
            owned_credential=connection.owned_credential,
        )

    @property
    def url(self) -> str:
        """Container, prefix, endpoint and options; never a credential (reopening needs one from the
        environment or DefaultAzureCredential)."""
        path = f"/{self.prefix.rstrip('/')}" if self.prefix else ""
        query = "&".join(
            f"{name}={value}" for name, value in {"account_url": self._endpoint, **self._url_options}.items()
        )
        return redact_url(f"azure://{self.container}{path}?{query}")  # the one way a URL is shown

    # Names --------------------------------------------------------------------------------------

    def record_name(self, key: Key) -> str:
        """The blob holding ``key``'s record (for operators inspecting the container)."""
        return f"{self.prefix}records/{key.digest}"

    def artifact_name(self, key: Key, artifact: ArtifactRecord) -> str:
        """The blob holding ``artifact``'s payload."""
        return self._artifact_name(key, artifact.fence, artifact.checksum)

    def _artifact_name(self, key: Key, fence: int, checksum: str) -> str:
        # The checksum is caller-supplied text: only a digest of it becomes part of a name.
        tag = hashlib.sha256(checksum.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        return f"{self.prefix}artifacts/{key.digest}-{fence}-{tag}"

    def _where(self, name: str) -> str:
        return f"azure://{self.container}/{name}"

    # Errors -------------------------------------------------------------------------------------

    def _error(self, exc: AzureError, action: str, key: Key | None = None) -> ReservationError:
        what = f" {key}" if key is not None else ""
        fields = {"key": str(key)} if key is not None else {}
        if no_credential(exc):
            return ConfigurationError(
                f"no Azure credential found for {self.url} ({self.credential_source} found none): give "
                f"connection_string=, account_key= or sas_token= in the URL, set ${CONNECTION_STRING_ENV}, "
                "or sign in (managed identity, workload identity, 'az login')",
                **fields,
            )
        hint = ""
        if isinstance(exc, ClientAuthenticationError):
            hint = f"; check the {self.credential_source} and its permissions on container {self.container!r}"
        return StoreUnavailable(
            f"Azure Blob store {self.url} could not {action}{what}: {describe(exc, self._secrets)}{hint}",
            **fields,
        )

    def _call(self, action: str, key: Key | None, fn: Callable[[], T]) -> T:
        """Run one SDK call, translating its errors (secrets scrubbed, the SDK's exception not chained,
        because its text may quote request URLs that carry a SAS)."""
        if self._closed:
            raise StoreUnavailable(f"Azure Blob store {self.url} is closed")
        try:
            return fn()
        except AzureError as exc:
            raise self._error(exc, action, key) from None

    # Reading ------------------------------------------------------------------------------------

    def _now(self, exchange: Exchange, action: str, key: Key | str) -> float:
        parsed = None
        if exchange.date is not None:
            try:
                parsed = email.utils.parsedate_to_datetime(exchange.date).timestamp()
            except (TypeError, ValueError):
                parsed = None
        if parsed is None or exchange.received is None:
            # Never fall back to this machine's clock: that would break the Time rule silently.
            raise StoreUnavailable(
                f"Azure Blob store {self.url} answered {action} {key} without a usable Date header "
                f"({exchange.date!r}); dibs judges expiry by the service's clock and needs it",
                key=str(key),
            )
        sent = exchange.sent if exchange.sent is not None else exchange.received
        return self._clock.observe(parsed, sent, exchange.received)

    def _read_raw(self, key: Key) -> tuple[bytes | None, str | None, float]:
        """The record blob's bytes (``None`` when absent), its ETag, and the service's time of the read."""
        name = self.record_name(key)

        def download(exchange: Exchange) -> tuple[bytes | None, str | None]:
            blob = self._container.get_blob_client(name)
            try:
                downloader = blob.download_blob(
                    raw_request_hook=exchange.on_request, raw_response_hook=exchange.on_response
                )
            except ResourceNotFoundError:  # no such blob, or no container yet: the key is free
                return None, None
            size = downloader.properties.size
            if size > MAX_RECORD_BYTES:
                why = f"it is {size} bytes, more than {MAX_RECORD_BYTES}"
                raise decoder.corrupt(key, self._where(name), why)
            return downloader.readall(), downloader.properties.etag

        (data, etag), exchange = self._timed_read("read the record of", key, download)
        return data, etag, self._now(exchange, "a read of", key)

    def _timed_read(self, action: str, key: Key | None, read: Callable[[Exchange], T]) -> tuple[T, Exchange]:
        """Run ``read`` (one SDK call, hooked to ``exchange``) and return what it read with its exchange.

        When the SDK retries a request that got no response at all (a reset connection), it drops the
        per-call hooks: azure-storage-blob keeps them for a retry only once a response has arrived.
        Such a read succeeds but leaves no service time behind, so it is read again (a read is safe to
        repeat) rather than reported as a service without a Date header.
        """
        for _ in range(_READS_FOR_A_TIME):
            exchange = Exchange()
            result = self._call(action, key, functools.partial(read, exchange))
            if exchange.received is not None:
                break
            logger.info("%s: the SDK retried a read without its hooks; reading it again", self.url)
        return result, exchange

    def _decode(self, key: Key, data: bytes | None, now: float) -> KeyState:
        if data is None:
            return transitions.empty(key, now)
        return codec.decode(data, key, now, where=self._where(self.record_name(key)))

    def _load(self, key: Key) -> tuple[KeyState, object]:
        data, etag, now = self._read_raw(key)
        return self._decode(key, data, now), etag

    # Writing ------------------------------------------------------------------------------------

    def _ensure_container(self) -> None:
        """Create the container (see :func:`~dibs.stores.azure.blobs.create_container`). A container
        this call created holds no record yet, so its index is complete from the start: ``index/ready``
        is written with it, and no read ever has to build it (one someone else created may hold what
        an older dibs wrote: the first read finds out)."""
        create = functools.partial(blobs.create_container, self._container)
        if not self._call(f"create container {self.container!r}", None, create):
            return
        marker = self._container.get_blob_client(self._index.ready)

        def mark() -> None:
            with contextlib.suppress(ResourceNotFoundError):  # gone again: the write that follows says so
                marker.upload_blob(index.VERSION.encode(), overwrite=True)

        self._call("write the index marker in", None, mark)

    def _swap(self, key: Key, version: object, new: KeyState, old: KeyState) -> bool | Loaded:
        """Swap the record, keeping the index true around it (the rules are in :mod:`.index`): the
        index blobs the new record needs are written first, those the old one needed after; and the
        copies of :mod:`.copies`, removed from the old record's ``made`` blob before, set on the new
        one's after."""
        change = index.changes(self._index, old, new)
        copy = copies.copy_metadata(new)
        copy_name = None if copy is None else self._made_artifact(new)
        uncopied = self._made_artifact(old) if copies.may_have_copy(old) else None
        if uncopied is None and copy_name is not None and copy_name not in change.made_before:
            uncopied = copy_name  # its copy was removed when the lease was taken: this learns its ETag
        before: dict[str, Callable[[], str | None]] = {}
        if change.ends_lease:
            before["live"] = functools.partial(self._live_etag, key)
        if change.takes_lease:
            before[self._index.live(key)] = functools.partial(self._put_index, key, self._index.live(key))
        for name in change.made_before:
            before[name] = functools.partial(self._put_index, key, name)
        if uncopied is not None:
            before[uncopied] = functools.partial(self._uncopy, key, uncopied)
        # Independent requests, sent together: a completion's ETag read and its artifact's index blob
        # cost one round trip, not two.
        answers = dict(
            zip(before, self._concurrently(lambda call: call(), builtins.list(before.values())), strict=True)
        )
        swapped: bool | Loaded | Echo = self._write(key, version, new)
        # Landed. A copy is set only on this writer's own confirmed write: bytes found equal after a
        # refusal may be another writer's, who made the same change (two reapers, a release and a
        # force-release), and a third writer may have removed the copy since that one wrote.
        confirmed = swapped is True
        if swapped is Echo.SAME:
            swapped = True
        if swapped is not True:
            if isinstance(swapped, tuple):  # lost to another write: drop what only this one needed
                needed = index.made_names(self._index, swapped[0])
                for name in change.made_before:
                    if name not in needed:
                        self._drop_index(key, name)
            return swapped
        after: builtins.list[Callable[[], object]] = []
        if (ended_marker := answers.get("live")) is not None:
            after.append(functools.partial(self._drop_index, key, self._index.live(key), ended_marker))
        if (
            confirmed
            and copy is not None
            and copy_name is not None
            and (seen := answers.get(copy_name)) is not None
        ):
            after.append(functools.partial(self._copy, key, copy_name, copy, seen))
        self._concurrently(lambda call: call(), after)  # neither raises: one round trip for both
        for name in change.stale_after:
            self._drop_index(key, name)
        if old.artifact is not None:
            kept = new.artifact
            if kept is None or self.artifact_name(key, kept) != self.artifact_name(key, old.artifact):
                # The record no longer names this payload. Records are never deleted (removal writes
                # a tombstone that keeps the fence), so fences only grow and no later record can name
                # it again: deleting it cannot hurt anyone, however late this call runs.
                self._delete_quietly(key, self.artifact_name(key, old.artifact))
        return swapped

    def _made_artifact(self, state: KeyState) -> str:
        assert state.artifact is not None
        return self._index.made("artifact", state.key, state.artifact.created_at)

    def _write(self, key: Key, version: object, new: KeyState) -> bool | Loaded | Echo:
        name = self.record_name(key)
        data = codec.encode(new)
        blob = self._container.get_blob_client(name)
        if version is None:
            condition: dict[str, Any] = {"overwrite": False}  # If-None-Match: *
        else:
            condition = {"overwrite": True, "etag": version, "match_condition": MatchConditions.IfNotModified}
        metadata = metadata_of(new)  # the summary the admin reads answer from (see .summary)

        def upload(create_container: bool = True) -> bool:
            try:
                blob.upload_blob(
                    data,
                    metadata=metadata,
                    content_settings=ContentSettings(content_type="application/json"),
                    **condition,
                )
            except ResourceNotFoundError as exc:
                if not blobs.is_missing_container(exc):
                    raise
                if version is not None:
                    return False  # the record (and its container) went away: read again
                if not create_container:
                    raise  # created it, and it is gone again: report it rather than loop
                self._ensure_container()
                return upload(create_container=False)
            except HttpResponseError as exc:
                if blobs.is_conflict(exc):
                    return False
                raise
            return True

        if self._call("write the record of", key, upload):
            return True
        # Someone else's write landed first, or our own did and its response was lost before the SDK
        # retried it. Reading the record now tells the two apart, and the read is handed back to
        # RecordStore._update for its next attempt, so settling this costs no extra request.
        current, etag, now = self._read_raw(key)
        if current == data:
            return Echo.SAME  # the record holds exactly what we meant to write: landed, unconfirmed
        return self._decode(key, current, now), etag

    # The index (see .index) ---------------------------------------------------------------------

    def _put_index(self, key: Key | None, name: str, *, overwrite: bool = True) -> str | None:
        """Write the (empty) index blob ``name``: overwritten, which gives a ``live`` blob a new ETag;
        or create-only, when one already there will do (the rebuild). Returns the written blob's
        ETag (``None``: create-only found one)."""
        blob = self._container.get_blob_client(name)

        def put() -> str | None:
            try:
                return str(blob.upload_blob(b"", overwrite=overwrite)["etag"])
            except ResourceExistsError:
                if overwrite:
                    raise
                return None

        return self._call(
            "write the index of", key, lambda: blobs.with_container(put, self._ensure_container)
        )

    def _uncopy(self, key: Key, name: str) -> str | None:
        """Remove the record copy from the ``made`` blob ``name`` (see :mod:`.copies`), before a write
        that changes the record it may copy; returns the blob's new ETag, ``None`` when there is no
        such blob (an older dibs's record, indexed by nobody yet). Raised like any write before the
        record's: the record is then left as it was."""
        blob = self._container.get_blob_client(name)

        def clear() -> str | None:
            try:
                return str(blob.set_blob_metadata({})["etag"])
            except ResourceNotFoundError:
                return None

        return self._call("write the index of", key, clear)

    def _copy_again(self, key: Key) -> bool:
        """Give ``key``'s ``made`` blob the copy of its record outside a write of its own (a rebuild):
        the record is read, its blob's copy removed (its new ETag kept), the record rewritten
        unchanged (an ETag swap, as the sweep makes: a writer that read it before now fails its own
        swap and reads again), then the copy set ``If-Match`` the kept ETag (refused when a writer
        that read the record since removed the copy first). Returns whether the copy was set. The
        rewrite keeps the record's content; its metadata summary is written anew (:mod:`.summary`),
        as every write of it does. A service error is raised (the rebuild stops copying)."""
        state, version = self._load(key)
        metadata = copies.copy_metadata(state)
        if metadata is None or version is None:
            return False  # not done (any more), or too long to copy
        name = self._made_artifact(state)
        etag = self._uncopy(key, name)
        if etag is None or self._write(key, version, state) is not True:
            return False  # no blob to copy onto, or the record changed since it was read
        return self._copy(key, name, metadata, etag)

    def _copy(self, key: Key, name: str, metadata: dict[str, str], etag: str) -> bool:
        """Set a copy of the record just written on its ``made`` blob, ``If-Match`` the ETag this writer
        saw before its write (refused when another writer removed the copy since: the record changed).
        A failure is logged, never raised: the write has landed, and a blob without a copy only costs
        its readers a download. Returns whether the copy was set."""
        blob = self._container.get_blob_client(name)

        def put() -> bool:
            try:
                blob.set_blob_metadata(metadata, etag=etag, match_condition=MatchConditions.IfNotModified)
            except ResourceNotFoundError:
                return False  # removed since: the artifact was replaced or forgotten
            except HttpResponseError as exc:
                if not blobs.is_conflict(exc):  # 412: another writer changed the record since
                    raise
                return False
            return True

        try:
            return self._call("write the index of", key, put)
        except ReservationError as exc:
            logger.info(
                "could not copy the record of %s onto its index blob (%s); it is read instead", key, exc
            )
            return False

    def _live_etag(self, key: Key) -> str | None:
        """The ETag of ``key``'s ``live`` blob (``None``: there is none), read before a write that ends
        its lease: the delete after it is made conditional on it."""
        blob = self._container.get_blob_client(self._index.live(key))

        def head() -> str | None:
            try:
                return str(blob.get_blob_properties().etag)
            except ResourceNotFoundError:
                return None

        return self._call("read the index of", key, head)

    def _drop_index(self, key: Key | None, name: str, etag: str | None = None) -> None:
        """Delete an index blob a landed write made stale (``If-Match`` ``etag`` when given: refused
        when a new holder rewrote it). A failure is logged, never raised: the write it follows has
        landed, and an index blob left behind only costs its readers a download."""

        def delete() -> None:
            condition: dict[str, Any] = {}
            if etag is not None:
                condition = {"etag": etag, "match_condition": MatchConditions.IfNotModified}
            try:
                self._container.delete_blob(name, **condition)
            except ResourceNotFoundError:
                pass
            except HttpResponseError as exc:
                if not blobs.is_conflict(exc):  # 412: the key has a new holder, whose blob it is now
                    raise

        try:
            self._call("remove an index blob of", key, delete)
        except ReservationError as exc:
            logger.warning("could not delete index blob %s (%s); it is harmless", self._where(name), exc)

    def _indexed(self) -> bool:
        """Whether the reads may go through the index: ``index/ready`` exists, or this call rebuilt the
        index (once: a store written before the index, or whose marker was removed)."""
        if self._index_marked():
            return True
        if self._index_failed:
            return False
        logger.info("Azure Blob store %s: building the index of its records (once)", self.url)
        try:
            placed = self.rebuild_index()
        except ReservationError as exc:
            # A reader that may not write (a read-and-list SAS, a Reader role) still reads, by the
            # listing: this process does not try again.
            self._index_failed = True
            logger.warning(
                "Azure Blob store %s: could not build the index of its records (%s); 'dibs top' and "
                "the other reads list every record blob until a process that may write builds it",
                self.url,
                exc,
            )
            return False
        logger.info("Azure Blob store %s: indexed %d records", self.url, placed)
        return self._index_ready

    def _index_marked(self) -> bool:
        """Whether ``index/ready`` exists (asked until it does), never building the index: what the
        change feed asks from its poller, which must not start a rebuild."""
        if self._index_ready:
            return True
        blob = self._container.get_blob_client(self._index.ready)

        def ready() -> bool:
            try:
                return blob.download_blob().readall() == index.VERSION.encode()
            except ResourceNotFoundError:
                return False

        if self._call("read the index marker in", None, ready):
            self._index_ready = True
        return self._index_ready

    def rebuild_index(self) -> int:
        """Write the index blobs of every record that needs them, then ``index/ready``; returns how
        many records were read. For an operator after processes of an older dibs (which write records
        but no index blobs) wrote to this store; the first read that finds no ``index/ready`` runs it.
        A container that does not exist yet holds nothing to index, and is not created. The index
        blobs already there are listed first and not written again. Once the marker is written, the
        newest :data:`REBUILD_COPIES` done keys of each namespace are given their record copies
        (:meth:`_copy_again`: four requests each), so the Reservations page reads them from one
        listing at once; the first error ends that (logged: the index is complete without them)."""
        entries, _ = self._entries(None)
        there = {blob.name for page in self._indexed_reads.listing(self._index.root, 5000) for blob in page}
        wanted: builtins.list[tuple[Key, str, bool]] = []
        for entry in entries:
            key = entry.state.key
            if entry.state.lease is not None:  # create-only: a holder's own blob keeps its ETag
                wanted.append((key, self._index.live(key), False))
            wanted.extend((key, name, True) for name in sorted(index.made_names(self._index, entry.state)))
        missing = [item for item in wanted if item[1] not in there]
        self._concurrently(lambda item: self._put_index(item[0], item[1], overwrite=item[2]), missing)
        blob = self._container.get_blob_client(self._index.ready)

        def mark() -> bool:
            try:
                blob.upload_blob(index.VERSION.encode(), overwrite=True)
            except ResourceNotFoundError as exc:
                if blobs.is_missing_container(exc):
                    return False
                raise
            return True

        self._index_ready = self._call("write the index marker in", None, mark)
        if self._index_ready:  # the index is complete without them: copies only spare downloads
            try:
                self._concurrently(self._copy_again, _newest_done(entries, REBUILD_COPIES))
            except ReservationError as exc:
                logger.warning(
                    "Azure Blob store %s: could not copy the newest records onto their index blobs "
                    "(%s); the Reservations page downloads them until they are completed again",
                    self.url,
                    exc,
                )
        return len(entries)

    def reap(self, namespace: str | None = None, *, progress: Progress | None = None) -> int:
        """As :meth:`Store.reap <dibs.stores.base.Store.reap>`, then the ``live`` blobs left behind are
        swept (:meth:`.indexed.IndexedReads.sweep`): the index names the held and expired leases, and
        little else."""
        reaped = super().reap(namespace, progress=progress)
        try:
            self._indexed_reads.sweep(namespace)
        except ReservationError as exc:  # the reaping has landed: report that, and log this
            logger.warning("Azure Blob store %s: could not sweep the index (%s); reap again", self.url, exc)
        return reaped

    # Artifacts ----------------------------------------------------------------------------------

    def _upload_artifact(self, key: Key, fence: int, payload: bytes, checksum: str) -> tuple[str, bool]:
        """Store the payload create-only; ``(name, True)`` if this call created the blob.

        ``False`` means the same key, fence and checksum: the same holder (or its hand-off partner)
        already stored these bytes, perhaps in an attempt whose response was lost.
        """
        name = self._artifact_name(key, fence, checksum)
        metadata = {
            "dibs_format": ARTIFACT_FORMAT,
            "dibs_key": key.digest,
            "dibs_fence": str(fence),
            "dibs_size": str(len(payload)),
        }
        if checksum.isascii() and checksum.isprintable():
            metadata["dibs_checksum"] = checksum
        blob = self._container.get_blob_client(name)

        def upload() -> bool:
            return blobs.put_new(blob, payload, metadata, max_concurrency=self._max_concurrency)

        return name, self._call(
            "store the artifact of", key, lambda: blobs.with_container(upload, self._ensure_container)
        )

    def _fetch_payload(self, key: Key, artifact: ArtifactRecord) -> bytes | None:
        """The payload blob's bytes, or ``None`` if it does not exist."""
        blob = self._container.get_blob_client(self.artifact_name(key, artifact))
        return self._call(
            "read the artifact of", key, lambda: blobs.read_whole(blob, max_concurrency=self._max_concurrency)
        )

    def _with_payload(
        self,
        key: Key,
        fetch_state: Callable[[], T],
        artifact_of: Callable[[T], ArtifactRecord | None],
        attach: Callable[[T, ArtifactRecord], T],
    ) -> T:
        """Run ``fetch_state`` and attach its artifact's payload; retry when the payload vanished.

        The payload blob is deleted only after ``forget`` changed the record, so a missing payload means
        either a concurrent forget (the next read no longer shows the artifact) or a lost blob (the
        record still names it: then the payload is served empty and fails its integrity check).
        """
        for _ in range(self.payload_read_attempts):
            result = fetch_state()
            artifact = artifact_of(result)
            if artifact is None:
                return result
            payload = self._fetch_payload(key, artifact)
            if payload is not None:
                return attach(result, dataclasses.replace(artifact, payload=payload))
            missing = self.artifact_name(key, artifact)
        logger.warning(
            "the artifact payload of %s is missing (%s); it will fail its integrity check: 'dibs forget' "
            "the key to recompute it",
            key,
            self._where(missing),
        )
        return result

    def read(self, key: Key) -> KeyState:
        return self._with_payload(
            key,
            lambda: self._load(key)[0],
            lambda state: state.artifact,
            lambda state, artifact: dataclasses.replace(state, artifact=artifact),
        )

    def acquire(self, key: Key, request: AcquireRequest) -> StoreOutcome:
        return self._with_payload(
            key,
            lambda: super(AzureBlobStore, self).acquire(key, request),
            lambda outcome: outcome.artifact if isinstance(outcome, Present) else None,
            lambda _outcome, artifact: Present(artifact),
        )

    def complete(self, key: Key, token: LeaseToken, artifact: NewArtifact) -> ArtifactRecord:
        # Check the token before uploading anything: a holder that lost its lease should not push a
        # large payload just to have it refused. The read is reused by the swap below.
        loaded = self._load(key)
        transitions.complete(loaded[0], token, artifact)
        name, created = self._upload_artifact(key, token.fence, artifact.payload, artifact.checksum)
        try:
            return self._update(
                key,
                lambda state: transitions.complete(state, token, artifact),
                loaded=loaded,
            )
        except LeaseLost:
            # Fenced out between the check and the swap: remove our upload, which no record names.
            if created:
                self._delete_quietly(key, name)
            raise

    def _delete_quietly(self, key: Key, name: str) -> None:
        def delete() -> None:
            with contextlib.suppress(ResourceNotFoundError):
                self._container.delete_blob(name)

        try:
            self._call("delete an unused artifact of", key, delete)
        except ReservationError as exc:
            logger.warning(
                "could not delete unused artifact blob %s (%s); it is harmless, remove it by hand",
                self._where(name),
                exc,
            )

    # Listing ------------------------------------------------------------------------------------
    # Every read of many records starts from one listing of ``records/`` with metadata (5,000 blobs a
    # request). A blob's summary (see .summary) says its key and status, so only the records a read
    # shows are downloaded; a blob without one (written by an older dibs) is downloaded as before.

    def list(self, namespace: str | None = None) -> Listing:
        """Every key with a record, sorted by key, artifacts without payloads.

        Costs the listing and a GET of every record it shows (tombstones, known from their summary,
        are not downloaded). Blobs in ``records/`` that are not dibs records are skipped, logged and
        counted (see :class:`~dibs.stores.base.Listing`): one foreign blob must not stop ``dibs ls``
        or the reaper; reading that key directly raises :class:`CorruptRecord`.
        """
        entries, skipped = self._entries(namespace)
        fetch = self._fetcher(skipped)
        fetched = iter(fetch([entry.name for entry in entries if not entry.downloaded]))
        states = [entry.state if entry.downloaded else next(fetched) for entry in entries]
        return Listing((state for state in states if state is not None), skipped)

    def page(self, query: pages.Query) -> pages.Page:
        """As :meth:`Store.page <dibs.stores.base.Store.page>`: the listing, the candidates chosen by
        their summaries (as :meth:`prune` chooses, for a prunable page), then a GET of each record on
        the page (at most its limit), whatever the namespace's size."""
        skipped: builtins.list[Skipped] = []
        fetch = self._fetcher(skipped)
        listed = self._listed_entries(query.namespace, skipped)
        if (
            query.state in ("held", "expired")
            and query.older_than is None
            and self._through_index(query.namespace)
        ):
            namespace = query.namespace
            assert namespace is not None  # _through_index
            listed = functools.partial(self._indexed_reads.live, namespace, fetch)
        found, cursor = reads.page(listed, fetch, query)
        return pages.Page(tuple(found), cursor, len(skipped))

    def latest(self, namespace: str | None, kind: pages.Kind, *, limit: int) -> builtins.list[KeyState]:
        """As :meth:`Store.latest <dibs.stores.base.Store.latest>`: the listing, then ``limit`` GETs."""
        skipped: builtins.list[Skipped] = []
        pages.check_limit(limit)
        pages.made_at(kind)  # refuses a bad kind before any request
        if self._through_index(namespace):
            assert namespace is not None
            return self._indexed_reads.latest(namespace, kind, limit, self._fetcher(skipped))
        return reads.latest(self._listed_entries(namespace, skipped), self._fetcher(skipped), kind, limit)

    def leases(self, namespace: str | None, *, expired: bool, limit: int) -> builtins.list[KeyState]:
        """As :meth:`Store.leases <dibs.stores.base.Store.leases>`: the listing, then ``limit`` GETs.
        Held and expired are judged on the service's clock at the listing page that named the blob."""
        skipped: builtins.list[Skipped] = []
        fetch = self._fetcher(skipped)
        listed = self._listed_entries(namespace, skipped)
        pages.check_limit(limit)
        if self._through_index(namespace):
            assert namespace is not None
            listed = functools.partial(self._indexed_reads.live, namespace, fetch)
        return reads.leases(listed, fetch, expired=expired, limit=limit)

    def count_states(self, namespace: str | None, *, up_to: int = pages.COUNT_CAP) -> dict[str, int]:
        """As :meth:`Store.count_states <dibs.stores.base.Store.count_states>`: the listing alone."""
        return reads.count(self._listed_entries(namespace, []), up_to)

    def overview(
        self, namespace: str | None, *, leases: int, recent: int, up_to: int = pages.COUNT_CAP
    ) -> pages.Overview:
        """As :meth:`Store.overview <dibs.stores.base.Store.overview>` (``dibs top``): its five reads
        from one listing, then a GET of each record shown (once, if two lists show it). The listing is
        the read's cost (every record blob of the container, 5,000 a request): made once, not once a
        read (47 s for ``top`` at 10,000 keys on Azurite with five)."""
        for limit in (leases, recent, up_to):  # refused before the listing, as by the five reads
            pages.check_limit(limit)
        if self._through_index(namespace):
            assert namespace is not None
            return self._indexed_reads.overview(namespace, leases=leases, recent=recent, up_to=up_to)
        skipped: builtins.list[Skipped] = []
        entries = self._listed_entries(namespace, skipped)()
        # One fetcher for the five reads: a key shown twice (held by a refresh, and among the latest
        # artifacts) is downloaded once.
        listed, fetch = (lambda: entries), self._fetcher(skipped)
        return pages.Overview(
            counts=reads.count(listed, up_to),
            held=reads.leases(listed, fetch, expired=False, limit=leases),
            expired=reads.leases(listed, fetch, expired=True, limit=leases),
            artifacts=reads.latest(listed, fetch, "artifact", recent),
            failures=reads.latest(listed, fetch, "failure", recent),
        )

    def _through_index(self, namespace: str | None) -> bool:
        """Whether a read of ``namespace`` goes through the index: it is one namespace (the index is
        kept per namespace; a read of all of them lists the records), and the index is complete."""
        return namespace is not None and self._indexed()

    def _listed_entries(self, namespace: str | None, skipped: builtins.list[Skipped]) -> reads.Listed:
        """The listing of :meth:`_entries`, made when called; what it skips goes into ``skipped``."""

        def listed() -> builtins.list[Entry]:
            entries, unreadable = self._entries(namespace)
            skipped.extend(unreadable)
            return entries

        return listed

    def _removal_candidates(self, namespace: str | None) -> builtins.list[KeyState]:
        """What ``prune`` and ``reap`` consider: the listing's entries, summaries unread. Each one
        chosen is then read and changed by its own compare-and-swap, which decides again."""
        entries, _ = self._entries(namespace)
        return [entry.state for entry in entries]

    def _entries(self, namespace: str | None) -> tuple[builtins.list[Entry], builtins.list[Skipped]]:
        """The namespace's records (every namespace's when ``None``) in key order, tombstones left
        out: one listing, and a GET only of blobs without a summary; the unreadable ones skipped."""
        entries, skipped, _ = self._entries_among(namespace)
        return entries, skipped

    def _entries_among(
        self, namespace: str | None, first: int | None = None
    ) -> tuple[builtins.list[Entry], builtins.list[Skipped], bool]:
        """As :meth:`_entries`, among the ``first`` record blobs of the listing only (one request),
        and whether those were all of them."""
        prefix = f"{self.prefix}records/"
        listing = functools.partial(self._listed, prefix, namespace, first)
        listed, complete = self._call("list the records in", None, listing)
        entries: builtins.list[Entry] = []
        unsummarized: builtins.list[str] = []
        for name, metadata, now in listed:
            summary = None if now is None else summary_of(metadata, name.removeprefix(prefix))
            if summary is None or now is None:
                unsummarized.append(name)
            else:
                entries.append(Entry(name, summary.skeleton(now), downloaded=False))
        skipped: builtins.list[Skipped] = []
        for name, state in zip(unsummarized, self._fetcher(skipped)(unsummarized), strict=True):
            if state is not None:
                entries.append(Entry(name, state, downloaded=True))
        kept = [
            entry
            for entry in entries
            if (namespace is None or entry.state.key.namespace == namespace)
            and not transitions.is_tombstone(entry.state)
        ]
        kept.sort(key=lambda entry: entry.state.key)
        return kept, skipped, complete

    def _listed(
        self, prefix: str, namespace: str | None, first: int | None = None
    ) -> tuple[builtins.list[tuple[str, dict[str, str], float | None]], bool]:
        """Each record blob's name and metadata, with the service's time of the page that listed it
        (``None`` when that page's response left no time, see :meth:`_timed_read`); with ``first``,
        of the first page of that many blobs only. And whether the listing reached its end."""
        hooks = PagedExchanges()
        blobs_listed = self._container.list_blobs(
            name_starts_with=prefix,
            include=["metadata"],
            results_per_page=first,
            raw_request_hook=hooks.on_request,
            raw_response_hook=hooks.on_response,
        )
        found: builtins.list[tuple[str, dict[str, str], float | None]] = []
        now: float | None = None
        listed_pages = blobs_listed.by_page()
        try:
            for page in listed_pages:
                exchange = hooks.take()
                if exchange.received is not None:
                    now = self._now(exchange, "a listing of", self._where(prefix))
                for props in page:
                    metadata = props.metadata or {}
                    if namespace is None or metadata.get("dibs_namespace", namespace) == namespace:
                        found.append((props.name, metadata, now))
                if first is not None:
                    return found, getattr(listed_pages, "continuation_token", None) is None
        except ResourceNotFoundError:  # no container yet: no records
            return [], True
        return found, True

    def _fetcher(self, skipped: builtins.list[Skipped]) -> reads.Fetch:
        """Downloads the named records (``max_concurrency`` at a time); an unreadable one is skipped
        into ``skipped`` and comes back as ``None``, as does one that is gone. A record this fetcher
        downloaded once is not downloaded again (the five reads of one snapshot share a fetcher)."""
        memo: dict[str, KeyState | CorruptRecord | None] = {}

        def one(name: str) -> KeyState | CorruptRecord | None:
            try:
                return self._list_entry(name)
            except CorruptRecord as exc:
                return exc

        def fetch(names: Sequence[str]) -> builtins.list[KeyState | None]:
            missing = list(dict.fromkeys(name for name in names if name not in memo))
            for name, result in zip(missing, self._concurrently(one, missing), strict=True):
                memo[name] = result
                if isinstance(result, CorruptRecord):
                    skip(skipped, self._where(name), result)
            found = (memo[name] for name in names)
            return [None if isinstance(state, CorruptRecord) else state for state in found]

        return fetch

    def _each(self, change: Callable[[KeyState], int], states: Sequence[KeyState]) -> Iterable[int]:
        """``prune`` and ``reap`` change their chosen records ``max_concurrency`` at a time: each change
        is still its own read and ETag compare-and-swap (a payload the record no longer names deleted
        after it), but one key after another spent nearly all its time waiting for the service (21
        keys/s against Azurite)."""
        return self._concurrently(change, states)

    def _concurrently(self, call: Callable[[X], T], items: Sequence[X]) -> builtins.list[T]:
        """``call`` of each item, in order, ``max_concurrency`` at a time (each is a request or a few:
        the time is the service's, so threads overlap it). The SDK has no batch for these: a blob
        batch deletes blobs or sets their tier, it writes none and reads none.

        As soon as one raises, the calls not yet started are cancelled, those running are waited for,
        and its error is raised: a service that stopped answering must not be asked again for every
        item left (waiting for the results in order would learn of an error only when it came up)."""
        if len(items) <= 1 or self._max_concurrency <= 1:
            return [call(item) for item in items]
        pool = ThreadPoolExecutor(min(self._max_concurrency, len(items)))
        try:
            futures = [pool.submit(call, item) for item in items]
            wait(futures, return_when=FIRST_EXCEPTION)
            for future in futures:
                if future.done() and not future.cancelled() and (error := future.exception()) is not None:
                    raise error
            return [future.result() for future in futures]
        finally:
            pool.shutdown(cancel_futures=True)

    def _list_entry(self, name: str) -> KeyState | None:
        where = self._where(name)

        def download(exchange: Exchange) -> bytes | None:
            try:
                downloader = self._container.get_blob_client(name).download_blob(
                    raw_request_hook=exchange.on_request, raw_response_hook=exchange.on_response
                )
            except ResourceNotFoundError:
                return None
            if downloader.properties.size > MAX_RECORD_BYTES:
                return b""
            return downloader.readall()

        data, exchange = self._timed_read(f"read {where}", None, download)
        if data is None:
            return None
        if not data:
            raise decoder.corrupt(None, where, f"it is more than {MAX_RECORD_BYTES} bytes")
        digest = name.removeprefix(f"{self.prefix}records/")
        return codec.decode(data, None, self._now(exchange, "a read of", where), where=where, digest=digest)

    # Lifecycle ----------------------------------------------------------------------------------

    def change_feed(self) -> ChangeFeed:
        return EtagFeed(
            self._container,
            record_name=self.record_name,
            prefix=self.prefix,
            layout=self._index,
            indexed=self._index_marked,
            call=self._call,
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        super().close()
        for closable in (self._container, self._service, self._owned_credential):
            if closable is not None:
                try:
                    closable.close()
                except Exception as exc:  # closing must not mask the caller's own error
                    logger.debug("error while closing %s: %s", type(closable).__name__, exc)


def _newest_done(entries: Iterable[Entry], per_namespace: int) -> builtins.list[Key]:
    """The keys of the ``per_namespace`` newest artifacts of each namespace among the records that
    may carry a copy (:func:`.copies.may_have_copy`), as the listing's summaries tell."""
    by_namespace: dict[str, builtins.list[KeyState]] = {}
    for entry in entries:
        if copies.may_have_copy(entry.state):
            by_namespace.setdefault(entry.state.key.namespace, []).append(entry.state)
    newest: builtins.list[Key] = []
    for states in by_namespace.values():
        states.sort(key=lambda state: -(state.artifact.created_at if state.artifact is not None else 0.0))
        newest.extend(state.key for state in states[:per_namespace])
    return newest

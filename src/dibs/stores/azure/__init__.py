"""Azure Blob Storage: one small JSON record blob per key, replaced by an ETag compare-and-swap.

Why blobs can hold leases
    Blob storage has conditional writes. A record is created with ``If-None-Match: *`` (only if no
    blob of that name exists) and replaced with ``If-Match: <etag of what I read>``, so when several
    clients read the same version and write, exactly one write lands; the others get HTTP 409 or 412
    and read again. The reservation rules are :mod:`dibs.stores.transitions`, applied between the read
    and the swap by :class:`~dibs.stores.base.RecordStore`; the fencing token lives in the record.
    Azure's own blob leases are not used: their duration is 15 to 60 seconds or infinite, they carry no
    owner or fence, and they cannot be judged against a caller's ttl.

Layout inside the container (``PREFIX`` is optional)::

    PREFIX/records/<sha256 of the key>                 the key's record (dibs.stores.codec JSON), with a
                                                       summary of it in its metadata (see below)
    PREFIX/artifacts/<sha256 of the key>-<fence>-<h>   a completed key's payload (h: from its checksum)
    PREFIX/index/...                                   blobs without content whose names index the
                                                       records: the keys holding a lease, the artifacts
                                                       and failures by time (see below, and .index); an
                                                       artifact's carries a copy of its record in its
                                                       metadata (.copies)

Names come from :attr:`dibs.keys.Key.digest` only, never from the key's text, so no key can reach
outside the prefix. A record blob is never deleted: ``forget``, ``prune``, ``reap`` and ``discard``
replace it with a tombstone that keeps the fence, so fences (and with them payload names) never
repeat, and a payload delete that arrives late can only hit a blob no record names any more.

Time
    Expiry is judged by the Blob service's clock: every read takes ``now`` from the ``Date`` header of
    its own response, never from this machine's wall clock, so clients whose clocks disagree still
    agree on who holds a key. ``Date`` has one-second resolution, too coarse for short ttls;
    :class:`~dibs.stores.azure.clock.ServiceClock` refines it with this process's *monotonic* clock
    (used only to measure the time between two of its own requests) down to about a round trip, and
    always keeps the estimate inside the second that the header names, so it is never further off
    than the header itself.

Artifacts
    The payload is its own blob, uploaded create-only (first writer wins) with its size and checksum
    as metadata *before* the record swap that references it: a record never points at a payload that
    is not fully stored. The blob's name includes the fence and a digest of the checksum, so a holder
    that lost its lease writes to a different name and cannot touch what the new holder stored; its
    upload is deleted again when its swap is refused. :meth:`read` and a hit in :meth:`acquire` fetch
    the payload; the client checks it with :meth:`~dibs.records.ArtifactRecord.verified_payload`.
    Large payloads are uploaded in parallel blocks and downloaded in parallel ranges into one growing
    buffer, never held whole twice.

Reads of many records
    Of one namespace, the held and expired leases and the newest artifacts and failures (``dibs top``,
    ``dibs ls --state held``, the Reservations page's first rows) are found through the index
    (:mod:`.index`, read by :mod:`.indexed`): a listing of the namespace's ``index/live/`` blobs and a
    page of its ``index/made/`` blobs, newest first, then a download of each record they name, which
    decides; a done key's record is read from the copy its ``made`` blob carries (:mod:`.copies`: set
    after the write that makes the record, removed before any write that changes it), so the newest done
    keys, the Reservations page's rows, cost one listing and no download each. Their cost follows the
    live work, not the history; a write that takes or ends a lease, or makes an artifact or a failure,
    writes or removes an index blob beside its record (one request more to take a key; four more to
    complete it, in two round trips, as requests that do not depend on each other are sent together; one
    more, the copy's removal, for a write from a done key: a refresh's take, ``forget``, ``prune``; two
    more, in no round trip more, when a refresh's lease ends and leaves the artifact). ``dibs top``'s
    counts of held and expired keys come from the index too; its counts of done and failed keys from the
    first page of the record listing (1,000 blobs): past it they are lower bounds (``done 812+``), as
    nothing short of listing every record blob counts them. ``reap`` sweeps the ``live`` blobs a killed
    process left behind. A store written before the index (or by an older dibs) is indexed once, by the
    first such read (:meth:`~AzureBlobStore.rebuild_index`, which then copies the newest done records of
    each namespace onto their index blobs, rewriting each record with its content unchanged); until
    then, and for a read of every namespace (the index is kept per namespace), the reads list the
    records as below.

    Everything else lists ``records/``, which returns each blob's metadata with its name, 5,000 blobs a
    request: every record blob carries a summary of its record there (the key's name, lease expiry,
    artifact and failure times, attempts: :mod:`.summary`), written by the same request as the record.
    So ``list_page`` in key order, ``count_states``, and every read of all namespaces list the records
    once, judge each key's status from its summary on the service's clock (the ``Date`` of the
    listing page that named it), and download only the records they show (:mod:`.reads`); a count
    downloads none. ``prune`` and ``reap`` pick their
    candidates the same way and then read and swap each as any write does, ``max_concurrency`` of
    them at a time (each its own read and ETag swap: one after another, a removal spent its time
    waiting for the service). Blobs are named by the key's digest, so key order is not blob order and
    no prefix picks a namespace: each read lists every namespace's records under the store's prefix
    and sorts the namespace's in memory (one listing request per 5,000 blobs; a prefix per team or
    pipeline keeps histories apart). A blob without a summary (an older dibs wrote it) is downloaded,
    as :meth:`~AzureBlobStore.list` downloads every record it shows.

Configuration (``from_url``)::

    azure://CONTAINER[/PREFIX]?account_url=https://ACCOUNT.blob.core.windows.net[&OPTIONS]

Credentials are taken from, in order: ``connection_string=`` in the URL; ``account_key=`` or
``sas_token=`` in the URL (with ``account_url=``); the ``AZURE_STORAGE_CONNECTION_STRING``
environment variable; else ``DefaultAzureCredential`` when ``azure-identity`` is installed (managed
identity, workload identity, Azure CLI login, ...). Explicit credentials in the URL win over the
environment. Percent-encode values that contain ``&``, ``+``, ``%`` or ``#`` (SAS tokens always do).
Options: ``timeout=`` (seconds per request, default 30), ``retries=`` (retries of a failed request,
default 3), ``max_concurrency=`` (parallel transfers for large artifacts, records downloaded or
changed at once by the reads of many records, ``prune`` and ``reap``; default 4, at most 64: above
requests' 10 connections a host, the client keeps that many and 10 more, so the connections of a
removal at full width are kept for the next requests instead of dropped). The container is
created on first write if it does not exist. Secrets never appear in :attr:`url`, logs or errors.

Waiters are woken by the process's watch hub, which follows the watched records' ETags with one
poller (:class:`~dibs.stores.azure.feed.EtagFeed`): a ``HEAD`` per record for a few keys; for many,
one listing of each watched namespace's ``live`` index blobs (the keys holding a lease there), so a
poll costs what is being waited on, not the store's history. Async callers run these same operations
in the runtime's I/O executor; there is deliberately no second copy written against
``azure.storage.blob.aio``.

Modules: :mod:`.settings` (the URL, checked into :class:`AzureSettings`), :mod:`.connection` (the
SDK client with the first credential found, the request policy, error text without secrets),
:mod:`.clock` (the service's clock), :mod:`.blobs` (blob helpers the payload store shares),
:mod:`.summary` (the record summary in metadata), :mod:`.reads` (the admin reads from a listing),
:mod:`.index` (the index's names and rules), :mod:`.indexed` (the reads through it), :mod:`.store`
(:class:`AzureBlobStore`) and :mod:`.feed` (the ETag feed).
"""

from dibs.stores.azure.clock import ServiceClock
from dibs.stores.azure.connection import connect
from dibs.stores.azure.settings import CONNECTION_STRING_ENV, AzureSettings, parse_url
from dibs.stores.azure.store import AzureBlobStore

__all__ = ["CONNECTION_STRING_ENV", "AzureBlobStore", "AzureSettings", "ServiceClock", "connect", "parse_url"]

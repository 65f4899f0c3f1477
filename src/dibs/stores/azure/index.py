"""The Azure store's index: small blobs whose *names* say which keys hold a lease and which artifacts
and failures are newest, so ``dibs top``, ``ls --state held`` and the Reservations page list what
they show instead of every record blob the store ever wrote (issue 30).

Blob storage has no secondary index, only listings by name prefix in name order. So the index is
made of names (under the store's prefix)::

    index/live/<ns>/<key digest>                      the key's record holds a lease (held or expired)
    index/made/a/<ns>/<inverted time>-<key digest>    the key's artifact was made at that time
    index/made/f/<ns>/<inverted time>-<key digest>    the key's last failure was recorded then
    index/ready                                       every record is in the index (see below)

``<ns>`` is a digest of the namespace, so one namespace is one prefix; ``<inverted time>`` is
``10**17`` minus the time in microseconds, zero-padded, so name order is newest first. The blobs are
empty: a name is all a reader needs to find the record, and the record decides. An artifact's
``made`` blob may also carry a copy of its record in its metadata, which a listing returns with the
name, so the newest done keys cost no download each; a copy exists only while it is the record, byte
for byte (the steps that keep it so are in :mod:`.copies`).

The rules that keep it true
    A record is always written *after* the index blob that names it, and an index blob is removed only
    *after* the record stopped needing it, so a record that holds a lease always has its ``live`` blob
    and a record with an artifact or failure always has its ``made`` blob. The reverse is not kept:
    an index blob may outlive its reason (a process killed between the two writes, a swap lost to
    another writer), so a reader downloads the record an index blob names and trusts the record;
    stale ``live`` blobs are swept by ``reap``.

    The ``live`` blob is shared by the key's successive holders, so removing it must not remove the
    next holder's. Every write that takes a lease *overwrites* it (a new ETag) after reading the
    record it will swap, and a write that ends a lease reads the blob's ETag *before* its swap and
    deletes it only ``If-Match`` that ETag after the swap: a holder that took the key in between
    overwrote the blob after reading the ended record, so the delete is refused (or came first, and
    the new holder's overwrite puts it back). ``made`` blobs need no such care: a name holds a time
    in microseconds, so no later record names the same one, and the write that replaces an artifact
    or failure deletes the old one's blob after its swap.

Records written before the index (or by an older dibs)
    A store is read through the index once ``index/ready`` exists. The first read that finds it missing
    lists the records once (as every read did before), writes the index blobs of those that need them,
    then writes ``index/ready`` (:meth:`~dibs.stores.azure.AzureBlobStore.rebuild_index` does it on
    demand), then gives the newest done keys of each namespace their copies, rewriting each of those
    records with its content unchanged (:mod:`.copies`). Processes of an older dibs write records
    without index blobs: upgrade them all, then rebuild the index.
"""

from __future__ import annotations

from dibs.stores.name_index import (
    KINDS,
    VERSION,
    Changes,
    Layout,
    Made,
    changes,
    made_names,
    micros,
    namespace_digest,
)

__all__ = [
    "KINDS",
    "VERSION",
    "Changes",
    "Layout",
    "Made",
    "changes",
    "made_names",
    "micros",
    "namespace_digest",
]

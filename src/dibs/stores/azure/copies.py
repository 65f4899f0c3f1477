"""The copy of its record that an artifact's ``made`` index blob carries in its metadata, so the newest
done keys (the Reservations page, ``dibs top``) come from one listing instead of a GET per key.

Why a copy can be trusted
    The index's rule is that the record decides, and a copy is only ever the record itself, byte for
    byte (:func:`dibs.stores.codec.encode`). It is kept so by two steps around every record write
    (:meth:`AzureBlobStore._swap <dibs.stores.azure.AzureBlobStore._swap>`):

    - **before** a write from a record that may have a copy (an artifact, no lease), the copy is
      removed: the ``made`` blob's metadata is emptied, which gives the blob a new ETag;
    - **after** a write that lands a record with an artifact and no lease, the copy is set on its
      ``made`` blob *only if* the blob's ETag is still the one this writer saw before its write (its
      own removal, or its own creation of the blob). Any other writer that read this record since
      removed the copy first, which changed the ETag, so the late copy is refused.

    Only a write confirmed as this writer's own sets a copy. A write refused and then found to have
    left the record with exactly its bytes (``Echo.SAME``: its own attempt landed before a retry, or
    another writer made the same change, as two reapers do) counts as landed, but sets none: a third
    writer may have read the other's record and removed its copy before this writer's removal.

    A copy therefore exists only while the record is exactly what it holds. A record that holds a
    lease never has one (its ``made`` blob's copy was removed before the lease was taken), so a key
    being computed again is never shown as done. A process killed between the steps leaves a blob
    with no copy, never a wrong one, and a blob with no copy is read as before (its record
    downloaded).

    A copy set outside a write of the record (``AzureBlobStore._copy_again``, what
    :meth:`~dibs.stores.azure.AzureBlobStore.rebuild_index` does for the newest done keys of each
    namespace) makes a write of its own: it removes the copy, rewrites the record with its content
    unchanged (an ETag swap, so a writer that read the record before, and may have removed a copy
    before the blob even existed, fails its own swap and reads again; the rewrite also writes the
    record's metadata summary anew), then sets the copy ``If-Match`` as above.

What the steps cost
    A completion: the copy, one request sent after the record's write together with the ``live``
    blob's delete (no round trip more). ``forget`` and ``prune`` of a done key, and a refresh taking
    one: the copy's removal before the write (for ``forget`` and ``prune``, a round trip more). The
    release or reap of a refresh's lease, which leaves the artifact: a removal before (to learn the
    ETag) and the copy after, each sent beside the write's other index requests. A rebuild: four
    requests for each of the newest done keys it copies (the record read, the removal, the rewrite,
    the copy).

Format ``1`` (metadata, ASCII as HTTP headers need)::

    dibs_copy      "1"
    dibs_record    the record as :func:`~dibs.stores.codec.encode` writes it, URL-safe base64

A record too long for Azure's 8 KB of metadata per blob (a key name and a failure message near their
limits) gets no copy and is downloaded.
"""

from __future__ import annotations

import base64
import binascii
import enum
from collections.abc import Mapping

from dibs.errors import CorruptRecord
from dibs.records import KeyState
from dibs.stores import codec

__all__ = ["COPY_FORMAT", "MAX_COPY", "Echo", "copy_metadata", "may_have_copy", "record_in"]

#: The copy's format, in ``dibs_copy``; a reader ignores a copy of any other (and downloads).
COPY_FORMAT = "1"
#: The longest encoded record copied. Azure allows 8 KB of metadata per blob, names and values.
MAX_COPY = 7800

_COPY = "dibs_copy"
_RECORD = "dibs_record"


class Echo(enum.Enum):
    """What the Azure record store's conditional write returns when it was refused and the record then
    held exactly the bytes it meant to write: its own earlier attempt landed (a response lost, the
    request retried), or another writer made the same change. Either way the record is as asked, but
    the write may not be this writer's (it sets no copy)."""

    SAME = "same bytes"


def may_have_copy(state: KeyState) -> bool:
    """Whether ``state``'s ``made`` artifact blob may carry a copy of it: it has an artifact and holds no
    lease (a copy is set only on such a record)."""
    return state.artifact is not None and state.lease is None


def copy_metadata(state: KeyState) -> dict[str, str] | None:
    """The metadata that copies ``state`` onto its artifact's ``made`` blob; ``None`` when it may not
    have a copy, or is too long for one."""
    if not may_have_copy(state):
        return None
    encoded = base64.urlsafe_b64encode(codec.encode(state)).decode("ascii")
    if len(encoded) > MAX_COPY:
        return None
    return {_COPY: COPY_FORMAT, _RECORD: encoded}


def record_in(metadata: Mapping[str, str] | None, digest: str, now: float, *, where: str) -> KeyState | None:
    """The record a ``made`` blob's metadata copies, read at ``now`` (the service's time of the listing
    page that carried it); ``None`` when it has no copy to trust (none, another format, or one that
    does not decode to a record of this key without a lease): the caller then downloads the record."""
    if not metadata:
        return None
    found = {name.lower(): value for name, value in metadata.items()}
    if found.get(_COPY) != COPY_FORMAT or _RECORD not in found:
        return None
    try:
        data = base64.urlsafe_b64decode(found[_RECORD].encode("ascii"))
        state = codec.decode(data, None, now, where=where, digest=digest)
    except (ValueError, binascii.Error, CorruptRecord):
        return None
    return state if may_have_copy(state) else None

"""The record summary every Azure record blob carries in its metadata, for reads from the listing.

A listing of ``records/`` with ``include=["metadata"]`` returns every blob's metadata with its name,
5,000 blobs a request. Without a summary there, each admin read (``dibs top``, ``dibs ls``, the
Airflow Reservations page, ``prune``, ``reap``) had to download every record of the namespace to
learn its status: 100,000 GETs for one ``dibs top`` at 100,000 keys. With it, the listing alone says
which key each blob is, what status it has and when its artifact or failure was made, so a read
downloads only the records it shows, and a count downloads none.

The summary is written with the record, by the same ``Put Blob`` (content and metadata change
together, atomically), so it is never older than the record it describes. Format ``1``::

    dibs_summary              "1"  (the summary's format; a blob without it, or with another, is read
                              with a GET, as an older dibs's blob is)
    dibs_name                 the key's name, UTF-8 in URL-safe base64 without padding (metadata must
                              be ASCII and survive as an HTTP header: names may be any printable
                              Unicode and may start or end with spaces); left out if longer than
                              MAX_NAME_METADATA, and that blob is read with a GET
    dibs_attempts             the record's attempt counter (0 on a tombstone)
    dibs_lease_expires_at     the lease's expiry, when the record has a lease
    dibs_artifact_created_at  the artifact's creation time, when it has one
    dibs_failure_at           the last failure's time, when it has one

Times are Unix seconds on the service's clock written with ``repr``, which reads back to the same
float exactly. The key's namespace is ``dibs_namespace`` (written since before the summary), and the
blob's name (the key's digest) must match the name and namespace, or the summary is not trusted.

What a summary cannot give is everything a caller prints (owners, tokens, errors, sizes): it only
says *which* records to read. :meth:`Summary.skeleton` turns it into a :class:`KeyState` that has the
facts :attr:`KeyState.status <dibs.records.KeyState.status>` and the removal rules of
:mod:`dibs.stores.transitions` read, and blank stand-ins for the rest: it picks candidates and is
never handed to a caller.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import math
from collections.abc import Mapping

from dibs.errors import InvalidKey
from dibs.keys import Key
from dibs.records import ArtifactRecord, FailureRecord, KeyState, LeaseRecord, LeaseToken
from dibs.stores import codec

__all__ = ["MAX_NAME_METADATA", "SUMMARY_FORMAT", "Summary", "metadata_of", "summary_of"]

#: The summary's format, in ``dibs_summary``; a reader ignores a summary of any other.
SUMMARY_FORMAT = "1"
#: The longest encoded name kept in ``dibs_name``. Azure allows 8 KB of metadata per blob (names and
#: values); the longest valid key name (1,024 characters of 4 UTF-8 bytes) encodes to 5,462, so every
#: name fits today, and a name that ever did not would leave its blob to be read with a GET.
MAX_NAME_METADATA = 6000

_FORMAT = "dibs_format"
_NAMESPACE = "dibs_namespace"
_SUMMARY = "dibs_summary"
_NAME = "dibs_name"
_ATTEMPTS = "dibs_attempts"
_LEASE = "dibs_lease_expires_at"
_ARTIFACT = "dibs_artifact_created_at"
_FAILURE = "dibs_failure_at"


def metadata_of(state: KeyState) -> dict[str, str]:
    """The metadata of ``state``'s record blob: its format, namespace and summary."""
    metadata = {
        _FORMAT: codec.FORMAT,
        _NAMESPACE: state.key.namespace,
        _SUMMARY: SUMMARY_FORMAT,
        _ATTEMPTS: str(state.attempts),
    }
    name = base64.urlsafe_b64encode(state.key.name.encode("utf-8")).decode("ascii").rstrip("=")
    if len(name) <= MAX_NAME_METADATA:
        metadata[_NAME] = name
    if state.lease is not None:
        metadata[_LEASE] = repr(state.lease.expires_at)
    if state.artifact is not None:
        metadata[_ARTIFACT] = repr(state.artifact.created_at)
    if state.failure is not None:
        metadata[_FAILURE] = repr(state.failure.at)
    return metadata


@dataclasses.dataclass(frozen=True)
class Summary:
    """What a record blob's metadata says of its record (see the module docstring)."""

    key: Key
    attempts: int
    lease_expires_at: float | None
    artifact_created_at: float | None
    failure_at: float | None

    def skeleton(self, now: float) -> KeyState:
        """A state with the facts the status and removal rules read, judged at ``now`` (the service's
        time of the listing page that carried the summary). Owners, tokens, sizes and errors are blank:
        for choosing records, never for showing them."""
        key = self.key
        lease = artifact = failure = None
        if self.lease_expires_at is not None:
            at = self.lease_expires_at
            lease = LeaseRecord(key, "", LeaseToken(0, ""), at, at, 0.0, 0)
        if self.artifact_created_at is not None:
            artifact = ArtifactRecord("", b"", 0, "", "", 0, self.artifact_created_at)
        if self.failure_at is not None:
            failure = FailureRecord(0, "", "", self.failure_at)
        return KeyState(key, now, 0, self.attempts, lease, artifact, failure)


def summary_of(metadata: Mapping[str, str] | None, digest: str) -> Summary | None:
    """The summary in a record blob's metadata, or ``None`` when there is none to trust: no summary
    (an older dibs wrote the blob), another format, a name left out, a value that does not parse, or
    a key whose digest is not the blob's name. The caller then reads the blob itself."""
    if not metadata:
        return None
    found = {name.lower(): value for name, value in metadata.items()}
    if found.get(_SUMMARY) != SUMMARY_FORMAT or found.get(_FORMAT) != codec.FORMAT:
        return None
    try:
        encoded = found[_NAME]
        name = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode("utf-8")
        key = Key(found[_NAMESPACE], name)
        attempts = int(found[_ATTEMPTS])
        summary = Summary(
            key, attempts, _time(found.get(_LEASE)), _time(found.get(_ARTIFACT)), _time(found.get(_FAILURE))
        )
    except (KeyError, ValueError, binascii.Error, InvalidKey):
        return None
    if key.digest != digest or attempts < 0:
        return None
    return summary


def _time(text: str | None) -> float | None:
    if text is None:
        return None
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is not a time")
    return value

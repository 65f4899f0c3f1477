"""``dibs run`` and ``dibs wait`` with a payload store: stdout streamed, never whole in memory.

``dibs run --payloads URL`` writes COMMAND's stdout into the payload store as it comes (and on to its
own stdout, as without one), keeping only the first bytes: an output up to the inline limit is stored
in the record as before, a larger one becomes a reference to the payload. ``dibs wait``, and ``dibs
run`` on a hit or after waiting, print a payload only once all of it was checked: it is copied into a
private temporary file while its size and SHA-256 are checked (a chunk or two in memory, never the
whole payload), and printed from there (:func:`stream_out`). ``dibs run``'s client hands hits out
checked so (:func:`streaming`, :attr:`ReferencingStore.unread_check`), so a bad payload is a miss
that runs COMMAND, and the flow's hit carries the artifact itself instead of its value
(:func:`dibs.artifacts.unread_hit`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from dibs._cli.command import Command
from dibs._cli.stops import StopSignals
from dibs.client import Reservations
from dibs.keys import Key
from dibs.payloads import Payload, ReferencedArtifact, ReferencingStore, unread
from dibs.payloads.verify import copy_out
from dibs.records import ArtifactRecord
from dibs.stores import Store

__all__ = ["stream_out", "streaming", "streams", "work_of"]


def streaming(client: Reservations) -> Store:
    """The store through which ``dibs run`` asks: ``client``'s, handing out hits of payloads unread,
    each checked to its end into a spool file when it is found (a bad one is a miss), which
    :func:`stream_out` prints. A client without a payload store asks through its own store."""
    return unread(client.store, "digest")


def work_of(client: Reservations, running: Command, stops: StopSignals) -> Callable[[], bytes | Payload]:
    """What the lease's holder runs: COMMAND, its stdout in memory, or in the payload store if any."""
    store = client.store
    if not isinstance(store, ReferencingStore):
        return lambda: running.run(stops)

    def spooled() -> bytes | Payload:
        head = bytearray()
        with store.payloads.writer() as writer:

            def sink(chunk: bytes) -> None:
                if len(head) <= store.inline_limit:
                    head.extend(chunk[: store.inline_limit + 1 - len(head)])
                writer.write(chunk)

            running.sink = sink
            running.run(stops)
            if writer.size <= store.inline_limit:
                return bytes(head)  # small: kept in the record, as without a payload store
            return writer.commit("bytes")

    return spooled


def streams(args: argparse.Namespace, artifact: ArtifactRecord) -> bool:
    """Whether ``dibs wait`` prints this artifact by streaming it (a payload, printed as bytes)."""
    return isinstance(artifact, ReferencedArtifact) and not args.json


def stream_out(key: Key, artifact: ArtifactRecord) -> int:
    """Print a payload once all of it was checked (its spool, or one made now); a bad one is
    :class:`~dibs.payloads.PayloadUnavailable`, and nothing of it is printed."""
    assert isinstance(artifact, ReferencedArtifact)
    spooled = artifact.verified_spool(key)
    out = sys.stdout.buffer
    try:
        copy_out(spooled, out)
        out.flush()
    except BrokenPipeError:
        return 0  # the reader went away (dibs wait ... | head)
    finally:
        if spooled is not artifact.spooled:
            spooled.close()  # made here: its disk space goes now
    return 0

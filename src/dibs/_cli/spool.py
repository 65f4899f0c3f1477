"""``dibs run`` and ``dibs wait`` with a payload store: stdout streamed, never whole in memory.

``dibs run --payloads URL`` writes COMMAND's stdout into the payload store as it comes (and on to its
own stdout, as without one), keeping only the first bytes: an output up to the inline limit is stored
in the record as before, a larger one becomes a reference to the payload. ``dibs wait``, and ``dibs
run`` on a hit or after waiting, copy a payload to stdout in chunks, checked as it goes (see
:func:`dibs.payloads.verify.copy_verified`): its client's store hands hits out unread
(:func:`streaming`, :attr:`ReferencingStore.load`), and the flow's outcome carries the artifact
itself instead of its value (:func:`outcome`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from dibs._cli.command import Command
from dibs._cli.stops import StopSignals
from dibs.client import Reservations
from dibs.payloads import Payload, ReferencedArtifact, ReferencingStore, unread
from dibs.payloads.verify import copy_verified
from dibs.records import ArtifactRecord
from dibs.stores import Store

__all__ = ["stream_out", "streaming", "streams", "work_of"]


def streaming(client: Reservations) -> Store:
    """The store through which ``dibs run`` asks: ``client``'s, handing out hits of payloads unread
    (only their size is checked when they are found, and :func:`stream_out` checks the digest as it
    prints them). A client without a payload store asks through its own store."""
    return unread(client.store)


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


def stream_out(artifact: ArtifactRecord) -> int:
    """Copy a payload to stdout, checked as it goes; a bad one ends with an error saying so."""
    assert isinstance(artifact, ReferencedArtifact)
    out = sys.stdout.buffer
    try:
        copy_verified(artifact.source, artifact.reference, artifact.uri, out)
    except BrokenPipeError:
        return 0  # the reader went away (dibs wait ... | head)
    out.flush()
    return 0

"""``dibs top``: the live state of a namespace, refreshed in place.

Everything here is what the store itself knows, read with a few bounded reads per refresh (see
:func:`snapshot`): the keys held now (holder, token, how long held, when the lease expires), leases
that expired without a taker yet, the latest artifacts (who produced each, how long it took, how long
ago) and the latest failures. Outcomes
of calls that only read (hits, waits) are not in the store: the metrics of docs/observability.md
count those.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

from dibs._cli.text import instant, print_table, size
from dibs.client import Reservations
from dibs.display import duration, printable
from dibs.records import ArtifactRecord, FailureRecord, KeyState
from dibs.stores import pages

__all__ = ["snapshot", "top"]

#: One kind of record of a key (an artifact, a failure).
Record = TypeVar("Record")

#: How many of the latest artifacts and failures a screen shows.
RECENT = 10
#: How many held (and expired) leases a screen shows: the soonest to expire (the latest expired); the
#: counts say how many there are in all.
LEASES = 50


def snapshot(client: Reservations, *, all_namespaces: bool = False) -> dict[str, Any]:
    """One reading of the namespace (or of every namespace), as ``--json`` prints it.

    Made of the store's bounded reads (:meth:`Store.overview <dibs.stores.base.Store.overview>`): the
    counts (each up to :data:`~dibs.stores.pages.COUNT_CAP`; those in ``at_least`` are lower bounds,
    see :attr:`Overview.at_least <dibs.stores.pages.Overview.at_least>`), :data:`LEASES` held and
    expired leases,
    and the :data:`RECENT` latest artifacts and failures. A store that finds them through indexes (SQL)
    reads as many records whatever the size of the namespace: ``top`` costs what it shows, not the
    history. One that scans reads the namespace once per refresh."""
    store = client.store
    namespace = None if all_namespaces else client.namespace
    seen = store.overview(namespace, leases=LEASES, recent=RECENT)
    read = [*seen.held, *seen.expired, *seen.artifacts, *seen.failures]
    now = max((state.now for state in read), default=time.time())
    return {
        "namespace": namespace,
        "store": store.url,
        "store_now": instant(now),
        "counts": seen.counts,
        "counted_up_to": pages.COUNT_CAP,
        "at_least": sorted(seen.at_least),
        "held": [_lease(s) for s in seen.held],
        "expired": [_lease(s) for s in seen.expired],
        "recent_artifacts": _latest(seen.artifacts, lambda s: s.artifact, lambda a: a.created_at, _artifact),
        "recent_failures": _latest(seen.failures, lambda s: s.failure, lambda f: f.at, _failure),
    }


def _lease(state: KeyState) -> dict[str, Any]:
    lease = state.lease
    assert lease is not None
    return {
        "key": str(state.key),
        "holder": lease.owner,
        "token": lease.token.fence,
        "attempt": lease.attempt,
        "held_s": round(state.now - lease.acquired_at, 3),
        "expires_in_s": round(lease.expires_at - state.now, 3),
    }


def _latest(
    states: list[KeyState],
    record_of: Callable[[KeyState], Record | None],
    made_at: Callable[[Record], float],
    fields: Callable[[Record], dict[str, Any]],
) -> list[dict[str, Any]]:
    """The :data:`RECENT` latest records of one kind (artifacts, failures), newest first: each with
    its key, what ``fields`` shows of it, and its age on the store's clock."""
    found = [(state, record) for state in states if (record := record_of(state)) is not None]
    found.sort(key=lambda pair: -made_at(pair[1]))
    return [
        {"key": str(state.key), **fields(record), "age_s": round(state.now - made_at(record), 3)}
        for state, record in found[:RECENT]
    ]


def _artifact(artifact: ArtifactRecord) -> dict[str, Any]:
    return {
        "producer": artifact.producer,
        "token": artifact.fence,
        "size": artifact.size,
        "compute_seconds": artifact.compute_seconds,
    }


def _failure(failure: FailureRecord) -> dict[str, Any]:
    return {"owner": failure.owner, "failures": failure.count, "error": failure.error}


def render(doc: dict[str, Any], width: int | None) -> str:
    """The screen for one snapshot."""
    import io

    out = io.StringIO()
    where = doc["namespace"] or "every namespace"
    counts = doc["counts"]
    print(f"dibs top: {printable(where)} on {doc['store']} at {doc['store_now']} (store clock)", file=out)
    cap = doc.get("counted_up_to")
    at_least = set(doc.get("at_least", ()))
    shown = (
        f"{count}+" if count == cap or status in at_least else str(count) for status, count in counts.items()
    )
    print("  ".join(f"{status} {count}" for status, count in zip(counts, shown, strict=True)), file=out)
    sections = (
        ("HELD", doc["held"], ["key", "holder", "token", "held", "expires in"], _held_row),
        (
            "EXPIRED (the next caller takes over)",
            doc["expired"],
            ["key", "holder", "token", "expired"],
            _expired_row,
        ),
        (
            "LATEST ARTIFACTS",
            doc["recent_artifacts"],
            ["key", "producer", "token", "size", "compute", "age"],
            _artifact_row,
        ),
        (
            "LATEST FAILURES",
            doc["recent_failures"],
            ["key", "owner", "failures", "age", "error"],
            _failure_row,
        ),
    )
    for title, rows, columns, row in sections:
        if not rows:
            continue
        print(f"\n{title}", file=out)
        print_table([row(r) for r in rows], columns, out, width=width)
    return out.getvalue()


def _held_row(r: dict[str, Any]) -> dict[str, Any]:
    return {**r, "held": duration(r["held_s"]), "expires in": duration(r["expires_in_s"])}


def _expired_row(r: dict[str, Any]) -> dict[str, Any]:
    return {**r, "expired": f"{duration(-r['expires_in_s'])} ago"}


def _artifact_row(r: dict[str, Any]) -> dict[str, Any]:
    compute = "-" if r["compute_seconds"] is None else duration(r["compute_seconds"])
    return {**r, "size": size(r["size"]), "compute": compute, "age": f"{duration(r['age_s'])} ago"}


def _failure_row(r: dict[str, Any]) -> dict[str, Any]:
    return {**r, "age": f"{duration(r['age_s'])} ago"}


def top(args: argparse.Namespace, client: Reservations) -> int:
    """Print the namespace's state; on a terminal, again every ``--interval`` seconds until Ctrl-C."""
    live = sys.stdout.isatty() and not args.once and not args.json
    while True:
        doc = snapshot(client, all_namespaces=args.all)
        if args.json:
            print(json.dumps(doc, indent=2))
            return 0
        width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
        screen = render(doc, width)
        if not live:
            print(screen, end="")
            return 0
        sys.stdout.write("\x1b[H\x1b[2J" + screen)  # home and clear: the screen is redrawn in place
        sys.stdout.flush()
        try:
            time.sleep(args.interval)
        except KeyboardInterrupt:
            return 0

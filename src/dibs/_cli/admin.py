"""The commands that inspect and repair a store: ``ls``, ``top``, ``show``, ``release``, ``forget``,
``reap`` and ``prune``.

Each one opens the store, reads or changes it once through the public client, prints the result
(a table, or JSON with ``--json``) on stdout and returns its exit status; notes about records that
could not be read go to stderr, so the listing itself stays parseable.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import shutil
import sys
from collections.abc import Callable, Iterator
from typing import Any

from dibs._cli import names
from dibs._cli.exits import EXIT_NOTHING
from dibs._cli.text import instant, print_table, size
from dibs._cli.top import top
from dibs.client import Reservations
from dibs.display import duration, printable
from dibs.keys import Key
from dibs.payloads import ReferencedArtifact, ReferencingStore
from dibs.records import ArtifactRecord, KeyState
from dibs.stores import pages
from dibs.stores.base import Listing

__all__ = ["COMMANDS", "administer"]

Command = Callable[[argparse.Namespace, Reservations], int]


def administer(args: argparse.Namespace) -> int:
    """Run the inspection or repair command ``args`` names, on the store it names."""
    with Reservations(args.store, namespace=args.namespace, payloads=args.payloads) as client:
        return COMMANDS[args.command](args, client)


def _ls(args: argparse.Namespace, client: Reservations) -> int:
    """List the namespace a page at a time, printing each page as it is read (see :func:`_listed`)."""
    columns = ["namespace", "key", "status", "holder", "token", "detail"]
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    printed = 0

    def emit(states: list[KeyState]) -> None:
        nonlocal printed
        rows = [_summary(s) for s in states]
        if args.jsonl:
            for row in rows:
                print(json.dumps(row))
        elif args.json:  # one JSON array, written as it is read
            for row in rows:
                print(("[" if printed == 0 else ",") + json.dumps(row))
                printed += 1
            return
        elif rows or printed == 0:
            print_table(rows, columns, width=width, header=printed == 0)
        printed += len(rows)
        sys.stdout.flush()

    more, skipped = _listed(args, client, emit)
    if args.json:
        print("[]" if printed == 0 else "]")
    if more is not None:
        if args.jsonl:
            print(json.dumps({"after": more}))
        print(f"dibs: more keys follow; continue with --after {more}", file=sys.stderr)
    _say_skipped(skipped)
    return 0


def _listed(
    args: argparse.Namespace, client: Reservations, emit: Callable[[list[KeyState]], None]
) -> tuple[str | None, int]:
    """Read the keys ``args`` asks for from the store a page at a time (:meth:`Store.list_pages
    <dibs.stores.base.Store.list_pages>`: what the store finds, not the whole namespace), handing each
    page's keys to ``emit``; stop after ``--limit`` keys. The cursor after the last key emitted when
    more follow (else ``None``), and how many unreadable records were skipped."""
    namespace = None if args.all else client.namespace
    limit: int | None = args.limit
    after: str | None = args.after
    size = pages.PAGE if limit is None else min(pages.PAGE, limit + 1)
    pattern: str | None = args.name
    # Within one namespace, from just before the names the pattern can name, in pages that grow
    # (see names.lookup); across namespaces (--all) every key is read.
    by_prefix = pattern if namespace is not None else None
    if by_prefix is not None:
        begin = names.start(client.namespace, by_prefix)
        if begin is not None and (after is None or pages.parse_cursor(after) < pages.parse_cursor(begin)):
            after = begin
    emitted, skipped = 0, 0
    first = names.FIRST_PAGE if by_prefix is not None else None
    for page in client.store.list_pages(namespace, state=args.state, after=after, limit=size, first=first):
        skipped += page.skipped
        states, ended = page.states, page.after is None
        if by_prefix is not None:  # past the prefix: no later name can match
            kept = tuple(s for s in states if not names.past(s.key.name, by_prefix))
            states, ended = kept, ended or len(kept) < len(states)
        found = [s for s in names.select(states, pattern) if args.state or _worth_listing(s)]
        if limit is not None and emitted + len(found) >= limit:
            shown = found[: limit - emitted]
            if shown:
                emit(shown)
            ends_here = len(found) == len(shown) and ended
            last = shown[-1].key if shown else None
            return (None if ends_here or last is None else pages.cursor_of(last)), skipped
        if found:
            emit(found)
        emitted += len(found)
        if ended:
            break
    return None, skipped


def _show(args: argparse.Namespace, client: Reservations) -> int:
    state = client.status(names.resolve(client, args.key, "a key to show"))
    doc = _details(state)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        width = max(map(len, doc))
        for name, value in doc.items():
            print(f"{name:<{width}}  {'-' if value is None else printable(value)}")
    return 0 if state.status != "free" or state.fence else EXIT_NOTHING


@dataclasses.dataclass(frozen=True)
class _Repair:
    """A repair of one key (``release``, ``forget``): what it does, and its words for either result.

    ``done`` is both what it says of the key when it changed something and the ``--json`` field
    that says whether it did; when there was nothing to change it says ``nothing`` and exits 1.
    """

    act: Callable[[Reservations, Key], bool]
    done: str
    nothing: str

    def __call__(self, args: argparse.Namespace, client: Reservations) -> int:
        key = names.resolve(client, args.key, f"a key to {args.command}")
        changed = self.act(client, key)
        _say(
            args,
            {"key": key.name, self.done: changed},
            f"{key.name}: {self.done if changed else self.nothing}",
        )
        return 0 if changed else EXIT_NOTHING


def _reap(args: argparse.Namespace, client: Reservations) -> int:
    with _progress("reaped") as progress:
        count = client.reap(all_namespaces=args.all, progress=progress)
    _say(args, {"reaped": count}, f"reaped {count} record(s): expired leases and empty records cleared")
    return 0


def _prune(args: argparse.Namespace, client: Reservations) -> int:
    older = duration(args.older_than)
    if args.dry_run:
        return _dry_run(args, client, older)
    store = client.store
    before = store.freed if isinstance(store, ReferencingStore) else None
    with _progress("pruned") as progress:
        count = client.prune(args.older_than, all_namespaces=args.all, progress=progress)
    if isinstance(store, ReferencingStore) and before is not None:  # payloads no record refers to any more
        freed = store.freed.bytes - before.bytes
        payloads = store.freed.payloads - before.payloads
        _say(
            args,
            {"pruned": count, "payloads_removed": payloads, "bytes_freed": freed},
            f"pruned {count} record(s) older than {older}; "
            f"removed {payloads} payload(s), {freed:,} bytes freed",
        )
        return 0
    _say(args, {"pruned": count}, f"pruned {count} record(s) older than {older}")
    return 0


def _dry_run(args: argparse.Namespace, client: Reservations, older: str) -> int:
    """List what ``prune`` would clear, a page at a time as the store finds it
    (:meth:`Store.prunable_pages <dibs.stores.base.Store.prunable_pages>`: the candidates only, not the
    namespace), printing each page as it is read; remove nothing."""
    namespace = None if args.all else client.namespace
    columns = ["namespace", "key", "status", "token", "detail"]
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    found, skipped = 0, 0
    if args.json:
        print('{"would_prune": [', end="")
    for page in client.store.prunable_pages(namespace, args.older_than):
        skipped += page.skipped
        if args.json:
            for state in page.states:
                print(("" if found == 0 else ", ") + json.dumps(str(state.key)), end="")
                found += 1
        elif page.states or (found == 0 and page.after is None):
            print_table([_summary(s) for s in page.states], columns, width=width, header=found == 0)
            found += len(page.states)
        sys.stdout.flush()
    if args.json:
        print("]}")
    else:
        print(f"would prune {found} record(s) older than {older} (dry run: nothing removed)")
    _say_skipped(skipped)
    return 0


@contextlib.contextmanager
def _progress(done: str) -> Iterator[Callable[[int], None] | None]:
    """On a terminal (stderr), a line that counts the records a removal has changed so far, redrawn as
    it goes and cleared at the end; elsewhere nothing (``None``: the store is not asked to tell)."""
    if not sys.stderr.isatty():
        yield None
        return

    def show(count: int) -> None:
        sys.stderr.write(f"\r\x1b[Kdibs: {done} {count:,} record(s) so far…")
        sys.stderr.flush()

    try:
        yield show
    finally:
        sys.stderr.write("\r\x1b[K")
        sys.stderr.flush()


def _say_skipped(listing: object) -> None:
    """Tell (on stderr, so the listing itself stays parseable) how many records could not be read:
    ``listing`` is a :class:`Listing` or their number."""
    skipped = (
        len(listing.skipped) if isinstance(listing, Listing) else listing if isinstance(listing, int) else 0
    )
    if skipped:
        print(
            f"dibs: skipped {skipped} unreadable record(s) (warnings above name them); "
            "'dibs show KEY' reports one in detail",
            file=sys.stderr,
        )


def _say(args: argparse.Namespace, doc: dict[str, Any], text: str) -> None:
    print(json.dumps(doc) if args.json else text)


def _worth_listing(state: KeyState) -> bool:
    """A record with nothing stored, no lease and no failure (a forgotten key) says nothing: not listed."""
    return state.artifact is not None or state.lease is not None or state.failure is not None


def _summary(state: KeyState) -> dict[str, Any]:
    lease, artifact, failure = state.lease, state.artifact, state.failure
    if artifact is not None:
        computed = "" if artifact.compute_seconds is None else f" in {duration(artifact.compute_seconds)}"
        detail = (
            f"{size(artifact.size)} by {artifact.producer}{computed}, "
            f"{duration(state.now - artifact.created_at)} ago"
        )
    elif lease is not None:
        remaining = lease.expires_at - state.now
        if remaining > 0:
            detail = f"attempt {lease.attempt}, lease expires in {duration(remaining)}"
        else:
            expired = duration(-remaining)
            detail = f"attempt {lease.attempt}, lease expired {expired} ago; the next caller takes over"
    elif failure is not None:
        detail = f"{failure.count} failure(s), the last by {failure.owner}: {failure.error}"
    else:
        detail = ""
    return {
        "namespace": state.key.namespace,
        "key": state.key.name,
        "status": state.status,
        "holder": lease.owner if lease else None,
        "token": lease.token.fence if lease else (artifact.fence if artifact else None),
        "compute_seconds": artifact.compute_seconds if artifact else None,
        "detail": detail,
    }


def _details(state: KeyState) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "key": str(state.key),
        "status": state.status,
        "fence": state.fence,
        "attempts": state.attempts,
        "store_now": instant(state.now),
    }
    if state.lease is not None:
        lease = state.lease
        doc |= {
            "holder": lease.owner,
            "token": lease.token.fence,
            "attempt": lease.attempt,
            "acquired_at": instant(lease.acquired_at),
            "expires_at": instant(lease.expires_at),
            "expires_in_s": round(lease.expires_at - state.now, 3),
            "max_expires_at": instant(lease.max_expires_at),
        }
    if state.artifact is not None:
        fields = (field.name for field in dataclasses.fields(ArtifactRecord) if field.name != "payload")
        artifact = {name: getattr(state.artifact, name) for name in fields}
        if isinstance(state.artifact, ReferencedArtifact):  # kept in a payload store: say where
            artifact["payload"] = state.artifact.uri
        artifact["created_at"] = instant(state.artifact.created_at)
        if state.artifact.compute_seconds is not None:  # how long its producer computed it
            artifact["compute_seconds"] = round(state.artifact.compute_seconds, 3)
        doc |= {f"artifact_{k}": v for k, v in artifact.items()}
    if state.failure is not None:
        doc |= {
            "failures": state.failure.count,
            "last_error": state.failure.error,
            "failed_by": state.failure.owner,
            "failed_at": instant(state.failure.at),
        }
    return doc


#: Every command of this module, by its name on the command line.
COMMANDS: dict[str, Command] = {
    "ls": _ls,
    "top": top,
    "show": _show,
    "release": _Repair(lambda client, key: client.force_release(key), "released", "no lease to release"),
    "forget": _Repair(lambda client, key: client.forget(key), "forgotten", "nothing stored"),
    "reap": _reap,
    "prune": _prune,
}

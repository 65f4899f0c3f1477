"""The ``dibs`` command: run a command once across processes, and inspect and repair reservations.

``dibs run --key K -- COMMAND`` runs COMMAND exactly once across every concurrent ``dibs run`` on the
same key and store: its stdout becomes the artifact, every other invocation waits and prints the
same stdout, and later invocations print it at once. A failing COMMAND releases the key with the
failure recorded (so a waiter takes over) and ``dibs run`` exits with COMMAND's status.

This module is the command line itself (options, help, exit statuses, the inspection and repair
commands); the moving parts of ``run`` and ``wait`` live in :mod:`dibs._cli`. Results go to stdout,
everything else to stderr (see :mod:`dibs._cli.console`). Nothing here is imported by ``import dibs``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shutil
import sys
from collections.abc import Sequence
from typing import Any

from dibs import __version__
from dibs._cli import names
from dibs._cli.console import Console
from dibs._cli.stops import Stopped, StopSignals
from dibs._cli.text import duration, instant, parse_duration, print_table, size
from dibs.client import Reservations
from dibs.config import STORE_URL_ENV
from dibs.display import printable
from dibs.errors import (
    ArtifactCorrupted,
    ConfigurationError,
    CorruptRecord,
    ReservationError,
    SerializationError,
    StoreUnavailable,
    WaitTimeout,
)
from dibs.payloads import PAYLOADS_URL_ENV, ReferencedArtifact, ReferencingStore
from dibs.records import ArtifactRecord, KeyState
from dibs.stores import transitions
from dibs.stores.base import Listing

__all__ = ["main", "print_table"]

EXIT_NOTHING = 1  # show / release / forget: nothing there to show, release or forget
EXIT_USAGE = 2  # a bad option, key, namespace or store URL, a missing driver
EXIT_DATAERR = 65  # EX_DATAERR: a stored artifact or record that cannot be read
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE: the store cannot be reached
EXIT_TIMEOUT = 75  # EX_TEMPFAIL: the wait timed out; try again later
EXIT_PIPE = 141  # 128 + SIGPIPE: whoever read stdout went away

DEFAULT_NAMESPACE = "default"

# -- help -------------------------------------------------------------------------------------------

_COMMON_EXITS = f"""\
  {EXIT_USAGE:<5}  usage or configuration error: a bad option, key, namespace or store URL, a missing driver
  {EXIT_DATAERR:<5}  a stored artifact or record cannot be read (corrupt, or of a serializer dibs cannot read)
  {EXIT_UNAVAILABLE:<5}  the store cannot be reached"""

_STOP_EXITS = "  130    interrupted (SIGINT, Ctrl-C); 143 terminated (SIGTERM); 129 hung up (SIGHUP)"

_WAIT_EXIT = (
    f"  {EXIT_TIMEOUT:<5}  --timeout passed before the key was done; the message says who holds it, "
    "or why nobody does"
)

_GLOBAL_NOTE = (
    "--store, --namespace, --json and -v may be given before or after the command, "
    f"e.g. 'dibs --json ls' or 'dibs ls --json'. The store defaults to ${STORE_URL_ENV}, else the "
    "embedded SQLite database."
)

_NAMES_NOTE = (
    "KEY may be given in its readable form: a derived key reads NAME[@VERSION]/DIGEST, and NAME, "
    "NAME@VERSION or NAME/ followed by the start of the digest stand for it when they name exactly one "
    "key (several: the command lists them and changes nothing)."
)


def _exits(*lines: str) -> str:
    return "exit status:\n" + "\n".join(lines)


_COMMANDS: dict[str, tuple[str, str, str]] = {
    # name: (one-line help, description, exit statuses)
    "run": (
        "run COMMAND once per key; print its stdout",
        "Run COMMAND once per key across every 'dibs run' that shares the store, and print its stdout.\n\n"
        "The first invocation to ask takes the key's lease, runs COMMAND (heartbeating the lease) and stores "
        "its stdout as the key's artifact, streaming it as it comes. Every concurrent invocation waits (a "
        "live status line on a terminal) and then prints the stored stdout; later ones print it at once. If "
        "COMMAND fails, the key is released with the failure recorded, so a waiter takes over at once; if "
        "the holder dies, its lease expires after --ttl and a waiter takes over.\n\n"
        "--refresh computes it again even though it is stored (under the lease, so of several concurrent "
        "refreshes one computes and the others print its output); --max-age DURATION treats a stored output "
        "that old as missing.\n\n"
        "COMMAND runs in its own process group, reading /dev/null when stdin is a terminal. SIGINT, SIGTERM "
        "and SIGHUP are forwarded to that group; after --kill-after seconds (or at a second signal) it is "
        "killed. The key is then released with 'stopped by SIGINT' (or SIGTERM, SIGHUP) recorded, and "
        "nothing is stored. If dibs itself is killed outright, a guard process kills COMMAND's group (and, "
        "on Linux, its descendants that left the group, e.g. with setsid), so COMMAND never outlives its "
        "lease; a daemon that double-forked out of the process tree escapes.",
        _exits(
            "  0      the artifact was printed: computed here, waited for, or already stored",
            "  N      COMMAND's own non-zero status (128+N when signal N killed it); the failure is recorded",
            _COMMON_EXITS,
            _WAIT_EXIT,
            "  127    COMMAND could not be started",
            _STOP_EXITS + " (each forwarded to COMMAND first)",
        ),
    ),
    "wait": (
        "wait until KEY is done; print its artifact",
        "Wait until KEY has an artifact, then print it; reserve nothing.\n\n"
        "On a terminal a live line shows who is computing the key, since when, when its lease expires, "
        "takeovers, and the last failure if the key failed and nobody is computing it. Elsewhere nothing is "
        "shown unless -v (one line per event; JSON lines with --json).",
        _exits("  0      the artifact was printed", _COMMON_EXITS, _WAIT_EXIT, _STOP_EXITS),
    ),
    "ls": (
        "list keys and their state",
        "List the keys of the namespace (or of every namespace) and their state: done, held, expired or "
        "failed, with the holder, the fencing token and a detail. With NAME, only the keys it names: a key's "
        "name, its readable part (NAME, NAME@VERSION, NAME/ and the start of the digest) or a shell-style "
        "pattern ('load_*'). A key with nothing stored, no lease and no failure (forgotten, or released "
        "without a failure) has nothing to show and is left out; 'dibs show KEY' still shows it. On a "
        "terminal the detail is wrapped at word boundaries.",
        _exits("  0      listed (possibly nothing)", _COMMON_EXITS, _STOP_EXITS),
    ),
    "top": (
        "the live state of a namespace",
        "Show what the namespace looks like now, redrawn every --interval seconds on a terminal (Ctrl-C "
        "ends it): the keys held (holder, token, how long held, when the lease expires), leases expired "
        "without a taker yet, the latest artifacts (producer, compute time, age) and the latest failures. "
        "With --once, or when the output is not a terminal, it prints once; --json prints one snapshot. "
        "Hits and waits are not recorded in the store: the metrics of docs/observability.md count them.",
        _exits("  0      shown", _COMMON_EXITS, _STOP_EXITS),
    ),
    "show": (
        "everything about one key",
        "Show everything the store knows about KEY: status, fencing token, lease, artifact and failures.\n\n"
        + _NAMES_NOTE,
        _exits(
            "  0      shown",
            f"  {EXIT_NOTHING:<5}  the store has never seen KEY",
            _COMMON_EXITS,
            _STOP_EXITS,
        ),
    ),
    "release": (
        "force-release KEY's lease (repair)",
        "Force-release KEY's lease, live or expired, so that the next caller takes the key at once. Meant "
        "for repairs, when the holder is known to be gone.\n\n" + _NAMES_NOTE,
        _exits("  0      released", f"  {EXIT_NOTHING:<5}  KEY had no lease", _COMMON_EXITS, _STOP_EXITS),
    ),
    "forget": (
        "drop KEY's artifact and failures",
        "Drop KEY's artifact and recorded failures, so that the next caller computes it again.\n\n"
        + _NAMES_NOTE,
        _exits(
            "  0      forgotten",
            f"  {EXIT_NOTHING:<5}  nothing was stored for KEY",
            _COMMON_EXITS,
            _STOP_EXITS,
        ),
    ),
    "reap": (
        "clear expired leases nobody took over",
        "Clear the expired leases nobody took over (their holders died), and the records left holding "
        "nothing (no lease, artifact or failure: a released lock, a forgotten key), in the namespace or "
        "everywhere. A cleared record stays as a hidden tombstone that keeps the key's fencing token, "
        "so tokens never go back.",
        _exits("  0      done (the count may be 0)", _COMMON_EXITS, _STOP_EXITS),
    ),
    "prune": (
        "remove artifacts and failures older than a duration",
        "Clear the records whose artifact (or last failure) is older than --older-than by the store's "
        "clock, and the records holding nothing, in the namespace or everywhere: the next caller of a "
        "pruned key computes it again (with a higher fencing token: a hidden tombstone keeps it). A "
        "key someone holds is never touched (nor one whose lease ended less than that long ago). "
        "DURATION: 90 (seconds), 90s, 15m, 12h, 7d, 2w or sums such as 1h30m. "
        "--dry-run lists what would be removed and removes nothing.",
        _exits("  0      done (the count may be 0)", _COMMON_EXITS, _STOP_EXITS),
    ),
}


def _add_globals(parser: argparse.ArgumentParser, *, after_command: bool) -> None:
    """The global options: on the main parser with their defaults, and on every command's parser
    with no default at all, so that given after the command they win, and absent they change nothing."""
    unset: dict[str, Any] = {"default": argparse.SUPPRESS} if after_command else {}
    parser.add_argument(
        "--store",
        metavar="URL",
        help=f"store URL (default: ${STORE_URL_ENV}, else the embedded SQLite database)",
        **unset,
    )
    parser.add_argument("--namespace", "-n", help=f"key namespace (default: {DEFAULT_NAMESPACE})", **unset)
    parser.add_argument(
        "--payloads",
        metavar="URL",
        help="payload store for artifacts over 64 KiB, e.g. file:///shared/dibs "
        f"(default: ${PAYLOADS_URL_ENV}, else none: artifacts stay in the records)",
        **unset,
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="machine-readable output (and JSON lines on stderr with -v)",
        **unset,
    )
    parser.add_argument(
        "-v", "--verbose", action="count", help="say what dibs does, on stderr (-vv: debug)", **unset
    )


def _parser() -> argparse.ArgumentParser:
    command_globals = argparse.ArgumentParser(add_help=False)
    _add_globals(command_globals, after_command=True)
    formatter = argparse.RawDescriptionHelpFormatter

    parser = argparse.ArgumentParser(
        prog="dibs",
        description="Leases on cache keys: compute each key once across processes, runs and machines.",
        epilog=_wrap_paragraphs(_GLOBAL_NOTE)
        + "\n\n"
        + _exits(
            "  0      success",
            f"  {EXIT_NOTHING:<5}  show/release/forget: nothing there",
            _COMMON_EXITS,
            _WAIT_EXIT,
            "  N      run: COMMAND's own status",
            _STOP_EXITS,
        )
        + "\n\nEach command's --help says which of these it uses.",
        formatter_class=formatter,
    )
    _add_globals(parser, after_command=False)
    parser.set_defaults(verbose=0, namespace=None)
    parser.add_argument("--version", action="version", version=f"dibs {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str) -> argparse.ArgumentParser:
        summary, description, exits = _COMMANDS[name]
        return commands.add_parser(
            name,
            parents=[command_globals],
            help=summary,
            description=_wrap_paragraphs(description),
            epilog=exits + "\n\n" + _wrap_paragraphs(_GLOBAL_NOTE),
            formatter_class=formatter,
        )

    run = command("run")
    run.add_argument("--key", "-k", required=True, help="the cache key of this computation")
    run.add_argument(
        "--ttl", type=_seconds(zero=False), default=60.0, help="lease ttl in seconds (default: %(default)s)"
    )
    run.add_argument(
        "--timeout",
        type=_seconds(zero=True),
        default=None,
        help="give up waiting after this many seconds (exit 75)",
    )
    run.add_argument("--owner", help="a stable logical identity (a retry with the same owner re-enters)")
    run.add_argument(
        "--refresh",
        action="store_true",
        help="compute it again even if it is stored (the new output replaces it)",
    )
    run.add_argument(
        "--max-age",
        type=_max_age,
        default=None,
        metavar="DURATION",
        help="a stored output older than this (store clock) counts as missing, e.g. 12h or 7d",
    )
    run.add_argument(
        "--kill-after",
        type=_seconds(zero=True),
        default=10.0,
        metavar="SECONDS",
        help="after forwarding a stop signal, kill COMMAND if it is still running this much later "
        "(default: %(default)s)",
    )
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS...]")

    key_help = "the key's name (in --namespace)"
    wait = command("wait")
    wait.add_argument("key", help=key_help)
    wait.add_argument(
        "--timeout", type=_seconds(zero=True), default=None, help="give up after this many seconds (exit 75)"
    )

    listing = command("ls")
    listing.add_argument(
        "name", nargs="?", help="only the keys this names: NAME, NAME@VERSION, NAME/DIGEST-START or a glob"
    )
    listing.add_argument("--all", action="store_true", help="every namespace")

    watch_top = command("top")
    watch_top.add_argument("--all", action="store_true", help="every namespace")
    watch_top.add_argument("--once", action="store_true", help="print once and exit")
    watch_top.add_argument(
        "--interval",
        type=_seconds(zero=False),
        default=2.0,
        help="seconds between refreshes on a terminal (default: %(default)s)",
    )

    key_help = "the key, or its readable form (NAME, NAME@VERSION, NAME/DIGEST-START) if that names one key"
    command("show").add_argument("key", help=key_help)
    command("release").add_argument("key", help=key_help)
    command("forget").add_argument("key", help=key_help)
    command("reap").add_argument("--all", action="store_true", help="every namespace")
    prune = command("prune")
    prune.add_argument(
        "--older-than",
        type=_duration,
        required=True,
        metavar="DURATION",
        help="remove what is older than this, e.g. 30d, 12h, 1h30m (store clock)",
    )
    prune.add_argument("--all", action="store_true", help="every namespace")
    prune.add_argument("--dry-run", action="store_true", help="list what would be removed; remove nothing")

    demo = commands.add_parser(
        "demo",
        help="watch several processes share one slow computation",
        description="Watch several processes share one slow computation, on a temporary SQLite store.",
    )
    demo.add_argument("--workers", type=int, default=4, help="worker processes (default: %(default)s)")
    demo.add_argument("--work-seconds", type=float, default=3.0, help="length of the slow computation")
    return parser


def _seconds(*, zero: bool) -> Any:
    """An argparse type: a finite number of seconds, greater than 0 (or at least 0 with ``zero``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not (value >= 0 if zero else value > 0) or value == float("inf"):
            raise argparse.ArgumentTypeError(
                f"expected a number of seconds {'>= 0' if zero else '> 0'}, got {text!r}"
            )
        return value

    return parse


def _duration(text: str) -> float:
    """An argparse type: :func:`~dibs._cli.text.parse_duration`, its message as the usage error."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _max_age(text: str) -> float:
    seconds = _duration(text)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(
            f"expected a duration greater than 0, got {text!r} "
            "(to compute again whatever is stored, use --refresh)"
        )
    return seconds


def _wrap_paragraphs(text: str) -> str:
    import textwrap

    width = min(100, shutil.get_terminal_size((100, 24)).columns - 2)
    return "\n\n".join(textwrap.fill(p, width) for p in text.split("\n\n"))


# -- main -------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "demo":
        if args.store is not None or args.json or args.namespace is not None:
            parser.error(
                "dibs demo runs on a temporary store of its own: it takes no --store, --namespace or --json"
            )
        from dibs.demo import run_demo

        return run_demo(workers=args.workers, work_seconds=args.work_seconds)
    if args.namespace is None:
        args.namespace = DEFAULT_NAMESPACE
    console = Console(sys.stderr, verbose=args.verbose, json_lines=args.json)
    _route_logs(console, args.verbose)
    with StopSignals() as stops:
        try:
            return _dispatch(args, console, stops)
        except Stopped as stop:
            console.clear_status()
            return stop.exit_status
        except KeyboardInterrupt:  # raised before the handlers were in place
            console.clear_status()
            return 130
        except BrokenPipeError:
            _silence_stdout()
            return EXIT_PIPE
        except ReservationError as exc:
            console.clear_status()
            console.problem("error", str(exc), exit_status=_exit_status(exc))
            return _exit_status(exc)


def _exit_status(exc: ReservationError) -> int:
    if isinstance(exc, WaitTimeout):
        return EXIT_TIMEOUT
    if isinstance(exc, StoreUnavailable):
        return EXIT_UNAVAILABLE
    if isinstance(exc, ConfigurationError):
        return EXIT_USAGE
    if isinstance(exc, ArtifactCorrupted | CorruptRecord | SerializationError):
        return EXIT_DATAERR
    return 1


def _route_logs(console: Console, verbose: int) -> None:
    """dibs's own log goes through the console (not to the root logger: no other library's)."""
    logger = logging.getLogger("dibs")
    for handler in [h for h in logger.handlers if getattr(h, "console", None) is not None]:
        logger.removeHandler(handler)
    logger.addHandler(console.log_handler())
    logger.setLevel(logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG)
    logger.propagate = False


def _silence_stdout() -> None:
    # Python flushes stdout once more at exit: with the reader gone that would print a traceback.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _dispatch(args: argparse.Namespace, console: Console, stops: StopSignals) -> int:
    from dibs._cli import run as running

    if args.command == "run":
        return running.run(args, console, stops)
    if args.command == "wait":
        return running.wait(args, console)
    with Reservations(args.store, namespace=args.namespace, payloads=args.payloads) as client:
        return _admin(args, client)


# -- inspection and repair ----------------------------------------------------------------------------


def _admin(args: argparse.Namespace, client: Reservations) -> int:
    if args.command == "ls":
        listing = client.list(all_namespaces=args.all)
        states = [s for s in names.select(listing, args.name) if _worth_listing(s)]
        states.sort(key=lambda s: (s.key.namespace, s.key.name))
        rows = [_summary(s) for s in states]
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
            print_table(rows, ["namespace", "key", "status", "holder", "token", "detail"], width=width)
        _say_skipped(listing)
        return 0
    if args.command == "top":
        from dibs._cli.top import top

        return top(args, client)
    if args.command == "show":
        state = client.status(names.resolve(client, args.key, "a key to show"))
        doc = _details(state)
        if args.json:
            print(json.dumps(doc, indent=2))
        else:
            width = max(map(len, doc))
            for name, value in doc.items():
                print(f"{name:<{width}}  {'-' if value is None else printable(value)}")
        return 0 if state.status != "free" or state.fence else EXIT_NOTHING
    if args.command == "release":
        key = names.resolve(client, args.key, "a key to release")
        done = client.force_release(key)
        _say(
            args,
            {"key": key.name, "released": done},
            f"{key.name}: released" if done else f"{key.name}: no lease to release",
        )
        return 0 if done else EXIT_NOTHING
    if args.command == "forget":
        key = names.resolve(client, args.key, "a key to forget")
        done = client.forget(key)
        _say(
            args,
            {"key": key.name, "forgotten": done},
            f"{key.name}: forgotten" if done else f"{key.name}: nothing stored",
        )
        return 0 if done else EXIT_NOTHING
    if args.command == "reap":
        count = client.reap(all_namespaces=args.all)
        _say(
            args,
            {"reaped": count},
            f"reaped {count} record(s): expired leases and empty records cleared",
        )
        return 0
    if args.command == "prune":
        return _prune(args, client)
    raise AssertionError(args.command)  # pragma: no cover - argparse restricts commands


def _prune(args: argparse.Namespace, client: Reservations) -> int:
    older = duration(args.older_than)
    if args.dry_run:
        listing = client.list(all_namespaces=args.all)
        doomed = [s for s in listing if transitions.prunable(s, args.older_than)]
        doomed.sort(key=lambda s: (s.key.namespace, s.key.name))
        if args.json:
            print(json.dumps({"would_prune": [str(s.key) for s in doomed]}))
        else:
            print_table([_summary(s) for s in doomed], ["namespace", "key", "status", "token", "detail"])
            print(f"would prune {len(doomed)} record(s) older than {older} (dry run: nothing removed)")
        _say_skipped(listing)
        return 0
    store = client.store
    before = store.freed if isinstance(store, ReferencingStore) else None
    count = client.prune(args.older_than, all_namespaces=args.all)
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


def _say_skipped(listing: object) -> None:
    """Tell (on stderr, so the listing itself stays parseable) how many records could not be read."""
    skipped = listing.skipped if isinstance(listing, Listing) else ()
    if skipped:
        print(
            f"dibs: skipped {len(skipped)} unreadable record(s) (warnings above name them); "
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


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

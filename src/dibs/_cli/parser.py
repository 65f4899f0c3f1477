"""The ``dibs`` command line: its options, its help texts, and the checks argparse cannot make.

Every command's help says what it does and which exit statuses it uses (:mod:`dibs._cli.exits`);
:func:`parse` reads the command line into the namespace the commands take, with ``--store``,
``--namespace``, ``--payloads``, ``--json`` and ``-v`` accepted before or after the command.
"""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Sequence
from typing import Any

from dibs import __version__
from dibs._cli.exits import EXIT_DATAERR, EXIT_NOTHING, EXIT_TIMEOUT, EXIT_UNAVAILABLE, EXIT_USAGE
from dibs._cli.text import parse_duration
from dibs.config import STORE_URL_ENV
from dibs.payloads import PAYLOADS_URL_ENV

__all__ = ["DEFAULT_NAMESPACE", "parse"]

DEFAULT_NAMESPACE = "default"


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line as the commands take it: ``namespace`` filled in, except for ``demo``, which
    runs on a store of its own and refuses the options that would name another (a usage error)."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "demo":
        if args.store is not None or args.json or args.namespace is not None:
            parser.error(
                "dibs demo runs on a temporary store of its own: it takes no --store, --namespace or --json"
            )
    elif args.namespace is None:
        args.namespace = DEFAULT_NAMESPACE
    return args


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
        "Wait until KEY has an artifact, then print it; reserve nothing. An artifact in a payload store "
        "is checked to its end (size and SHA-256, into a temporary file) before its first byte is "
        "printed; one that is not the recorded one is never printed: a warning says so, and the wait goes "
        "on for a newer artifact.\n\n"
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
        "terminal the detail is wrapped at word boundaries.\n\n"
        "Keys are read from the store a page at a time, in key order, and printed as they come. --state "
        "lists only the keys of one status (--state free lists the keys left out above). --limit N stops "
        "after N keys and, when more follow, prints on stderr the cursor to continue with (--after CURSOR; "
        'with --jsonl, a last line {"after": CURSOR}). --jsonl prints one JSON object per key.',
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
        f"(default: ${PAYLOADS_URL_ENV}; else, on the embedded SQLite store, the folder payloads beside "
        "its file; else none: artifacts stay in the records)",
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
    _add_seconds(run, "--ttl", "lease ttl in seconds", zero=False, default=60.0)
    _add_seconds(run, "--timeout", "give up waiting after this many seconds (exit 75)", zero=True)
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
    _add_seconds(
        run,
        "--kill-after",
        "after forwarding a stop signal, kill COMMAND if it is still running this much later",
        zero=True,
        default=10.0,
        metavar="SECONDS",
    )
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS...]")

    key_help = "the key's name (in --namespace)"
    wait = command("wait")
    wait.add_argument("key", help=key_help)
    _add_seconds(wait, "--timeout", "give up after this many seconds (exit 75)", zero=True)

    listing = command("ls")
    listing.add_argument(
        "name", nargs="?", help="only the keys this names: NAME, NAME@VERSION, NAME/DIGEST-START or a glob"
    )
    listing.add_argument("--all", action="store_true", help="every namespace")
    listing.add_argument(
        "--state", choices=("held", "expired", "done", "failed", "free"), help="only the keys of this status"
    )
    listing.add_argument(
        "--limit", type=_count, metavar="N", help="at most N keys; the cursor of the next ones goes to stderr"
    )
    listing.add_argument("--after", metavar="CURSOR", help="start after this cursor (given by --limit)")
    listing.add_argument("--jsonl", action="store_true", help="one JSON object per key, as they are read")

    watch_top = command("top")
    watch_top.add_argument("--all", action="store_true", help="every namespace")
    watch_top.add_argument("--once", action="store_true", help="print once and exit")
    _add_seconds(watch_top, "--interval", "seconds between refreshes on a terminal", zero=False, default=2.0)

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


def _count(text: str) -> int:
    """An argparse type: a whole number of records, at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of keys, at least 1, not {text!r}")
    return value


def _add_seconds(
    parser: argparse.ArgumentParser,
    flag: str,
    help: str,
    *,
    zero: bool,
    default: float | None = None,
    **more: Any,
) -> None:
    """Add a number-of-seconds option (:func:`_seconds`, greater than 0 or with ``zero`` at least 0);
    one with a default says it at the end of its help, as every option of the CLI does."""
    said = help if default is None else f"{help} (default: %(default)s)"
    parser.add_argument(flag, type=_seconds(zero=zero), default=default, help=said, **more)


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

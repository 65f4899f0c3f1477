"""The ``dibs`` command: run a command once across processes, and inspect and repair reservations.

``dibs run --key K -- COMMAND`` runs COMMAND exactly once across every concurrent ``dibs run`` on the
same key and store: its stdout becomes the artifact, every other invocation waits and prints the
same stdout, and later invocations print it at once. A failing COMMAND releases the key with the
failure recorded (so a waiter takes over) and ``dibs run`` exits with COMMAND's status.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import logging
import subprocess
import sys
from collections.abc import Sequence
from typing import IO, Any

from dibs.client import Reservations
from dibs.config import STORE_URL_ENV
from dibs.display import printable
from dibs.errors import ReservationError, WaitTimeout
from dibs.outcomes import Acquired, Hit
from dibs.records import KeyState
from dibs.stores.base import Listing

__all__ = ["main"]

EXIT_TIMEOUT = 75  # EX_TEMPFAIL: try again later
EXIT_ERROR = 2


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--store", metavar="URL", help=f"store URL (default: ${STORE_URL_ENV}, else the embedded SQLite)"
    )
    common.add_argument("--namespace", "-n", default="default", help="key namespace (default: %(default)s)")
    common.add_argument("--json", action="store_true", help="machine-readable output")

    parser = argparse.ArgumentParser(
        prog="dibs",
        description="Leases on cache keys: compute each key once across processes, runs and machines.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log what dibs does (to stderr)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser("run", parents=[common], help="run COMMAND once per key; print its stdout")
    run.add_argument("--key", "-k", required=True, help="the cache key of this computation")
    run.add_argument("--ttl", type=float, default=60.0, help="lease ttl in seconds (default: %(default)s)")
    run.add_argument("--timeout", type=float, default=None, help="give up waiting after this many seconds")
    run.add_argument("--owner", help="a stable logical identity (a retry with the same owner re-enters)")
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS...]")

    wait = commands.add_parser("wait", parents=[common], help="wait until KEY is done; print its artifact")
    wait.add_argument("key")
    wait.add_argument("--timeout", type=float, default=None)

    listing = commands.add_parser("ls", parents=[common], help="list keys and their state")
    listing.add_argument("--all", action="store_true", help="every namespace")

    show = commands.add_parser("show", parents=[common], help="everything about one key")
    show.add_argument("key")

    release = commands.add_parser("release", parents=[common], help="force-release KEY's lease (repair)")
    release.add_argument("key")

    forget = commands.add_parser("forget", parents=[common], help="drop KEY's artifact and failures")
    forget.add_argument("key")

    reap = commands.add_parser("reap", parents=[common], help="clear expired leases nobody took over")
    reap.add_argument("--all", action="store_true", help="every namespace")

    demo = commands.add_parser("demo", help="watch several processes share one slow computation")
    demo.add_argument("--workers", type=int, default=4, help="worker processes (default: %(default)s)")
    demo.add_argument("--work-seconds", type=float, default=3.0, help="length of the slow computation")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handler = _StderrHandler()
    handler.setFormatter(_PrintableFormatter("dibs: %(levelname)s %(message)s"))
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, handlers=[handler])
    if args.command == "demo":
        from dibs.demo import run_demo

        return run_demo(workers=args.workers, work_seconds=args.work_seconds)
    try:
        if args.command == "run":
            return _run(args)
        with Reservations(args.store, namespace=args.namespace) as client:
            return _admin(args, client)
    except WaitTimeout as exc:
        print(f"dibs: {printable(exc)}", file=sys.stderr)
        return EXIT_TIMEOUT
    except ReservationError as exc:
        print(f"dibs: {printable(exc)}", file=sys.stderr)
        return EXIT_ERROR


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at the time (``main`` may run more than once in a process)."""

    @property
    def stream(self) -> IO[str]:
        return sys.stderr

    @stream.setter
    def stream(self, _value: IO[str]) -> None:
        pass


class _PrintableFormatter(logging.Formatter):
    """Log lines quote owners and foreign records: escape what a terminal would act on."""

    def format(self, record: logging.LogRecord) -> str:
        lines = super().format(record).split("\n")  # a traceback keeps its lines
        return "\n".join(printable(line) for line in lines)


# -- dibs run -----------------------------------------------------------------------------------


def _run(args: argparse.Namespace) -> int:
    command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not command:
        print("dibs run: give the command after '--', e.g. dibs run --key K -- ./build.sh", file=sys.stderr)
        return EXIT_ERROR
    with Reservations(args.store, namespace=args.namespace, ttl=args.ttl, serializer="bytes") as client:
        got = client.acquire(args.key, args.owner, timeout=args.timeout)
        if isinstance(got, Hit):
            _write_artifact(got.value)
            return 0
        return _run_holding(client, got, command)


class _CommandFailed(Exception):
    """The command under the lease exited with a non-zero status (recorded as the key's failure)."""

    def __init__(self, command: list[str], status: int) -> None:
        super().__init__(f"command {' '.join(command)!r} exited with status {status}")
        self.status = status


def _run_holding(client: Reservations, got: Acquired, command: list[str]) -> int:
    """Run ``command`` under the lease (the core's hold loop), streaming its stdout through while
    keeping a copy: the copy becomes the artifact."""
    logging.getLogger("dibs").info("%s: computing with token %s", got.key, got.lease.token)

    def work() -> bytes:
        try:
            process = subprocess.Popen(command, stdout=subprocess.PIPE)
        except OSError as exc:
            raise _CommandFailed(command, 127) from exc
        assert process.stdout is not None
        captured = _tee(process.stdout, sys.stdout.buffer)
        status = process.wait()
        if status != 0:
            raise _CommandFailed(command, status)
        return captured

    try:
        client.hold(got, work)
    except _CommandFailed as failed:
        if failed.status == 127 and failed.__cause__ is not None:
            print(f"dibs run: cannot start {command[0]!r}: {failed.__cause__}", file=sys.stderr)
        return failed.status
    return 0


def _tee(source: IO[bytes], sink: IO[bytes]) -> bytes:
    chunks: list[bytes] = []
    while chunk := source.read1(65536) if hasattr(source, "read1") else source.read(65536):
        chunks.append(chunk)
        sink.write(chunk)
        sink.flush()
    return b"".join(chunks)


def _write_artifact(value: Any) -> None:
    if isinstance(value, bytes):
        sys.stdout.buffer.write(value)
    else:  # written by a Python or orchestrator caller with another serializer
        sys.stdout.write(json.dumps(value) + "\n")
    sys.stdout.flush()


# -- inspection and repair ------------------------------------------------------------------------


def _admin(args: argparse.Namespace, client: Reservations) -> int:
    if args.command == "wait":
        hit = client.wait(args.key, timeout=args.timeout, for_artifact=True)
        assert hit is not None
        _write_artifact(hit.value)
        return 0
    if args.command == "ls":
        listing = client.list(all_namespaces=args.all)
        states = list(listing)
        _emit(
            args, [_summary(s) for s in states], ["namespace", "key", "status", "holder", "token", "detail"]
        )
        _say_skipped(listing)
        return 0
    if args.command == "show":
        state = client.status(args.key)
        doc = _details(state)
        if args.json:
            print(json.dumps(doc, indent=2))
        else:
            width = max(map(len, doc))
            for name, value in doc.items():
                print(f"{name:<{width}}  {'-' if value is None else printable(value)}")
        return 0 if state.status != "free" or state.fence else 1
    if args.command == "release":
        done = client.force_release(args.key)
        _say(args, {"key": args.key, "released": done}, "released" if done else "no lease to release")
        return 0 if done else 1
    if args.command == "forget":
        done = client.forget(args.key)
        _say(args, {"key": args.key, "forgotten": done}, "forgotten" if done else "nothing stored")
        return 0 if done else 1
    if args.command == "reap":
        count = client.reap(all_namespaces=args.all)
        _say(args, {"reaped": count}, f"reaped {count} expired lease(s)")
        return 0
    raise AssertionError(args.command)  # pragma: no cover - argparse restricts commands


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


def _when(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    try:
        return dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat(timespec="milliseconds")
    except (OverflowError, ValueError, OSError):  # beyond the year 9999, or not a number at all
        return f"{seconds!r} (not a date)"


def _summary(state: KeyState) -> dict[str, Any]:
    lease, artifact, failure = state.lease, state.artifact, state.failure
    if artifact is not None:
        detail = f"{artifact.size} B by {artifact.producer}"
    elif lease is not None:
        remaining = lease.expires_at - state.now
        detail = f"expires in {remaining:.1f}s" if remaining > 0 else f"expired {-remaining:.1f}s ago"
    elif failure is not None:
        detail = f"{failure.count} failure(s): {failure.error[:60]}"
    else:
        detail = ""
    return {
        "namespace": state.key.namespace,
        "key": state.key.name,
        "status": state.status,
        "holder": lease.owner if lease else None,
        "token": lease.token.fence if lease else (artifact.fence if artifact else None),
        "detail": detail,
    }


def _details(state: KeyState) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "key": str(state.key),
        "status": state.status,
        "fence": state.fence,
        "attempts": state.attempts,
        "store_now": _when(state.now),
    }
    if state.lease is not None:
        lease = state.lease
        doc |= {
            "holder": lease.owner,
            "token": lease.token.fence,
            "attempt": lease.attempt,
            "acquired_at": _when(lease.acquired_at),
            "expires_at": _when(lease.expires_at),
            "expires_in_s": round(lease.expires_at - state.now, 3),
            "max_expires_at": _when(lease.max_expires_at),
        }
    if state.artifact is not None:
        artifact = dataclasses.asdict(state.artifact)
        artifact.pop("payload")
        artifact["created_at"] = _when(state.artifact.created_at)
        doc |= {f"artifact_{k}": v for k, v in artifact.items()}
    if state.failure is not None:
        doc |= {
            "failures": state.failure.count,
            "last_error": state.failure.error,
            "failed_by": state.failure.owner,
            "failed_at": _when(state.failure.at),
        }
    return doc


def _emit(args: argparse.Namespace, rows: list[dict[str, Any]], columns: list[str]) -> None:
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print_table(rows, columns)


def print_table(rows: list[dict[str, Any]], columns: list[str], out: IO[str] | None = None) -> None:
    """A plain aligned table (no dependency): what people read in terminals and CI logs."""
    out = out or sys.stdout
    cells = [[("" if row.get(c) is None else printable(row[c])) for c in columns] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip(), file=out)
    for r in cells:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip(), file=out)
    if not rows:
        print("(none)", file=out)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

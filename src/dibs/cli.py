"""The ``dibs`` command: run a command once across processes, and inspect and repair reservations.

``dibs run --key K -- COMMAND`` runs COMMAND exactly once across every concurrent ``dibs run`` on the
same key and store: its stdout becomes the artifact, every other invocation waits and prints the
same stdout, and later invocations print it at once. A failing COMMAND releases the key with the
failure recorded (so a waiter takes over) and ``dibs run`` exits with COMMAND's status.

This module is the entry point only: it reads the command line (:mod:`dibs._cli.parser`), sets up
stderr and the stop signals, runs the command (``run`` and ``wait``: :mod:`dibs._cli.run`; the
inspection and repair commands: :mod:`dibs._cli.admin`) and turns an error into its exit status
(:mod:`dibs._cli.exits`). Results go to stdout, everything else to stderr (see
:mod:`dibs._cli.console`). Nothing here is imported by ``import dibs``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from dibs._cli.console import Console
from dibs._cli.exits import EXIT_PIPE, exit_status
from dibs._cli.parser import parse
from dibs._cli.stops import Stopped, StopSignals
from dibs.errors import ReservationError

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.command == "demo":
        from dibs.demo import run_demo

        return run_demo(workers=args.workers, work_seconds=args.work_seconds)
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
            console.problem("error", str(exc), exit_status=exit_status(exc))
            return exit_status(exc)


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
    from dibs._cli import admin
    from dibs._cli import run as running

    if args.command == "run":
        return running.run(args, console, stops)
    if args.command == "wait":
        return running.wait(args, console)
    return admin.administer(args)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

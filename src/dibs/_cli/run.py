"""``dibs run`` and ``dibs wait``: wait for a key, compute it under its lease, hand out its artifact.

Both wait with one call of the public API (``Reservations.acquire`` / ``Reservations.wait``), so a
timeout is the core's, in the core's words; a :class:`~dibs._cli.watch.KeyWatch` shows the wait to
whoever follows it. ``dibs run`` then holds the lease through ``Reservations.hold`` (the core decides
what a failure, a lost lease or an unreachable store means) while :class:`~dibs._cli.command.Command`
runs COMMAND. With ``--json`` both print one envelope::

    {"key": "default/k", "role": "computed" | "waited" | "hit", "token": 3, "producer": "...",
     "waited_seconds": 1.25, "waited_on": "..." | null, "took_over_from": "..." | null,
     "stored": true, "encoding": "utf-8" | "base64" | "json", "value": "..."}
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import Any, Literal

from dibs import holding
from dibs._cli.command import Command, CommandFailed, CommandNotStarted, CommandStopped
from dibs._cli.console import Console
from dibs._cli.stops import Stopped, StopSignals, signal_name
from dibs._cli.text import artifact_text, duration
from dibs._cli.watch import KeyWatch, Sight
from dibs.client import Reservations
from dibs.config import default_owner
from dibs.errors import ConfigurationError, ReservationError
from dibs.keys import Key
from dibs.outcomes import Acquired, Busy, Hit

__all__ = ["run", "wait"]

#: The status of ``dibs run`` when COMMAND cannot be started, as a shell's.
EXIT_NOT_STARTED = 127


@dataclasses.dataclass(frozen=True)
class Result:
    """How this invocation got the key's value: what ``--json`` prints."""

    key: Key
    role: Literal["computed", "waited", "hit"]
    token: int
    producer: str
    value: Any
    waited_seconds: float = 0.0
    waited_on: str | None = None
    took_over_from: str | None = None
    stored: bool = True

    def envelope(self) -> dict[str, Any]:
        value, encoding = artifact_text(self.value)
        return {
            "key": str(self.key),
            "role": self.role,
            "token": self.token,
            "producer": self.producer,
            "waited_seconds": round(self.waited_seconds, 3),
            "waited_on": self.waited_on,
            "took_over_from": self.took_over_from,
            "stored": self.stored,
            "encoding": encoding,
            "value": value,
        }


# -- dibs run ---------------------------------------------------------------------------------------


def run(args: argparse.Namespace, console: Console, stops: StopSignals) -> int:
    command: list[str] = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not command:
        raise ConfigurationError("give the command after '--', e.g. dibs run --key K -- ./build.sh")
    owner = args.owner or default_owner()
    with Reservations(args.store, namespace=args.namespace, ttl=args.ttl, serializer="bytes") as client:
        key = client.key(args.key)
        started = time.monotonic()
        try:
            got, waited_on = _turn(
                client, key, owner, args.timeout, console, refresh=args.refresh, max_age=args.max_age
            )
        except Stopped as stop:
            _let_go_if_ours(client, key, owner, stop.signum, stops)
            raise
        waited = time.monotonic() - started if waited_on else 0.0
        if isinstance(got, Hit):
            _announce_hit(console, got, waited, waited_on)
            role: Literal["waited", "hit"] = "waited" if waited_on else "hit"
            return _deliver(args, Result(key, role, got.token, got.producer, got.value, waited, waited_on))
        _announce_acquired(console, got, waited_on)
        return _compute(
            args, console, stops, client, got, command=command, waited=waited, waited_on=waited_on
        )


def _turn(
    client: Reservations,
    key: Key,
    owner: str,
    timeout: float | None,
    console: Console,
    *,
    refresh: bool = False,
    max_age: float | None = None,
) -> tuple[Hit | Acquired, str | None]:
    """The key's artifact or its lease, waiting for another holder if there is one (and naming it).

    A refresh that finds the key held waits for what that holder stores (``min_token``): concurrent
    refreshes compute once, and an older artifact never answers one."""
    started = time.monotonic()
    first = client.get_or_reserve(key, owner, refresh=refresh, max_age=max_age)
    if not isinstance(first, Busy):
        return first, None
    with KeyWatch(console, client, key, me=owner) as watch:
        watch.see(Sight.of_busy(first))
        remaining = None if timeout is None else max(0.0, timeout - (time.monotonic() - started))
        got = client.acquire(
            key,
            owner,
            timeout=remaining,
            raise_on_timeout=False,
            max_age=max_age,
            min_token=first.token if refresh else None,
        )
    if isinstance(got, Busy):
        raise got.timed_out(time.monotonic() - started)
    return got, first.holder


def _compute(
    args: argparse.Namespace,
    console: Console,
    stops: StopSignals,
    client: Reservations,
    got: Acquired,
    *,
    command: list[str],
    waited: float,
    waited_on: str | None,
) -> int:
    key = got.key
    running = Command(command, stream=None if args.json else sys.stdout.buffer, kill_after=args.kill_after)
    try:
        # Deferred for the whole hold: a stop reaches COMMAND, and never interrupts the release.
        with stops.deferred(running.forward):
            report = client.hold(got, lambda: running.run(stops), failure_of=_recorded_as)
    except CommandStopped as stop:
        console.say(
            "stopped",
            f"{key}: {stop}; its output is not stored, and the lease was given up with the stop recorded",
            key=str(key),
            signal=signal_name(stop.signum),
        )
        return 128 + stop.signum
    except CommandFailed as failed:
        console.event(
            "failed",
            f"{key}: {failed}; the lease was given up with the failure recorded",
            key=str(key),
            status=failed.status,
        )
        return failed.exit_status
    except CommandNotStarted as exc:
        console.problem("error", str(exc))
        return EXIT_NOT_STARTED
    stops.raise_if_received()  # a stop while the artifact was being stored: stored, then stop
    if args.json:
        result = Result(
            key,
            "computed",
            got.lease.token,
            got.lease.owner,
            report.value,
            waited,
            waited_on,
            got.took_over_from,
            report.stored,
        )
        print(json.dumps(result.envelope()))
    return 0


def _recorded_as(exc: BaseException) -> str:
    """What a failed or stopped COMMAND leaves on the key for the next caller to read."""
    if isinstance(exc, CommandFailed | CommandStopped | CommandNotStarted):
        return str(exc)
    return holding.failure_text(exc)


def _let_go_if_ours(client: Reservations, key: Key, owner: str, signum: int, stops: StopSignals) -> None:
    """A stop that lands just as the lease is granted must not leave it held until its ttl: if the
    key is ours, take our own lease again (idempotent) and release it with the stop recorded."""
    with stops.deferred():
        try:
            lease = client.status(key).live_lease
            if lease is None or lease.owner != owner:
                return
            got = client.get_or_reserve(key, owner)
            if isinstance(got, Acquired):
                got.lease.release(
                    f"stopped by {signal_name(signum)} (dibs run was stopped before its command ran)"
                )
        except ReservationError:
            pass  # the lease expires after its ttl


def _announce_hit(console: Console, got: Hit, waited: float, waited_on: str | None) -> None:
    fields: dict[str, Any] = {
        "key": str(got.key),
        "token": got.token,
        "producer": got.producer,
        "waited": round(waited, 3),
    }
    if waited_on:
        console.event(
            "done",
            f"{got.key}: computed by {got.producer!r} (token {got.token}); waited {duration(waited)}",
            notable=True,
            **fields,
        )
    else:
        console.event("hit", f"{got.key}: already computed by {got.producer!r} (token {got.token})", **fields)


def _announce_acquired(console: Console, got: Acquired, waited_on: str | None) -> None:
    key, lease, failure = got.key, got.lease, got.last_failure
    attempt = lease.record.attempt
    fields: dict[str, Any] = {"key": str(key), "token": lease.token, "attempt": attempt}
    if got.took_over_from:
        console.event(
            "takeover",
            f"{key}: took over from {got.took_over_from!r}, whose lease expired; computing it "
            f"(attempt {attempt}, token {lease.token})",
            notable=True,
            took_over_from=got.took_over_from,
            **fields,
        )
    elif failure is not None:
        console.event(
            "retry",
            f"{key}: the last attempt failed ({failure.owner!r}: {failure.error}); computing it again "
            f"(attempt {attempt}, token {lease.token})",
            notable=waited_on is not None,
            **fields,
        )
    elif waited_on:
        console.event(
            "holder",
            f"{key}: {waited_on!r} let go of it; computing it here (token {lease.token})",
            notable=True,
            **fields,
        )
    else:
        console.event("computing", f"{key}: computing it (token {lease.token})", **fields)


# -- dibs wait --------------------------------------------------------------------------------------


def wait(args: argparse.Namespace, console: Console) -> int:
    with Reservations(args.store, namespace=args.namespace) as client:
        key = client.key(args.key)
        started = time.monotonic()
        state = client.status(key)
        if state.artifact is not None:
            artifact = state.artifact
            value = client.decode(key, artifact)
            console.event(
                "hit",
                f"{key}: already computed by {artifact.producer!r} (token {artifact.fence})",
                key=str(key),
                token=artifact.fence,
            )
            return _deliver(args, Result(key, "hit", artifact.fence, artifact.producer, value))
        with KeyWatch(console, client, key) as watch:
            watch.see(Sight.of_state(state))
            remaining = (
                None if args.timeout is None else max(0.0, args.timeout - (time.monotonic() - started))
            )
            hit = client.wait(key, timeout=remaining, for_artifact=True)
        assert hit is not None  # for_artifact: only an artifact (or an error) ends the wait
        waited = time.monotonic() - started
        held_by = state.live_lease.owner if state.live_lease is not None else None
        _announce_hit(console, hit, waited, held_by or hit.producer)
        return _deliver(args, Result(key, "waited", hit.token, hit.producer, hit.value, waited, held_by))


# -- output -----------------------------------------------------------------------------------------


def _deliver(args: argparse.Namespace, result: Result) -> int:
    """Print the artifact (as it was stored), or its ``--json`` envelope."""
    if args.json:
        print(json.dumps(result.envelope()))
    elif isinstance(result.value, bytes):
        sys.stdout.buffer.write(result.value)
        sys.stdout.buffer.flush()
    else:  # written by a Python or orchestrator caller with another serializer
        print(json.dumps(result.value))
    return 0

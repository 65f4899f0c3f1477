"""``dibs run`` and ``dibs wait``: wait for a key, compute it under its lease, hand out its artifact.

``dibs run`` drives the core's compute-once flow (:mod:`dibs.flow`), so a timeout is the core's, in
the core's words, and the core decides what a failure, a lost lease or an unreachable store means; its
progress lines translate the flow's events. While it waits, a :class:`~dibs._cli.watch.KeyWatch` shows
the wait to whoever follows it; while it holds the lease, :class:`~dibs._cli.command.Command` runs
COMMAND. ``dibs wait`` waits with one call of the public API (``Reservations.wait``). With
``--json`` both print one envelope::

    {"key": "default/k", "role": "computed" | "waited" | "hit", "token": 3, "producer": "...",
     "waited_seconds": 1.25, "waited_on": "..." | null, "took_over_from": "..." | null,
     "stored": true, "encoding": "utf-8" | "base64" | "json", "value": "..."}
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import sys
from typing import Any, Literal

from dibs import events, holding
from dibs._cli.command import Command, CommandFailed, CommandNotStarted, CommandStopped
from dibs._cli.console import Console
from dibs._cli.spool import stream_out, streaming, streams, work_of
from dibs._cli.stops import Stopped, StopSignals, signal_name
from dibs._cli.text import artifact_text
from dibs._cli.watch import KeyWatch, Sight
from dibs.artifacts import unread_hit
from dibs.backoff import Deadline
from dibs.client import Reservations
from dibs.config import default_owner
from dibs.display import duration
from dibs.errors import ConfigurationError, ReservationError
from dibs.flow import Call
from dibs.keys import Key
from dibs.outcomes import Hit
from dibs.payloads import Payload, PayloadUnavailable, ReferencedArtifact
from dibs.payloads.base import split_address
from dibs.records import ArtifactRecord, KeyState
from dibs.seam import StoreIO
from dibs.steps import Found, Unwatch, Wait

__all__ = ["run", "wait"]

log = logging.getLogger("dibs")

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
        if isinstance(self.value, Payload):  # streamed into the payload store: where it is, not what
            # Named by its digest function, as a reference names it: {"sha256": hex} as always, or
            # {"blake3": hex} for a store with ?digest=blake3.
            digest, hexdigest = split_address(self.value.sha256)
            value: Any = {digest: hexdigest, "size": self.value.size}
            encoding = "payload"
        else:
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
    owner = default_owner() if args.owner is None else args.owner  # "" is refused
    with Reservations(
        args.store, namespace=args.namespace, ttl=args.ttl, serializer="bytes", payloads=args.payloads
    ) as client:
        key = client.key(args.key)
        narrator = _Narrator(console)
        call = client.call(
            key,
            owner=owner,
            timeout=args.timeout,
            max_age=args.max_age,
            refresh=args.refresh,
            frontend="cli",
            observer=narrator,
        )
        running = Command(
            command, stream=None if args.json else sys.stdout.buffer, kill_after=args.kill_after
        )
        try:
            # Without --json, a hit (or a wait's artifact) in the payload store is printed as it is read.
            steps = _RunSteps(client, call, console, stops, running, streamed=not args.json)
            report = call.drive(steps)
        except Stopped as stop:  # before the hold (which defers stops): a lease just granted is let go
            _let_go_if_ours(client, key, owner, stop.signum, stops)
            raise
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
        if report.role != "computed":
            role: Literal["waited", "hit"] = "waited" if report.role == "waited" else "hit"
            assert report.token is not None and report.producer is not None
            return _deliver(
                args,
                Result(
                    key,
                    role,
                    report.token,
                    report.producer,
                    report.value,
                    report.waited_seconds,
                    report.waited_on,
                ),
            )
        stops.raise_if_received()  # a stop while the artifact was being stored: stored, then stop
        if args.json:
            assert report.token is not None and report.producer is not None
            result = Result(
                key,
                "computed",
                report.token,
                report.producer,
                report.value,
                report.waited_seconds,
                report.waited_on,
                report.took_over_from,
                report.stored,
            )
            print(json.dumps(result.envelope()))
        return 0


class _RunSteps(StoreIO):
    """How ``dibs run`` does the flow's steps: a wait shows the key to whoever follows it
    (:class:`KeyWatch`), a hit of a payload is handed on unread (printed as it is read), and the hold
    runs COMMAND with stops forwarded to it, never interrupting the release."""

    client: Reservations

    def __init__(
        self,
        client: Reservations,
        call: Call,
        console: Console,
        stops: StopSignals,
        running: Command,
        *,
        streamed: bool,
    ) -> None:
        super().__init__(
            client,
            work_of(client, running, stops),
            emit=call.emitter,
            failure_of=_recorded_as,
            store=streaming(client) if streamed else None,
        )
        self.console, self.stops, self.running = console, stops, running
        self._watch: KeyWatch | None = None

    def wait(self, step: Wait) -> None:
        watch = self._watch = KeyWatch(self.console, self.client, step.ask.key, me=step.ask.request.owner)
        watch.__enter__()
        watch.see(Sight.of_busy(step.busy))

    def unwatch(self, step: Unwatch) -> None:
        super().unwatch(step)
        self._stop_watch()

    def _stop_watch(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.__exit__(None, None, None)

    def _end(self) -> None:
        self._stop_watch()
        super()._end()

    def found(self, step: Found) -> Hit:
        hit = unread_hit(step.key, step.artifact)
        return hit if hit is not None else super().found(step)

    def hold_scope(self, held: holding.HeldLease) -> contextlib.AbstractContextManager[object]:
        # Deferred for the whole hold: a stop reaches COMMAND, and never interrupts the release.
        scope = contextlib.ExitStack()
        scope.enter_context(super().hold_scope(held))
        scope.enter_context(self.stops.deferred(self.running.forward))
        return scope


class _Narrator:
    """The flow's events as ``dibs run``'s progress lines (the console's events)."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.waited_on: str | None = None
        self.waited = 0.0

    def __call__(self, event: events.Event) -> None:
        if isinstance(event, events.Waited):
            self.waited_on, self.waited = event.holder, event.seconds
        elif isinstance(event, events.ArtifactFound):
            _announce_hit(self.console, event, self.waited, self.waited_on)
        elif isinstance(event, events.LeaseAcquired):
            _announce_acquired(self.console, event, self.waited_on)


def _recorded_as(exc: BaseException) -> str:
    """What a failed or stopped COMMAND leaves on the key for the next caller to read."""
    if isinstance(exc, CommandFailed | CommandStopped | CommandNotStarted):
        return str(exc)
    return holding.failure_text(exc)


def _let_go_if_ours(client: Reservations, key: Key, owner: str, signum: int, stops: StopSignals) -> None:
    """A stop that lands just as the lease is granted must not leave it held until its ttl: if the
    key is ours, give our own lease back with the stop recorded (:meth:`Reservations.release_own`)."""
    stopped = f"stopped by {signal_name(signum)} (dibs run was stopped before its command ran)"
    with stops.deferred(), contextlib.suppress(ReservationError):  # else it expires after its ttl
        client.release_own(key, lambda holder: holder == owner, stopped)


def _announce_hit(
    console: Console, got: Hit | events.ArtifactFound, waited: float, waited_on: str | None
) -> None:
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


def _announce_acquired(console: Console, got: events.LeaseAcquired, waited_on: str | None) -> None:
    """Say why this invocation computes the key: the kind of event, its words, and whether a
    terminal shows it without ``-v`` (when it ends a wait, or takes over a dead holder)."""
    key, token, attempt = got.key, got.token, got.attempt
    fields: dict[str, Any] = {"key": str(key), "token": token, "attempt": attempt}
    if got.took_over_from:
        fields = {"took_over_from": got.took_over_from, **fields}
        kind, notable = "takeover", True
        text = (
            f"{key}: took over from {got.took_over_from!r}, whose lease expired; computing it "
            f"(attempt {attempt}, token {token})"
        )
    elif got.last_failure is not None:
        kind, notable = "retry", waited_on is not None
        text = (
            f"{key}: the last attempt failed ({got.last_failure_owner!r}: {got.last_failure}); computing it "
            f"again (attempt {attempt}, token {token})"
        )
    elif waited_on:
        kind, notable = "holder", True
        text = f"{key}: {waited_on!r} let go of it; computing it here (token {token})"
    else:
        kind, notable = "computing", False
        text = f"{key}: computing it (token {token})"
    console.event(kind, text, notable=notable, **fields)


# -- dibs wait --------------------------------------------------------------------------------------


def wait(args: argparse.Namespace, console: Console) -> int:
    """``dibs wait``: until KEY is done, reserving nothing.

    Not on the compute-once flow's path (:func:`dibs.flow.compute_once`), on purpose: every ask of
    that flow, its waits' included, may be *granted* the lease (that is how a waiter takes over a dead
    holder), and a ``dibs wait`` must never hold what it does not compute. It is the public API's
    wait instead, :meth:`dibs.Reservations.wait` (:func:`dibs.flow.wait_for`): the same hub, backstop,
    expiry rules, outage riding and timeout wording; only asks are replaced by reads.

    It waits for the artifact's record (``decode=False``), then takes its value (:func:`_taken`): a
    payload is checked to its end into a spool file before a byte is printed, never whole in memory,
    and one that is not the recorded one is a miss, as it is to every reader: a warning says so, and
    the wait goes on for a newer artifact, within the same ``--timeout``.
    """
    with Reservations(args.store, namespace=args.namespace, payloads=args.payloads) as client:
        key = client.key(args.key)
        deadline = Deadline(args.timeout)
        first: list[KeyState] = []
        newer: int | None = None  # after a bad artifact: only one stored after it
        with KeyWatch(console, client, key) as watch:

            def seen(state: KeyState) -> None:
                if not first:
                    first.append(state)
                watch.see(Sight.of_state(state))

            while True:
                hit = client.wait(
                    key,
                    for_artifact=True,
                    timeout=deadline.remaining,
                    decode=False,
                    min_token=newer,
                    seen=seen,
                )
                assert hit is not None and isinstance(hit.value, ArtifactRecord)  # for_artifact, undecoded
                taken = _taken(args, client, key, hit.value)
                if taken is not None:
                    break
                newer = hit.token + 1
        before = first[0] if first else None
        waited_on = None if before is None or before.live_lease is None else before.live_lease.owner
        at_once = before is not None and before.artifact is not None and before.artifact.fence == hit.token
        if at_once:
            said = f"{key}: already computed by {hit.producer!r} (token {hit.token})"
            console.event("hit", said, key=str(key), token=hit.token)
            return _deliver(args, Result(key, "hit", hit.token, hit.producer, taken[0]))
        waited = deadline.elapsed
        _announce_hit(console, hit, waited, waited_on or hit.producer)
        return _deliver(args, Result(key, "waited", hit.token, hit.producer, taken[0], waited, waited_on))


def _taken(
    args: argparse.Namespace, client: Reservations, key: Key, artifact: ArtifactRecord
) -> tuple[Any] | None:
    """What ``dibs wait`` prints of ``artifact``: a payload checked into its spool (printed from there,
    never whole in memory), else the decoded value; ``None`` when it turns out bad (a miss, logged)."""
    try:
        if streams(args, artifact):
            assert isinstance(artifact, ReferencedArtifact)
            return (dataclasses.replace(artifact, spooled=artifact.verified_spool(key)),)
        return (client.decode(key, artifact),)
    except PayloadUnavailable as exc:
        log.warning(
            "%s: its artifact is treated as missing, and the wait goes on for a newer one: %s", key, exc
        )
        return None


# -- output -----------------------------------------------------------------------------------------


def _deliver(args: argparse.Namespace, result: Result) -> int:
    """Print the artifact (as it was stored), or its ``--json`` envelope."""
    if isinstance(result.value, ReferencedArtifact):  # a payload, unread so far: printed once checked
        return stream_out(result.key, result.value)
    if args.json:
        print(json.dumps(result.envelope()))
    elif isinstance(result.value, bytes):
        sys.stdout.buffer.write(result.value)
        sys.stdout.buffer.flush()
    else:  # written by a Python or orchestrator caller with another serializer
        print(json.dumps(result.value))
    return 0

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
import dataclasses
import json
import logging
import sys
import time
from typing import Any, Literal

from dibs import events, holding
from dibs._cli.command import Command, CommandFailed, CommandNotStarted, CommandStopped
from dibs._cli.console import Console
from dibs._cli.spool import outcome, stream_out, streaming, streams, work_of
from dibs._cli.stops import Stopped, StopSignals, signal_name
from dibs._cli.text import artifact_text
from dibs._cli.watch import KeyWatch, Sight
from dibs.backoff import Deadline
from dibs.calls import WaitFor
from dibs.client import Reservations
from dibs.config import default_owner
from dibs.display import duration
from dibs.errors import ConfigurationError, ReservationError
from dibs.flow import Call, Hold, Steps, Wait
from dibs.keys import Key
from dibs.outcomes import Acquired, Busy, Hit, Outcome, RunReport
from dibs.payloads import Payload, PayloadUnavailable, ReferencedArtifact
from dibs.records import ArtifactRecord, StoreOutcome

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
            value: Any = {"sha256": self.value.sha256, "size": self.value.size}
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
    owner = args.owner or default_owner()
    with Reservations(
        args.store, namespace=args.namespace, ttl=args.ttl, serializer="bytes", payloads=args.payloads
    ) as client:
        if not args.json:
            streaming(client)  # a hit, or a wait's artifact, is printed as it is read
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
            report = call.drive(_RunSteps(client, call, console, stops, running))
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


class _RunSteps(Steps):
    """How ``dibs run`` does the flow's steps: a wait shows the key to whoever follows it
    (:class:`KeyWatch`); the hold runs COMMAND with stops forwarded to it, never interrupting the release."""

    client: Reservations

    def __init__(
        self, client: Reservations, call: Call, console: Console, stops: StopSignals, running: Command
    ) -> None:
        super().__init__(client, work_of(client, running, stops), emit=call.emitter, failure_of=_recorded_as)
        self.console, self.stops, self.running = console, stops, running

    def wait(self, step: Wait) -> Hit | Acquired | Busy:
        with KeyWatch(self.console, self.client, step.ask.key, me=step.ask.request.owner) as watch:
            watch.see(Sight.of_busy(step.busy))
            return super().wait(step)

    def outcome(self, key: Key, found: StoreOutcome) -> Outcome:
        return outcome(self.client, key, found)

    def hold(self, step: Hold) -> RunReport:
        # Deferred for the whole hold: a stop reaches COMMAND, and never interrupts the release.
        with self.stops.deferred(self.running.forward):
            return super().hold(step)


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
    key is ours, take our own lease again (idempotent) and release it with the stop recorded."""
    with stops.deferred():
        try:
            lease = client.status(key).live_lease
            if lease is None or lease.owner != owner:
                return
            got = client.get_or_reserve(key, owner)
            if isinstance(got, Acquired):
                stopped = f"stopped by {signal_name(signum)} (dibs run was stopped before its command ran)"
                holding.HeldLease(got.lease, heartbeats=False).let_go(stopped)
        except ReservationError:
            pass  # the lease expires after its ttl


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

    Not on the compute-once flow (:mod:`dibs.flow`), on purpose: every ask of the flow, its waits'
    included, may be *granted* the lease (that is how a waiter takes over a dead holder), and a
    ``dibs wait`` must never hold what it does not compute. It uses the flow's waiting loop's reading
    twin instead (:meth:`dibs.Reservations.wait`, :func:`dibs._waiting.read_until`): the same hub, the
    same backstop and expiry rules, and the same timeout wording; only asks are replaced by reads.

    It waits for the artifact's record, then takes its value (:func:`_taken`): a payload is checked to
    its end into a spool file before a byte is printed, and one that is not the recorded one is a
    miss, as it is to every reader: a warning says so, and the wait goes on for a newer artifact.
    """
    with Reservations(args.store, namespace=args.namespace, payloads=args.payloads) as client:
        key = client.key(args.key)
        started = time.monotonic()
        waiting = WaitFor(
            key, Deadline(args.timeout), for_artifact=True, max_age=client.max_age, decode=False
        )
        state = client.status(key)
        held_by = state.live_lease.owner if state.live_lease is not None else None
        artifact = state.artifact
        if artifact is not None and artifact.is_fresh(state.now, max_age=client.max_age):
            taken = _taken(args, client, key, artifact)
            if taken is not None:
                console.event(
                    "hit",
                    f"{key}: already computed by {artifact.producer!r} (token {artifact.fence})",
                    key=str(key),
                    token=artifact.fence,
                )
                return _deliver(args, Result(key, "hit", artifact.fence, artifact.producer, taken[0]))
            waiting = _newer_than(waiting, artifact)
        with KeyWatch(console, client, key) as watch:
            watch.see(Sight.of_state(state))
            while True:
                hit = waiting.ended(client.artifacts, client._wait_state(waiting))
                assert hit is not None  # for_artifact: only an artifact (or an error) ends the wait
                assert isinstance(hit.value, ArtifactRecord)  # decode=False: the record itself
                taken = _taken(args, client, key, hit.value)
                if taken is not None:
                    break
                waiting = _newer_than(waiting, hit.value)
        waited = time.monotonic() - started
        _announce_hit(console, hit, waited, held_by or hit.producer)
        return _deliver(args, Result(key, "waited", hit.token, hit.producer, taken[0], waited, held_by))


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


def _newer_than(waiting: WaitFor, artifact: ArtifactRecord) -> WaitFor:
    """The same wait, taking only an artifact stored after ``artifact`` (a bad one: never taken again)."""
    return dataclasses.replace(waiting, min_token=max(waiting.min_token or 0, artifact.fence + 1))


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

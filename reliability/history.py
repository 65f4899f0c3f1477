"""Recording every operation, and checking the recorded history against the reservation contract.

Recording
    Each process writes its own JSON-lines file through a :class:`Recorder`: one ``os.write`` per
    event on an ``O_APPEND`` descriptor, so an event is on disk (in the page cache) the moment the
    call returns, and a process killed with SIGKILL loses at most the operation it was in. Store
    operations are recorded by :class:`RecordingStore`, a :class:`~dibs.stores.Store` that wraps the
    real one, so everything the client does (waiting loops, background heartbeats, completes) is
    captured at the one boundary where the store decides, without changing the client.

    Every event carries the process, the operation, the key, the token (fence and lease id), the
    monotonic start and end (``t0``/``t1``; ``CLOCK_MONOTONIC`` is system-wide on Linux, so events of
    different processes are ordered in real time), the store's own timestamps where the store
    returned any (``acquired_at``, ``expires_at``, ``at``), and the result.

Checking
    :func:`check` runs the invariants over the merged history. Each is written so that it can only
    report what the history *proves*: an operation whose outcome is unknown (its process was killed,
    or its connection cut) never counts as a success, and real-time arguments only use the
    interval ``[t0, t1]`` inside which an operation must have taken effect.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from dibs.errors import CorruptRecord, LeaseLost, ReservationError, StoreUnavailable
from dibs.keys import Key
from dibs.records import (
    ArtifactRecord,
    Granted,
    Held,
    KeyState,
    LeaseRecord,
    LeaseToken,
    Present,
    StoreOutcome,
)
from dibs.stores.base import Store
from dibs.stores.feeds import ChangeFeed

__all__ = [
    "Event",
    "Expectations",
    "LogCapture",
    "Recorder",
    "RecordingStore",
    "Summary",
    "Violation",
    "artifact_identity",
    "check",
    "load",
    "outcome_of",
]

Event = dict[str, Any]

#: How much two computers' clocks may disagree about the *rate* of time, as a fraction of a ttl,
#: plus a fixed slack for scheduling: real-time arguments never flag a difference this small.
RATE_TOLERANCE = 0.01
SLACK_SECONDS = 0.005


def now() -> float:
    return time.monotonic()


def outcome_of(exc: BaseException) -> str:
    """The result word for an exception: what the checker reasons with."""
    if isinstance(exc, LeaseLost):
        return "lost"
    if isinstance(exc, StoreUnavailable):
        return "unavailable"
    if isinstance(exc, CorruptRecord):
        return "corrupt"
    if isinstance(exc, ReservationError):
        return f"error:{type(exc).__name__}"
    return f"crash:{type(exc).__name__}"


def artifact_identity(artifact: ArtifactRecord) -> dict[str, Any]:
    """What identifies a stored artifact: if any of these change, the artifact was replaced."""
    return {
        "fence": artifact.fence,
        "checksum": artifact.checksum,
        "producer": artifact.producer,
        "created_at": artifact.created_at,
        "size": artifact.size,
    }


class Recorder:
    """Appends events to one file; safe to share between the threads of a process."""

    def __init__(self, path: Path, proc: str) -> None:
        self.path = path
        self.proc = proc
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)

    def emit(self, op: str, **fields: Any) -> None:
        event = {"proc": self.proc, "pid": os.getpid(), "op": op, **fields}
        os.write(self._fd, (json.dumps(event, default=str) + "\n").encode())

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


class LogCapture(logging.Handler):
    """Records every ``dibs`` log line as an event, so the checker can see what users would see."""

    def __init__(self, recorder: Recorder) -> None:
        super().__init__(level=logging.INFO)
        self.recorder = recorder

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # a bad log call must not break the worker
            message = str(record.msg)
        self.recorder.emit("log", level=record.levelname, logger=record.name, msg=message[:2000], t0=now())


def _lease_fields(lease: LeaseRecord) -> dict[str, Any]:
    return {
        "owner": lease.owner,
        "fence": lease.token.fence,
        "lease": lease.token.lease_id,
        "acquired_at": lease.acquired_at,
        "expires_at": lease.expires_at,
        "ttl": lease.ttl,
    }


def _state_fields(state: KeyState) -> dict[str, Any]:
    fields: dict[str, Any] = {"at": state.now, "key_fence": state.fence}
    if state.lease is not None:
        fields["holder"] = _lease_fields(state.lease)
    if state.artifact is not None:
        fields["artifact"] = artifact_identity(state.artifact)
    return fields


class RecordingStore(Store):
    """A store that records every operation of the store it wraps, then behaves exactly like it."""

    def __init__(self, inner: Store, recorder: Recorder) -> None:
        self.inner = inner
        self.recorder = recorder

    @property
    def url(self) -> str:
        return self.inner.url

    def _failed(self, op: str, key: Key, t0: float, exc: BaseException, **fields: Any) -> None:
        self.recorder.emit(
            op, key=key.name, t0=t0, t1=now(), result=outcome_of(exc), error=str(exc)[:500], **fields
        )

    def read(self, key: Key) -> KeyState:
        t0 = now()
        try:
            state = self.inner.read(key)
        except Exception as exc:
            self._failed("read", key, t0, exc)
            raise
        self.recorder.emit("read", key=key.name, t0=t0, t1=now(), result="ok", **_state_fields(state))
        return state

    def acquire(
        self,
        key: Key,
        owner: str,
        ttl: float,
        max_lease_age: float | None,
        *,
        max_age: float | None = None,
        min_fence: int | None = None,
    ) -> StoreOutcome:
        t0 = now()
        try:
            outcome = self.inner.acquire(key, owner, ttl, max_lease_age, max_age=max_age, min_fence=min_fence)
        except Exception as exc:
            self._failed("acquire", key, t0, exc, owner=owner)
            raise
        t1 = now()
        if isinstance(outcome, Present):
            self.recorder.emit(
                "acquire",
                key=key.name,
                t0=t0,
                t1=t1,
                owner=owner,
                result="present",
                artifact=artifact_identity(outcome.artifact),
            )
        elif isinstance(outcome, Granted):
            self.recorder.emit(
                "acquire",
                key=key.name,
                t0=t0,
                t1=t1,
                result="granted",
                took_over_from=outcome.took_over_from,
                **_lease_fields(outcome.lease),
            )
        elif isinstance(outcome, Held):
            self.recorder.emit(
                "acquire",
                key=key.name,
                t0=t0,
                t1=t1,
                owner=owner,
                result="held",
                at=outcome.now,
                holder=_lease_fields(outcome.lease),
            )
        return outcome

    def heartbeat(self, key: Key, token: LeaseToken, ttl: float) -> LeaseRecord:
        t0 = now()
        try:
            lease = self.inner.heartbeat(key, token, ttl)
        except Exception as exc:
            self._failed("heartbeat", key, t0, exc, fence=token.fence, lease=token.lease_id)
            raise
        self.recorder.emit("heartbeat", key=key.name, t0=t0, t1=now(), result="ok", **_lease_fields(lease))
        return lease

    def complete(
        self, key: Key, token: LeaseToken, serializer: str, payload: bytes, checksum: str
    ) -> ArtifactRecord:
        t0 = now()
        try:
            artifact = self.inner.complete(key, token, serializer, payload, checksum)
        except Exception as exc:
            self._failed("complete", key, t0, exc, fence=token.fence, lease=token.lease_id, checksum=checksum)
            raise
        self.recorder.emit(
            "complete",
            key=key.name,
            t0=t0,
            t1=now(),
            result="ok",
            fence=token.fence,
            lease=token.lease_id,
            at=artifact.created_at,
            artifact=artifact_identity(artifact),
        )
        return artifact

    def release(self, key: Key, token: LeaseToken, error: str | None = None, *, counted: bool = True) -> None:
        t0 = now()
        try:
            self.inner.release(key, token, error, counted=counted)
        except Exception as exc:
            self._failed("release", key, t0, exc, fence=token.fence, lease=token.lease_id)
            raise
        self.recorder.emit(
            "release",
            key=key.name,
            t0=t0,
            t1=now(),
            result="ok",
            fence=token.fence,
            lease=token.lease_id,
            failed=error is not None,
        )

    def force_release(self, key: Key) -> bool:
        t0 = now()
        changed = self.inner.force_release(key)
        self.recorder.emit("force_release", key=key.name, t0=t0, t1=now(), result="ok", changed=changed)
        return changed

    def forget(self, key: Key) -> bool:
        t0 = now()
        changed = self.inner.forget(key)
        self.recorder.emit("forget", key=key.name, t0=t0, t1=now(), result="ok", changed=changed)
        return changed

    def discard(self, key: Key) -> bool:
        t0 = now()
        changed = self.inner.discard(key)
        self.recorder.emit("discard", key=key.name, t0=t0, t1=now(), result="ok", changed=changed)
        return changed

    def prune(self, namespace: str | None, older_than: float) -> int:
        return self.inner.prune(namespace, older_than)

    def list(self, namespace: str | None = None) -> Iterator[KeyState]:
        return self.inner.list(namespace)

    def reap(self, namespace: str | None = None) -> int:
        return self.inner.reap(namespace)

    def read_many(self, keys: Sequence[Key]) -> list[KeyState]:
        """The watch hub's reads, recorded like reads: a waiter may return what the hub read for it."""
        t0 = now()
        states = self.inner.read_many(keys)
        t1 = now()
        for state in states:
            self.recorder.emit("read", key=state.key.name, t0=t0, t1=t1, result="ok", **_state_fields(state))
        return states

    def change_feed(self) -> ChangeFeed | None:
        return self.inner.change_feed()

    def close(self) -> None:
        super().close()
        self.inner.close()


def load(folder: Path) -> tuple[list[Event], int]:
    """Every event of every file in ``folder``, and how many lines were torn (a killed writer)."""
    events: list[Event] = []
    torn = 0
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                events.append(json.loads(line))
            except ValueError:
                torn += 1
    return events, torn


# -- the checker -----------------------------------------------------------------------------------


@dataclasses.dataclass
class Violation:
    """One invariant the history breaks. ``expected`` marks a documented limit, shown but not failed."""

    invariant: str
    key: str | None
    detail: str
    expected: bool = False
    reason: str = ""

    def __str__(self) -> str:
        where = f" [{self.key}]" if self.key else ""
        note = f" (expected: {self.reason})" if self.expected else ""
        return f"{self.invariant}{where}: {self.detail}{note}"


@dataclasses.dataclass
class Expectations:
    """What a scenario promises beyond the universal invariants.

    :param single_execution: no key's work may run twice (nothing in the scenario may legitimately
        end a lease early: no kills, pauses, faults or failures).
    :param complete_keys: keys that must end with an artifact holding the right value.
    :param killed: processes the scenario killed on purpose (their unfinished calls are not hangs).
    :param clock_tolerance: seconds of resolution of the store's clock (Azure's Date header).
    :param timeouts_allowed: whether a waiter's own :class:`~dibs.WaitTimeout` is acceptable.
    :param unavailable_allowed: whether ``StoreUnavailable`` may reach a caller (fault scenarios).
    """

    single_execution: bool = False
    complete_keys: frozenset[str] = frozenset()
    killed: frozenset[str] = frozenset()
    clock_tolerance: float = 0.0
    timeouts_allowed: bool = False
    unavailable_allowed: bool = False


@dataclasses.dataclass
class Summary:
    """Counts that describe what the history contains (for the report)."""

    events: int = 0
    computes: int = 0
    executions: int = 0
    grants: int = 0
    takeovers: int = 0
    stale_writes_rejected: int = 0
    leases_lost: int = 0
    unavailable: int = 0
    unreserved_runs: int = 0
    unstored_results: int = 0
    timeouts: int = 0
    #: Over every takeover of a lease its holder had not ended: how long after the ttl (counted in
    #: real time from the holder's last extension) the new grant returned, at the closest. Negative
    #: means a takeover that came early; the exclusion check allows only the store's clock resolution.
    closest_takeover: float | None = None

    def add(self, other: Summary) -> None:
        for field in dataclasses.fields(self):
            mine, theirs = getattr(self, field.name), getattr(other, field.name)
            if field.name == "closest_takeover":
                known = [v for v in (mine, theirs) if v is not None]
                setattr(self, field.name, min(known) if known else None)
            else:
                setattr(self, field.name, mine + theirs)


@dataclasses.dataclass
class _Lease:
    key: str
    fence: int
    lease: str
    owner: str
    ttl: float
    acquired_at: float
    first_grant: Event
    extensions: list[Event] = dataclasses.field(default_factory=list)  # grants, heartbeats: t0, t1
    confirmed_expiry: float = 0.0
    completed_at: float | None = None
    ends: list[Event] = dataclasses.field(default_factory=list)  # complete/release ok or ambiguous

    def ended_by(self, t: float) -> bool:
        """Whether the holder had asked to end the lease (and it may have ended) before real time ``t``."""
        return any(end["t0"] < t for end in self.ends)


def _token(event: Event) -> tuple[int, str]:
    return int(event["fence"]), str(event["lease"])


def _leases(events: Iterable[Event]) -> dict[str, dict[tuple[int, str], _Lease]]:
    by_key: dict[str, dict[tuple[int, str], _Lease]] = defaultdict(dict)
    ordered = sorted((e for e in events if "t1" in e), key=lambda e: e["t1"])
    for event in ordered:
        op, result, key = event["op"], event.get("result"), str(event.get("key"))
        if op == "acquire" and result == "granted":
            token = _token(event)
            lease = by_key[key].get(token)
            if lease is None:
                lease = by_key[key][token] = _Lease(
                    key,
                    token[0],
                    token[1],
                    event["owner"],
                    float(event["ttl"]),
                    float(event["acquired_at"]),
                    event,
                )
            lease.extensions.append(event)
            lease.confirmed_expiry = max(lease.confirmed_expiry, float(event["expires_at"]))
        elif op == "heartbeat" and result == "ok":
            lease = by_key[key].get(_token(event))
            if lease is not None:
                lease.extensions.append(event)
                lease.confirmed_expiry = max(lease.confirmed_expiry, float(event["expires_at"]))
        elif op in ("complete", "release") and result in ("ok", "unavailable"):
            lease = by_key[key].get(_token(event))
            if lease is not None:
                lease.ends.append(event)
                if op == "complete" and result == "ok":
                    lease.completed_at = float(event["at"])
    # Observations by other processes (a Held answer, a read) also confirm how long a lease lives.
    for event in ordered:
        holder = event.get("holder")
        if holder:
            lease = by_key[event["key"]].get((int(holder["fence"]), str(holder["lease"])))
            if lease is not None:
                lease.confirmed_expiry = max(lease.confirmed_expiry, float(holder["expires_at"]))
    return by_key


def _check_exclusion(
    leases: dict[str, dict[tuple[int, str], _Lease]], tolerance: float, out: list[Violation]
) -> float | None:
    """At most one live lease per key at any store instant, judged two independent ways.

    *Store time*: the intervals ``[acquired_at, end)`` the store itself reported, where ``end`` is
    the latest expiry the store confirmed, or the artifact's creation time once completed. A lease
    whose holder released it may end earlier than the store ever said; that overlap is excused
    only when the release was sent before the next grant returned.

    *Real time* (needs no clock but the local monotonic one): when the store extended A's lease to
    ``store-now + ttl`` inside ``[E.t0, E.t1]`` and later granted B inside ``[G.t0, G.t1]``, with
    ``E.t1 < G.t0``, then B may only have been granted if ``G.t1 - E.t0 >= ttl``, unless A was
    completed or released in between.
    """
    closest: float | None = None
    for key, tokens in leases.items():
        ordered = sorted(tokens.values(), key=lambda lease: (lease.fence, lease.first_grant["t1"]))
        for i, a in enumerate(ordered):
            for b in ordered[i + 1 :]:
                if a.fence == b.fence:
                    out.append(
                        Violation(
                            "fencing", key, f"two leases share fence {a.fence}: {a.owner!r} and {b.owner!r}"
                        )
                    )
                    continue
                end = (
                    a.confirmed_expiry if a.completed_at is None else min(a.completed_at, a.confirmed_expiry)
                )
                grant = b.first_grant
                if b.acquired_at < end - tolerance - SLACK_SECONDS and not a.ended_by(grant["t1"]):
                    out.append(
                        Violation(
                            "exclusion (store clock)",
                            key,
                            f"lease {b.fence} of {b.owner!r} acquired at store time {b.acquired_at:.3f}, "
                            f"while lease {a.fence} of {a.owner!r} was live until {end:.3f} "
                            f"({end - b.acquired_at:.3f}s overlap)",
                        )
                    )
        for b in ordered:
            grant = b.first_grant
            for a in ordered:
                if a is b:
                    continue
                before = [e for e in a.extensions if e["t1"] < grant["t0"]]
                if not before:
                    continue
                last = max(before, key=lambda e: e["t0"])
                gap = grant["t1"] - last["t0"]
                if not a.ended_by(grant["t1"]):
                    margin = gap - a.ttl
                    closest = margin if closest is None else min(closest, margin)
                if gap < a.ttl * (1 - RATE_TOLERANCE) - tolerance - SLACK_SECONDS and not a.ended_by(
                    grant["t1"]
                ):
                    out.append(
                        Violation(
                            "exclusion (real time)",
                            key,
                            f"lease {b.fence} of {b.owner!r} was granted {gap:.3f}s after lease {a.fence} of "
                            f"{a.owner!r} was extended by {a.ttl:g}s, and {a.owner!r} had not ended it",
                        )
                    )
    return closest


def _check_fencing(leases: dict[str, dict[tuple[int, str], _Lease]], out: list[Violation]) -> None:
    """A grant that starts after another one returned must carry a strictly greater fence.

    Removal keeps a tombstone with the key's fence (``discard``, ``prune`` and ``reap`` never delete a
    record), so this holds across removals too; no scenario removes one yet."""
    for key, tokens in leases.items():
        grants = sorted((lease.first_grant for lease in tokens.values()), key=lambda e: e["t0"])
        for i, later in enumerate(grants):
            for earlier in grants[:i]:
                if earlier["t1"] < later["t0"] and int(later["fence"]) <= int(earlier["fence"]):
                    out.append(
                        Violation(
                            "fencing",
                            key,
                            f"fence went from {earlier['fence']} ({earlier['owner']!r}) to {later['fence']} "
                            f"({later['owner']!r}), although the second grant began after the first returned",
                        )
                    )


def _check_stale_writes(
    events: list[Event],
    leases: dict[str, dict[tuple[int, str], _Lease]],
    tolerance: float,
    out: list[Violation],
) -> None:
    """No write is accepted with a token that a newer grant (or a stored artifact) made stale."""
    completes_ok: dict[str, list[Event]] = defaultdict(list)
    for event in events:
        if event["op"] == "complete" and event.get("result") == "ok":
            completes_ok[event["key"]].append(event)
    for event in events:
        op = event["op"]
        if op not in ("heartbeat", "complete", "release") or event.get("result") != "ok":
            continue
        key, fence = event["key"], int(event["fence"])
        for newer in leases.get(key, {}).values():
            if newer.fence <= fence:
                continue
            grant = newer.first_grant
            if grant["t1"] < event["t0"]:
                out.append(
                    Violation(
                        "stale write accepted",
                        key,
                        f"{op} with token {fence} by {event['proc']} was accepted, although token "
                        f"{newer.fence} had been granted to {newer.owner!r} before the {op} was sent",
                    )
                )
            elif op == "complete" and float(event["at"]) > newer.acquired_at + tolerance + SLACK_SECONDS:
                out.append(
                    Violation(
                        "stale write accepted",
                        key,
                        f"complete with token {fence} stored at store time {float(event['at']):.3f}, after "
                        f"token {newer.fence} was granted at {newer.acquired_at:.3f}",
                    )
                )
        for done in completes_ok[key]:
            same = int(done["fence"]) == fence and done.get("lease") == event.get("lease")
            if done["t1"] < event["t0"] and not (same and op == "complete"):
                out.append(
                    Violation(
                        "stale write accepted",
                        key,
                        f"{op} with token {fence} by {event['proc']} was accepted after the key was "
                        "completed "
                        f"with token {done['fence']}",
                    )
                )


def _artifact_key(identity: dict[str, Any]) -> tuple[Any, ...]:
    return identity["fence"], identity["checksum"], identity["producer"]


def _check_artifacts(events: list[Event], out: list[Violation]) -> None:
    """At most one artifact per key, never replaced: every observation names the same one."""
    seen: dict[str, dict[tuple[Any, ...], Event]] = defaultdict(dict)
    for event in sorted(
        (e for e in events if "t1" in e or "t0" in e), key=lambda e: float(e.get("t1", e.get("t0", 0)))
    ):
        identity = event.get("artifact")
        if isinstance(identity, dict):
            seen[event["key"]].setdefault(_artifact_key(identity), event)
    for key, identities in seen.items():
        if len(identities) > 1:
            described = "; ".join(
                f"fence {ident[0]} by {ident[2]!r} (first seen by {ev['proc']} in {ev['op']})"
                for ident, ev in identities.items()
            )
            out.append(
                Violation(
                    "single artifact", key, f"{len(identities)} different artifacts observed: {described}"
                )
            )
    fences: dict[str, set[int]] = defaultdict(set)
    for event in events:
        if event["op"] == "complete" and event.get("result") == "ok":
            fences[event["key"]].add(int(event["fence"]))
    for key, accepted in fences.items():
        if len(accepted) > 1:
            out.append(Violation("single artifact", key, f"completes accepted for tokens {sorted(accepted)}"))


class _Calls:
    """The checks on ``compute`` calls: every caller returns with the right value, the unavailable
    policy is honoured and logged, results are never misreported, and work runs at most once per
    call (and per key, when the scenario promises it)."""

    LOUD = ("WARNING", "ERROR", "CRITICAL")

    def __init__(
        self, events: list[Event], expect: Expectations, out: list[Violation], summary: Summary
    ) -> None:
        self.expect, self.out, self.summary = expect, out, summary
        self.invokes: dict[tuple[str, str], Event] = {}
        self.returns: dict[tuple[str, str], Event] = {}
        self.logs: dict[str, list[Event]] = defaultdict(list)
        self.executions: dict[str, list[Event]] = defaultdict(list)
        self.finals: dict[str, Event] = {}
        for event in events:
            op = event["op"]
            if op == "compute":
                calls = self.invokes if event["phase"] == "invoke" else self.returns
                calls[(event["proc"], event["owner"])] = event
            elif op == "log":
                self.logs[event["proc"]].append(event)
            elif op == "exec" and event.get("phase") == "start":
                self.executions[event["key"]].append(event)
            elif op == "final":
                self.finals[event["key"]] = event
            elif op == "crash" and event["proc"] not in expect.killed:
                trace = event.get("traceback", "")
                detail = f"{event['proc']} died of {event['result']}: {event['error']}\n{trace}"
                self.flag("clear errors", None, detail)

    def flag(self, invariant: str, key: str | None, detail: str) -> None:
        self.out.append(Violation(invariant, key, detail))

    def logged(self, ret: Event) -> bool:
        """Whether the caller's process logged (warning or worse) about this call's key meanwhile."""
        logs = self.logs[ret["proc"]]
        if ret.get("opened") is False:  # the client could not even be created: that was logged once
            return any(log["level"] in self.LOUD for log in logs)
        start = self.invokes.get((ret["proc"], ret["owner"]), ret)["t0"]
        return any(
            log["level"] in self.LOUD
            and ret["key"] in str(log.get("msg", ""))
            and start - 1 <= log["t0"] <= ret["t1"] + 1
            for log in logs
        )

    def final_artifact(self, key: str) -> dict[str, Any] | None:
        artifact = self.finals.get(key, {}).get("artifact")
        return artifact if isinstance(artifact, dict) else None

    def run(self) -> None:
        self.summary.computes += len(self.invokes)
        self.summary.executions += sum(len(v) for v in self.executions.values())
        for ident, invoke in self.invokes.items():
            ret = self.returns.get(ident)
            if ret is None:
                if invoke["proc"] not in self.expect.killed:
                    self.flag(
                        "waiter returns",
                        invoke["key"],
                        f"{invoke['proc']} ({invoke['owner']}) never returned",
                    )
            elif ret["result"] in ("computed", "waited", "hit", "unreserved"):
                self.returned(ret)
            elif ret["result"] == "raised:WaitTimeout":
                self.summary.timeouts += 1
                if not self.expect.timeouts_allowed:
                    self.flag("waiter returns", ret["key"], f"{ret['proc']} timed out: {ret.get('error')}")
            elif ret["result"] == "raised:StoreUnavailable":
                self.unavailable(ret)
            else:
                self.flag("clear errors", ret["key"], f"{ret['proc']} {ret['result']}: {ret.get('error')}")
        self.executed()
        self.completed()

    def returned(self, ret: Event) -> None:
        key, result, proc = ret["key"], ret["result"], ret["proc"]
        if not ret.get("value_ok"):
            self.flag("correct value", key, f"{proc} got {ret.get('value')!r}")
        if result == "unreserved":
            self.summary.unreserved_runs += 1
            if ret.get("policy") != "run":
                self.flag(
                    "unavailable policy", key, f"{proc} ran unreserved under policy {ret.get('policy')!r}"
                )
            elif not self.logged(ret):
                self.flag("unavailable policy", key, f"{proc} ran unreserved without a log line")
        if result != "computed":
            return
        final = self.final_artifact(key)
        if not ret.get("stored", True):
            self.summary.unstored_results += 1
            if not self.logged(ret):
                self.flag("lost lease reported", key, f"{proc} did not log why its value was not stored")
            if final and final.get("producer") == ret["owner"]:
                self.flag(
                    "ambiguity resolved",
                    key,
                    f"{proc} reported its value as not stored, but the stored artifact is its own "
                    f"(token {final['fence']}): the outcome was not re-read",
                )
        elif key in self.finals and (not final or final.get("producer") != ret["owner"]):
            self.flag(
                "no lost artifact",
                key,
                f"{proc} stored token {ret.get('token')}, but the final artifact is {final}",
            )

    def unavailable(self, ret: Event) -> None:
        key, proc = ret["key"], ret["proc"]
        self.summary.unavailable += 1
        if ret.get("policy") == "run":
            self.flag("unavailable policy", key, f"{proc} (policy 'run') raised: {ret.get('error')}")
        elif not self.expect.unavailable_allowed:
            self.flag("waiter returns", key, f"{proc} raised: {ret.get('error')}")
        elif not self.logged(ret):
            self.flag("unavailable policy", key, f"{proc} raised StoreUnavailable without a log line")
        final = self.final_artifact(key)
        if final and final.get("producer") == ret["owner"]:
            self.flag(
                "ambiguity resolved",
                key,
                f"{proc} raised StoreUnavailable, but the stored artifact is its own "
                f"(token {final['fence']}): "
                "the outcome was not re-read",
            )

    def executed(self) -> None:
        for key, runs in self.executions.items():
            owners = [run["owner"] for run in runs]
            if len(set(owners)) != len(owners):
                self.flag("single execution", key, "one call ran the work twice")
            if self.expect.single_execution and len(runs) > 1:
                self.flag(
                    "single execution",
                    key,
                    f"work ran {len(runs)} times: {', '.join(r['proc'] for r in runs)}",
                )

    def completed(self) -> None:
        for key in self.expect.complete_keys:
            final = self.finals.get(key)
            if final is None:
                self.flag("no lost artifact", key, "the key was never read at the end")
            elif not final.get("artifact"):
                self.flag(
                    "no lost artifact", key, f"no artifact at the end ({final.get('error', 'none stored')})"
                )
            elif not final.get("value_ok"):
                self.flag(
                    "correct value", key, f"the final artifact is not the right value: {final.get('error')}"
                )


def check(events: list[Event], expect: Expectations) -> tuple[list[Violation], Summary]:
    """Every invariant over one scenario's merged history; returns the violations and a summary."""
    out: list[Violation] = []
    summary = Summary(events=len(events))
    leases = _leases(events)
    for tokens in leases.values():
        summary.grants += len(tokens)
        summary.takeovers += sum(1 for lease in tokens.values() if lease.first_grant.get("took_over_from"))
    lost: set[tuple[str, int]] = set()
    for event in events:
        if event["op"] in ("heartbeat", "complete") and event.get("result") == "lost":
            summary.stale_writes_rejected += 1
            lost.add((event["key"], int(event["fence"])))
    summary.leases_lost = len(lost)
    summary.closest_takeover = _check_exclusion(leases, expect.clock_tolerance, out)
    _check_fencing(leases, out)
    _check_stale_writes(events, leases, expect.clock_tolerance, out)
    _check_artifacts(events, out)
    _Calls(events, expect, out, summary).run()
    return _dedupe(out), summary


def _dedupe(violations: list[Violation]) -> list[Violation]:
    seen: set[tuple[str, str | None, str]] = set()
    unique = []
    for violation in violations:
        ident = (violation.invariant, violation.key, violation.detail)
        if ident not in seen:
            seen.add(ident)
            unique.append(violation)
    return unique


def busiest_second(events: list[Event], procs: set[str]) -> dict[tuple[str, str], int]:
    """For each call of ``procs``: the most times it asked for a held key within one second.

    A waiter backs off (capped exponential backoff, or a notification): a few asks per second at
    most. Dozens mean it spins, hammering the store while it waits.
    """
    asks: dict[tuple[str, str], list[float]] = defaultdict(list)
    for event in events:
        if event["op"] == "acquire" and event.get("result") == "held" and event["proc"] in procs:
            asks[(event["proc"], str(event.get("owner")))].append(float(event["t0"]))
    busiest = {}
    for call, times in asks.items():
        times.sort()
        start, most = 0, 0
        for end, at in enumerate(times):
            while at - times[start] > 1.0:
                start += 1
            most = max(most, end - start + 1)
        busiest[call] = most
    return busiest


def mark_expected(violations: list[Violation], which: Callable[[Violation], bool], reason: str) -> None:
    """Mark the violations ``which`` selects as a documented limit (shown in the report, not failed)."""
    for violation in violations:
        if which(violation):
            violation.expected = True
            violation.reason = reason

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

import bisect
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
from dibs.stores import AcquireRequest, NewArtifact
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
    "may_have_acted",
    "outcome_of",
    "payload_misses",
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

    def acquire(self, key: Key, request: AcquireRequest) -> StoreOutcome:
        t0 = now()
        try:
            outcome = self.inner.acquire(key, request)
        except Exception as exc:
            self._failed("acquire", key, t0, exc, owner=request.owner)
            raise
        t1 = now()
        if isinstance(outcome, Present):
            self.recorder.emit(
                "acquire",
                key=key.name,
                t0=t0,
                t1=t1,
                owner=request.owner,
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
                owner=request.owner,
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

    def complete(self, key: Key, token: LeaseToken, new: NewArtifact) -> ArtifactRecord:
        t0 = now()
        try:
            artifact = self.inner.complete(key, token, new)
        except Exception as exc:
            self._failed(
                "complete", key, t0, exc, fence=token.fence, lease=token.lease_id, checksum=new.checksum
            )
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

    def _removal(self, op: str, key: Key | None, call: Callable[[], Any], **fields: Any) -> Any:
        """One removal (or repair) call, recorded with its outcome: the checker needs to know that a
        removal *may* have happened even when its reply was lost (``result`` other than ``ok``)."""
        where = {"key": key.name} if key is not None else {}
        t0 = now()
        try:
            answer = call()
        except Exception as exc:
            self.recorder.emit(
                op, t0=t0, t1=now(), result=outcome_of(exc), error=str(exc)[:500], **where, **fields
            )
            raise
        self.recorder.emit(op, t0=t0, t1=now(), result="ok", changed=answer, **where, **fields)
        return answer

    def force_release(self, key: Key) -> bool:
        return bool(self._removal("force_release", key, lambda: self.inner.force_release(key)))

    def forget(self, key: Key) -> bool:
        return bool(self._removal("forget", key, lambda: self.inner.forget(key)))

    def discard(self, key: Key) -> bool:
        return bool(self._removal("discard", key, lambda: self.inner.discard(key)))

    def prune(self, namespace: str | None, older_than: float) -> int:
        return int(
            self._removal(
                "prune",
                None,
                lambda: self.inner.prune(namespace, older_than),
                namespace=namespace,
                older_than=older_than,
            )
        )

    def list(self, namespace: str | None = None) -> Iterator[KeyState]:
        return self.inner.list(namespace)

    def reap(self, namespace: str | None = None) -> int:
        return int(self._removal("reap", None, lambda: self.inner.reap(namespace), namespace=namespace))

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
        """Whether the lease may have ended early before real time ``t``: its holder had asked to end
        it (complete, release), or an operator's ``force_release`` of the key had been sent."""
        return any(end["t0"] < t for end in self.ends)


#: The removals that may take a key's artifact away (``forget`` of the key, ``prune`` of its
#: namespace). ``reap`` and ``discard`` only clear expired leases and records that hold nothing.
ARTIFACT_REMOVALS = ("forget", "prune")
#: Every removal or repair the checker knows (recorded by :class:`RecordingStore`).
REMOVALS = ("forget", "prune", "reap", "discard", "force_release")


def may_have_acted(event: Event) -> bool:
    """A removal changed something, or may have: it said so, or its reply was lost."""
    return event.get("result") != "ok" or bool(event.get("changed"))


class _Removals:
    """The removals in a history, for the checks that a removal legitimately excuses."""

    def __init__(self, events: Iterable[Event]) -> None:
        self.forgets: dict[str, list[Event]] = defaultdict(list)
        self.prunes: list[Event] = []  # a prune may remove any key of its namespace
        self.force_releases: dict[str, list[Event]] = defaultdict(list)
        for event in events:
            op = event["op"]
            if op not in REMOVALS or "t1" not in event or not may_have_acted(event):
                continue
            if op == "forget":
                self.forgets[str(event["key"])].append(event)
            elif op == "prune":
                self.prunes.append(event)
            elif op == "force_release":
                self.force_releases[str(event["key"])].append(event)

    def removes_artifacts(self, key: str) -> bool:
        return bool(self.forgets.get(key)) or bool(self.prunes)

    def artifact_removal(self, key: str, after: float, before: float) -> Event | None:
        """A removal of ``key``'s artifact that may have taken effect inside ``(after, before)``: it
        ended after ``after`` and began before ``before``."""
        for event in (*self.forgets.get(key, ()), *self.prunes):
            if event["t1"] > after and event["t0"] < before:
                return event
        return None


def _token(event: Event) -> tuple[int, str]:
    return int(event["fence"]), str(event["lease"])


def _leases(events: Iterable[Event]) -> dict[str, dict[tuple[int, str], _Lease]]:
    by_key: dict[str, dict[tuple[int, str], _Lease]] = defaultdict(dict)
    ordered = sorted((e for e in events if "t1" in e), key=lambda e: e["t1"])
    forced: list[Event] = []
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
        elif op == "force_release" and may_have_acted(event):
            forced.append(event)
    # An operator's force_release ends whichever lease the key had when it acted: any lease granted
    # before the force_release returned.
    for event in forced:
        for lease in by_key[str(event["key"])].values():
            if lease.first_grant["t0"] < event["t1"]:
                lease.ends.append(event)
    # A lease whose own artifact was observed was completed, whatever its complete call reported
    # (a store may wrongly report a complete that took effect as lost: see _check_outcomes).
    for event in ordered:
        identity = event.get("artifact")
        if not isinstance(identity, dict):
            continue
        for lease in by_key[str(event.get("key"))].values():
            if lease.fence == int(identity["fence"]) and lease.owner == identity["producer"]:
                if lease.completed_at is None:
                    lease.completed_at = float(identity["created_at"])
                if not lease.ends:
                    own = [e for e in ordered if e["op"] == "complete" and e.get("lease") == lease.lease]
                    lease.ends.append(own[0] if own else event)
    # Observations by other processes (a Held answer, a read) also confirm how long a lease lives.
    for event in ordered:
        holder = event.get("holder")
        if holder:
            lease = by_key[event["key"]].get((int(holder["fence"]), str(holder["lease"])))
            if lease is not None:
                lease.confirmed_expiry = max(lease.confirmed_expiry, float(holder["expires_at"]))
    return by_key


def _granted_before(a: _Lease, b: _Lease) -> bool:
    """Whether the store granted ``a`` before ``b``: by real time when the two grant calls did not
    overlap (no clock or fence needed), else by fence (the store's own order, when fencing holds;
    the fencing checks report it when it does not)."""
    ga, gb = a.first_grant, b.first_grant
    if ga["t1"] < gb["t0"]:
        return True
    if gb["t1"] < ga["t0"]:
        return False
    return (a.fence, ga["t1"]) < (b.fence, gb["t1"])


def _check_exclusion(
    leases: dict[str, dict[tuple[int, str], _Lease]], tolerance: float, out: list[Violation]
) -> float | None:
    """At most one live lease per key at any store instant, judged two independent ways.

    *Store time*: the intervals ``[acquired_at, end)`` the store itself reported, where ``end`` is
    the latest expiry the store confirmed, or the artifact's creation time once completed. A lease
    whose holder released it (or that an operator force-released) may end earlier than the store
    ever said; that overlap is excused only when the release was sent before the next grant returned.
    Removals that are not repairs (``forget``, ``prune``, ``reap``, ``discard``) never excuse an
    overlap: they may only take away leases that had already expired.

    *Real time* (needs no clock but the local monotonic one): when the store extended A's lease to
    ``store-now + ttl`` inside ``[E.t0, E.t1]`` and later granted B inside ``[G.t0, G.t1]``, with
    ``E.t1 < G.t0``, then B may only have been granted if ``G.t1 - E.t0 >= ttl``, unless A was
    completed or released in between.
    """
    closest: float | None = None
    for key, tokens in leases.items():
        ordered = sorted(tokens.values(), key=lambda lease: (lease.first_grant["t1"], lease.fence))
        sharing: dict[int, list[str]] = defaultdict(list)
        for lease in ordered:
            sharing[lease.fence].append(lease.owner)
        for fence, owners in sharing.items():
            if len(owners) > 1:
                out.append(
                    Violation(
                        "fencing",
                        key,
                        f"{len(owners)} leases share fence {fence}: {', '.join(map(repr, owners))}",
                    )
                )
        for i, first in enumerate(ordered):
            for second in ordered[i + 1 :]:
                if first.fence == second.fence:
                    continue  # reported above
                a, b = (first, second) if _granted_before(first, second) else (second, first)
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


def _check_fencing(
    events: list[Event], leases: dict[str, dict[tuple[int, str], _Lease]], out: list[Violation]
) -> None:
    """Fences only go up, for the life of the store, removals included (the contract's guarantee 7).

    A grant that starts after another one returned must carry a strictly greater fence; and the
    key's fence as any later read reports it (a removed record's too) may never be below a fence
    granted or read before that read began: a fence that went down lets a later token repeat or
    undercut an earlier one."""
    for key, tokens in leases.items():
        grants = sorted((lease.first_grant for lease in tokens.values()), key=lambda e: e["t0"])
        for i, later in enumerate(grants):
            returned = [earlier for earlier in grants[:i] if earlier["t1"] < later["t0"]]
            earlier = max(returned, key=lambda e: int(e["fence"]), default=None)
            if earlier is not None and int(later["fence"]) <= int(earlier["fence"]):
                out.append(
                    Violation(
                        "fencing",
                        key,
                        f"fence went from {earlier['fence']} ({earlier['owner']!r}) to {later['fence']} "
                        f"({later['owner']!r}), although the second grant began after the first returned",
                    )
                )
    seen: dict[str, list[tuple[float, float, int, Event]]] = defaultdict(list)
    for event in events:
        if event["op"] in ("read", "final") and event.get("result", "ok") == "ok" and "key_fence" in event:
            seen[event["key"]].append((event["t0"], event["t1"], int(event["key_fence"]), event))
        elif event["op"] == "acquire" and event.get("result") == "granted":
            seen[event["key"]].append((event["t0"], event["t1"], int(event["fence"]), event))
    for key, fences in seen.items():
        by_end = sorted(fences, key=lambda f: f[1])
        highest: list[tuple[float, int, Event]] = []  # (t1, the highest fence seen by then, its event)
        for _, t1, fence, event in by_end:
            if not highest or fence > highest[-1][1]:
                highest.append((t1, fence, event))
            else:
                highest.append((t1, highest[-1][1], highest[-1][2]))
        ends = [h[0] for h in highest]
        for t0, _, fence, event in sorted(fences, key=lambda f: f[0]):
            if event["op"] not in ("read", "final"):
                continue
            i = bisect.bisect_left(ends, t0) - 1
            if i >= 0 and highest[i][1] > fence:
                before = highest[i][2]
                out.append(
                    Violation(
                        "fencing",
                        key,
                        f"the key's fence went down: {before['proc']} saw fence {highest[i][1]} "
                        f"({before['op']}), then {event['proc']} read fence {fence} in a read begun "
                        "after that",
                    )
                )
                break  # one per key: the rest of its history follows from it


def _check_stale_writes(
    events: list[Event],
    leases: dict[str, dict[tuple[int, str], _Lease]],
    tolerance: float,
    out: list[Violation],
) -> None:
    """No write is accepted with a token that a newer grant (or a stored artifact) made stale.

    *Newer* is judged by real time where the two grant calls did not overlap, else by fence
    (:func:`_granted_before`), so that a fence that went backwards cannot hide a stale write."""
    completes_ok: dict[str, list[Event]] = defaultdict(list)
    for event in events:
        if event["op"] == "complete" and event.get("result") == "ok":
            completes_ok[event["key"]].append(event)
    for event in events:
        op = event["op"]
        if op not in ("heartbeat", "complete", "release") or event.get("result") != "ok":
            continue
        key, fence = event["key"], int(event["fence"])
        mine = leases.get(key, {}).get(_token(event))
        for newer in leases.get(key, {}).values():
            if newer is mine:
                continue
            if mine is not None and not _granted_before(mine, newer):
                continue
            if mine is None and newer.fence <= fence:
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
            if done["t1"] >= event["t0"] or (same and op == "complete"):
                continue
            # A token granted after that completion (the artifact was removed meanwhile: the
            # artifact checks judge whether it may have been) is not stale because of it.
            if mine is not None and mine.first_grant["t1"] > done["t0"] and not same:
                continue
            out.append(
                Violation(
                    "stale write accepted",
                    key,
                    f"{op} with token {fence} by {event['proc']} was accepted after the key was "
                    f"completed with token {done['fence']}",
                )
            )


def _check_outcomes(
    events: list[Event], leases: dict[str, dict[tuple[int, str], _Lease]], out: list[Violation]
) -> None:
    """A complete the store refused (``LeaseLost``) must not have stored its artifact: the holder is
    told its value was not stored, and its lease not ended by it. Checked by the artifact itself: an
    observation anywhere of the artifact of that token, with that checksum and producer."""
    observed: dict[tuple[str, int, str, str], Event] = {}
    for event in sorted((e for e in events if "t1" in e), key=lambda e: e["t1"]):
        identity = event.get("artifact")
        if isinstance(identity, dict) and "key" in event:
            ident = (
                str(event["key"]),
                int(identity["fence"]),
                str(identity["checksum"]),
                str(identity["producer"]),
            )
            observed.setdefault(ident, event)
    for event in events:
        if event["op"] != "complete" or event.get("result") != "lost":
            continue
        lease = leases.get(event["key"], {}).get(_token(event))
        if lease is None:
            continue
        seen = observed.get((event["key"], lease.fence, str(event.get("checksum")), lease.owner))
        if seen is not None:
            out.append(
                Violation(
                    "complete outcome",
                    event["key"],
                    f"{event['proc']}'s complete with token {lease.fence} was refused "
                    f"({event.get('error')}), but its artifact was stored: {seen['proc']} saw it "
                    f"({seen['op']})",
                )
            )


def _artifact_key(identity: dict[str, Any]) -> tuple[Any, ...]:
    return identity["fence"], identity["checksum"], identity["producer"]


def _observations(events: list[Event]) -> dict[str, list[tuple[float, float, tuple[Any, ...] | None, Event]]]:
    """Per key, what each event says the key's artifact was at some instant inside ``[t0, t1]``:
    its identity, or ``None`` for none (a grant or a Held answer: no artifact was there; a read
    without one). Calls whose outcome is unknown say nothing."""
    seen: dict[str, list[tuple[float, float, tuple[Any, ...] | None, Event]]] = defaultdict(list)
    for event in events:
        op, result = event["op"], event.get("result")
        if "t0" not in event or "key" not in event:
            continue
        identity = event.get("artifact")
        ident = _artifact_key(identity) if isinstance(identity, dict) else None
        says = {
            "complete": result == "ok",
            "acquire": result in ("present", "granted", "held"),
            "read": result == "ok",
            "final": "error" not in event,
        }
        if not says.get(op, False):
            continue
        t0 = float(event["t0"])
        seen[str(event["key"])].append((t0, float(event.get("t1", t0)), ident, event))
    return seen


def _describe(ident: tuple[Any, ...] | None) -> str:
    return "no artifact" if ident is None else f"the artifact of fence {ident[0]} by {ident[2]!r}"


def _check_artifacts(events: list[Event], removals: _Removals, out: list[Violation]) -> None:
    """No stored artifact is lost or replaced, except by a removal that may have taken it.

    Without a ``forget`` or ``prune`` in the history, every observation of a key's artifact names
    the same one, and only one completion is accepted (the first wins, never replaced). With them,
    an artifact X may disappear, but only through one: once X was certainly stored (an observation
    of it returned), a later observation of anything else (another artifact, or none) requires a
    removal that ended after X could have been stored and began before that observation returned;
    and X, once seen gone, never comes back."""
    observations = _observations(events)
    for key, seen in observations.items():
        if not removals.removes_artifacts(key):
            first: dict[tuple[Any, ...], Event] = {}
            for _, _, ident, event in sorted(seen, key=lambda s: s[1]):
                if ident is not None:
                    first.setdefault(ident, event)
            if len(first) > 1:
                described = "; ".join(
                    f"fence {ident[0]} by {ident[2]!r} (first seen by {ev['proc']} in {ev['op']})"
                    for ident, ev in first.items()
                )
                detail = f"{len(first)} different artifacts observed: {described}"
                out.append(Violation("single artifact", key, detail))
            accepted = sorted({int(e["fence"]) for _, _, i, e in seen if e["op"] == "complete"})
            if len(accepted) > 1:
                out.append(Violation("single artifact", key, f"completes accepted for tokens {accepted}"))
        idents = {ident for _, _, ident, _ in seen if ident is not None}
        for ident in idents:
            mine = [s for s in seen if s[2] == ident]
            born = min(s[0] for s in mine)  # it was stored no earlier than this
            stored_by = min(s[1] for s in mine)  # and certainly by this
            last_seen = max(s[0] for s in mine)
            others = [s for s in seen if s[2] != ident and s[0] > stored_by]
            if not others:
                continue
            gone = min(others, key=lambda s: s[1])
            if removals.artifact_removal(key, born, gone[1]) is None:
                event, witness = gone[3], mine[0][3]
                out.append(
                    Violation(
                        "no lost artifact",
                        key,
                        f"{_describe(ident)} was stored (seen by {witness['proc']} in {witness['op']}), "
                        f"then {event['proc']} saw {_describe(gone[2])} ({event['op']}) although no "
                        "forget or prune could have removed it in between",
                    )
                )
            back = [s for s in others if s[1] < last_seen]
            if back:
                event = min(back, key=lambda s: s[1])[3]
                out.append(
                    Violation(
                        "no lost artifact",
                        key,
                        f"{_describe(ident)} came back: {event['proc']} saw {_describe(back[0][2])} "
                        f"({event['op']}), and a later observation showed the old artifact again",
                    )
                )
    for event in events:
        if event["op"] in ("read", "acquire", "complete") and event.get("result") in (
            "corrupt",
            "error:ArtifactCorrupted",
        ):
            out.append(
                Violation(
                    "no lost artifact",
                    event.get("key"),
                    f"{event['proc']}'s {event['op']} found a damaged record or payload: "
                    f"{event.get('error')}",
                )
            )


class _Calls:
    """The checks on ``compute`` calls: every caller returns with the right value, the unavailable
    policy is honoured and logged, results are never misreported, and work runs at most once per
    call (and per key, when the scenario promises it)."""

    LOUD = ("WARNING", "ERROR", "CRITICAL")

    def __init__(
        self,
        events: list[Event],
        expect: Expectations,
        out: list[Violation],
        summary: Summary,
        removals: _Removals,
    ) -> None:
        self.expect, self.out, self.summary, self.removals = expect, out, summary, removals
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

    def _invoked_at(self, ret: Event) -> float:
        invoke: Event = self.invokes.get((ret["proc"], ret["owner"]), ret)
        return float(invoke["t0"] if "t0" in invoke else ret["t1"])

    def _final_t1(self, key: str) -> float:
        final: Event = self.finals[key]
        return float(final["t1"] if "t1" in final else final["t0"])

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
            elif ret["result"] in ("raised:ArtifactCorrupted", "raised:CorruptRecord"):
                self.flag(
                    "no lost artifact",
                    ret["key"],
                    f"{ret['proc']} {ret['result']} (a payload gone or damaged while its record still "
                    f"named it): {ret.get('error')}",
                )
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
        elif (
            key in self.finals
            and (not final or final.get("producer") != ret["owner"])
            and self.removals.artifact_removal(key, self._invoked_at(ret), self._final_t1(key)) is None
        ):
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
    removals = _Removals(events)
    _check_fencing(events, leases, out)
    _check_stale_writes(events, leases, expect.clock_tolerance, out)
    _check_outcomes(events, leases, out)
    _check_artifacts(events, removals, out)
    _Calls(events, expect, out, summary, removals).run()
    return _dedupe(out), summary


#: What a reader logs when a payload its record names is not there (or not whole): a miss.
MISSING = "its artifact is treated as missing"


def payload_misses(events: list[Event]) -> tuple[list[Violation], int, int]:
    """The misses readers logged (:data:`MISSING`) where nothing damages payloads on purpose (the
    payload scenario): each must be excused by a ``forget`` of its key that ended after the key's
    last artifact before the miss was stored (a ``complete`` began) and began before the miss; else
    it is a payload lost while its record named it. Returns the violations, the misses, and how many
    a forget excused."""
    completes: dict[str, list[float]] = defaultdict(list)
    forgets: dict[str, list[Event]] = defaultdict(list)
    for event in events:
        if event["op"] == "complete" and event.get("result") == "ok":
            completes[str(event["key"])].append(float(event["t0"]))
        elif event["op"] == "forget" and "t1" in event and may_have_acted(event):
            forgets[str(event["key"])].append(event)
    out: list[Violation] = []
    misses = excused = 0
    for event in events:
        if event["op"] != "log" or MISSING not in str(event.get("msg", "")):
            continue
        misses += 1
        key = str(event["msg"]).split(":", 1)[0].rsplit("/", 1)[-1]  # "namespace/name: ..."
        at = float(event["t0"])
        stored = max((t for t in completes.get(key, []) if t < at), default=float("-inf"))
        if any(f["t1"] > stored and f["t0"] < at for f in forgets.get(key, [])):
            excused += 1
            continue
        detail = f"{event['proc']} found a payload its record named gone: {event['msg']}"
        out.append(Violation("no lost payload", key, detail))
    return out, misses, excused


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

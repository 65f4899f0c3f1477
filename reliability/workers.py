"""What the child processes of the reliability scenarios run.

A worker gets one JSON-able ``spec`` (its role, the store URL, the keys, the timings) and reports
nothing through pipes: everything it does is recorded in its own history file (see
:mod:`reliability.history`), because many workers are killed or paused on purpose and the parent
must not depend on them living long enough to answer.

Workers start either from a fork server (fast, for the hundreds of short-lived holders the kill
trials need) or as ``python -m reliability.workers SPEC`` (so that libfaketime can be preloaded
into the interpreter for the clock-skew scenario).
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import select
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, SupportsIndex

import dibs
from dibs.backoff import Backoff
from dibs.stores.base import RecordStore
from reliability.history import LogCapture, Recorder, RecordingStore, now

__all__ = ["expected_value", "main", "run"]


def expected_value(key: str) -> dict[str, str]:
    """The value every computation of ``key`` must produce (and every reader must get). The keys of a
    group ``sharedN.*`` share their value, so with a payload store their payloads are one: identical
    bytes published under several keys, what a collection must not lose (the payload scenario)."""
    if key.startswith("shared"):
        group = key.split(".", 1)[0]
        return {"key": group, "value": f"computed:{group}"}
    return {"key": key, "value": f"computed:{key}"}


class Worker:
    """One process's client, recorder and the compute-and-record loop shared by every role."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.proc = str(spec["proc"])
        self.recorder = Recorder(Path(spec["history"]) / f"{self.proc}.jsonl", self.proc)
        self.recorder.emit("clock", t0=now(), wall=time.time(), skew=spec.get("skew", 0))
        logger = logging.getLogger("dibs")
        logger.setLevel(logging.INFO)
        logger.addHandler(LogCapture(self.recorder))
        self.rng = random.Random(spec.get("seed", os.getpid()))
        self.open_error: Exception | None = None
        self.client: dibs.Reservations | None = None
        self._open()
        self.policy = spec.get("policy", "fail")
        self.go_file = Path(spec["go_file"]) if spec.get("go_file") else None

    def _open(self) -> None:
        """Create the client. With policy "fail" and the store down this raises; the worker then
        fails its calls and tries again on the next one, as a restarted task would."""
        spec, ttl = self.spec, float(self.spec["ttl"])
        payloads: dict[str, Any] = {}
        if spec.get("payloads"):  # every artifact in the payload store (inline limit 0)
            payloads = {
                "payloads": spec["payloads"],
                "payload_inline_limit": 0,
                "payload_grace": float(spec.get("payload_grace", 60.0)),
            }
        try:
            client = dibs.Reservations(
                spec["url"],
                namespace=spec["namespace"],
                ttl=ttl,
                heartbeat_interval=spec.get("interval"),
                on_store_unavailable=spec.get("policy", "fail"),
                backoff=Backoff(initial=0.01, maximum=min(0.5, ttl / 4)),
                **payloads,
            )
        except dibs.StoreUnavailable as exc:
            self.open_error = exc
            return
        client.store = RecordingStore(client.store, self.recorder)
        self.client, self.open_error = client, None

    def work(self, key: str, owner: str) -> dict[str, str]:
        """The "expensive task": recorded when it starts (so a kill mid-work still shows it ran)."""
        self.recorder.emit("exec", phase="start", key=key, owner=owner, t0=now())
        if self.go_file is not None:
            deadline = time.monotonic() + float(self.spec.get("go_timeout", 120))
            while not self.go_file.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        else:
            low, high = self.spec.get("work", (0.002, 0.02))
            time.sleep(self.rng.uniform(low, high))
        self.recorder.emit("exec", phase="end", key=key, owner=owner, t0=now())
        return expected_value(key)

    def compute(self, key: str, attempt: int = 0) -> bool:
        """One recorded ``Reservations.compute`` call; ``True`` when it returned a value."""
        owner = f"{self.proc}/{key}/{attempt}"
        timeout = float(self.spec.get("timeout", 120))
        self.recorder.emit("compute", phase="invoke", key=key, owner=owner, t0=now(), policy=self.policy)
        if self.client is None:
            self._open()
        opened = self.client is not None
        try:
            if self.client is None:
                assert self.open_error is not None
                raise self.open_error
            report = self.client.compute(key, self.work, args=(key, owner), owner=owner, timeout=timeout)
        except Exception as exc:  # every outcome is recorded, then judged by the checker
            self.recorder.emit(
                "compute",
                phase="return",
                key=key,
                owner=owner,
                t1=now(),
                policy=self.policy,
                result=f"raised:{type(exc).__name__}",
                error=str(exc)[:500],
                opened=opened,
            )
            return False
        ok = report.value == expected_value(key)
        self.recorder.emit(
            "compute",
            phase="return",
            key=key,
            owner=owner,
            t1=now(),
            policy=self.policy,
            result=report.role,
            stored=report.stored,
            token=report.token,
            value_ok=ok,
            value=None if ok else repr(report.value)[:200],
        )
        return True

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        self.recorder.close()


def _wait_until(start_mono: float | None) -> None:
    # CLOCK_MONOTONIC is shared by every process on the machine and libfaketime leaves it alone, so
    # it lines up skewed and unskewed workers alike.
    if start_mono is not None:
        while time.monotonic() < start_mono:
            time.sleep(0.002)


def _race(worker: Worker) -> None:
    _wait_until(worker.spec.get("start_mono"))
    for key in worker.spec["keys"]:
        worker.compute(key)


def _threads(worker: Worker) -> None:
    """One thread per key: a waiter process waiting on several keys at once."""
    _wait_until(worker.spec.get("start_mono"))
    threads = [
        threading.Thread(target=worker.compute, args=(key,), daemon=True) for key in worker.spec["keys"]
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _until_done(worker: Worker) -> None:
    """Walk the keys (skipping some at random, so that workers drift apart) until ``stop_mono``, then
    retry every key that failed until it returns a value or ``duration`` runs out: a caller that got
    ``StoreUnavailable`` tries the key again later, as a scheduler's retry would."""
    _wait_until(worker.spec.get("start_mono"))
    stop = float(worker.spec.get("stop_mono", float("inf")))
    deadline = time.monotonic() + float(worker.spec.get("duration", 60))
    skip = float(worker.spec.get("skip", 0.0))
    pending = []
    for key in worker.spec["keys"]:
        if time.monotonic() >= stop:
            break
        if worker.rng.random() >= skip and not worker.compute(key):
            pending.append(key)
    attempt = 1
    while pending and time.monotonic() < deadline:
        time.sleep(worker.rng.uniform(0.05, 0.3))
        pending = [key for key in pending if not worker.compute(key, attempt)]
        attempt += 1


def _loop(worker: Worker) -> None:
    """Walk the keys again and again, in a new random order each round, until ``stop_mono``: the
    keys that removers forget or prune meanwhile are computed again, under new leases."""
    _wait_until(worker.spec.get("start_mono"))
    stop = float(worker.spec["stop_mono"])
    keys = list(worker.spec["keys"])
    attempt = 0
    while time.monotonic() < stop:
        worker.rng.shuffle(keys)
        for key in keys:
            if time.monotonic() >= stop:
                break
            worker.compute(key, attempt)
        attempt += 1


#: Where a paused remover stops (see :func:`_pause_points`): after listing the records it will work
#: on, and after reading the one record it is about to change, before its compare-and-swap; with a
#: payload store, at each step of a collection too (:data:`COLLECTION_PAUSE_POINTS`).
PAUSE_POINTS = ("after list", "after read")
#: The steps of a payload collection (:mod:`dibs.payloads.collect`) a paused collector stops at.
COLLECTION_PAUSE_POINTS = (
    "after listing the records",
    "after listing the copies",
    "after listing a payload's copies",
    "before removing a copy",
)


def _pause_points(worker: Worker, store: Any) -> list[str]:
    """Make the remover's own store pause at the steps of a removal, at random: between listing and
    removing, and between reading a record and writing it back conditionally (the SQL stores'
    ``_read`` before their versioned UPDATE/DELETE, the record stores' ``_load`` before their
    compare-and-swap, and their ``_removal_rows`` before a prune's or reap's batch statement; Redis
    decides in one script, so only the first applies); with a payload store,
    at every step of a payload collection: after listing the records, after listing the copies (all
    of them, or a forgotten payload's), before removing a copy. Only this test process's store
    objects are wrapped; dibs itself is unchanged. Returns the points installed."""
    spec = worker.spec
    chance = float(spec.get("pause_chance", 0.0))
    chance_at = {str(k): float(v) for k, v in spec.get("pause_chance_at", {}).items()}  # per point
    low, high = spec.get("pause_seconds", (0.0, 0.0))
    installed: list[str] = []

    def pausing(point: str, call: Any, *, before: bool = False) -> Any:
        def pause() -> None:
            if worker.rng.random() < chance_at.get(point, chance):
                seconds = worker.rng.uniform(low, high)
                worker.recorder.emit("pause", point=point, t0=now(), seconds=seconds)
                time.sleep(seconds)

        def paused(*args: Any, **kwargs: Any) -> Any:
            if before:
                pause()
            answer = call(*args, **kwargs)
            if not before:
                if point.startswith("after list"):
                    answer = list(answer)  # list() is lazy on some stores: pause after it really ran
                pause()
            return answer

        return paused

    if chance <= 0:
        return installed
    payloads = getattr(store, "payloads", None)
    if payloads is not None:  # a payload-referencing store: its collection's steps, then its records'
        payloads.list = pausing("after listing the copies", payloads.list)
        payloads.copies = pausing("after listing a payload's copies", payloads.copies)
        payloads.remove = pausing("before removing a copy", payloads.remove, before=True)
        store = store.records
        store.list = pausing("after listing the records", store.list)
        installed.extend(COLLECTION_PAUSE_POINTS)
    else:
        store.list = pausing("after list", store.list)
        installed.append("after list")
    # A record store that names prune's and reap's candidates without list() (Azure: from its
    # listing's summaries, issue 30) pauses between naming them and changing them, as list() does.
    own = getattr(type(store), "_removal_candidates", None)
    if own is not None and own is not RecordStore._removal_candidates:
        listed = "after listing the records" if payloads is not None else "after list"
        store._removal_candidates = pausing(listed, store._removal_candidates)
        installed.append(f"{listed} (_removal_candidates)")
    # The SQL stores' repairs read with _read and then run a versioned statement; the record stores
    # (file, Azure) read with _load and then compare-and-swap. Redis's _read is a script that lists
    # and reads, not a step before a conditional write, so it is left alone.
    name = "_read" if callable(getattr(store, "_repair", None)) else "_load"
    if callable(getattr(store, name, None)):
        setattr(store, name, pausing("after read", getattr(store, name)))
        installed.append(f"after read ({name})")
    # Redis (issue 30) finds prune's and reap's candidates in its indexes, then drops them a batch per
    # script (judged again there): the pause goes between the two.
    if callable(getattr(store, "_drop_many", None)):
        store._drop_many = pausing("after list", store._drop_many, before=True)
        installed.append("after list (_drop_many)")
    # The SQL stores' prune and reap read a batch of rows with their versions, then change the batch
    # with one statement guarded by them (issue 30): the same step, a batch at a time.
    if callable(getattr(store, "_removal_rows", None)):
        store._removal_rows = pausing("after read", store._removal_rows)
        installed.append("after read (_removal_rows)")
    return installed


def _remove(worker: Worker) -> None:
    """A remover: until ``stop_mono``, one removal after another on the keys the others compute:
    ``prune(older_than=0)``, ``reap``, ``forget`` of a key, and ``force_release`` then ``discard``
    of a key (an operator freeing a stuck key for good), and with a payload store ``collect``. Each
    is recorded by the recording store (its kind, key or namespace, outcome); a failed one is
    recorded and the remover goes on. With a payload store, what each removal's collection removed
    is recorded too (``collected``: copies and bytes). The kinds are dealt from a shuffled deck
    holding each as many times as its weight, and the first deck is dealt whole even past
    ``stop_mono``: every remover makes every kind of removal at least once however slow the machine
    (at random, a slow run could miss one, and the scenario's check that each kind ran would fail).
    With ``in_order`` (a list of kinds), those removals, once each and in that order, instead."""
    _wait_until(worker.spec.get("start_mono"))
    assert worker.client is not None
    client = worker.client
    inner = client.store.inner if isinstance(client.store, RecordingStore) else client.store
    worker.recorder.emit("pause points", t0=now(), points=_pause_points(worker, inner))
    planned = list(worker.spec.get("in_order", ()))
    stop = float(worker.spec["stop_mono"]) if not planned else math.inf
    keys = list(worker.spec["keys"])
    weights = dict(worker.spec.get("removals", {"prune": 1, "reap": 1, "forget": 1, "force_release": 1}))
    low, high = worker.spec.get("gap", (0.02, 0.2))

    def dealt() -> list[str]:
        deck = [kind for kind, weight in weights.items() for _ in range(int(weight))]
        worker.rng.shuffle(deck)
        return deck

    deck = [] if planned else dealt()
    owed = len(deck)  # the first deck's removals, made whatever the time
    while planned or owed > 0 or time.monotonic() < stop:
        if planned:
            kind = planned.pop(0)
        else:
            deck = deck or dealt()
            kind, owed = deck.pop(), owed - 1
        key = worker.rng.choice(keys)
        before = getattr(inner, "freed", None)
        try:
            if kind == "prune":
                client.prune(0)
            elif kind == "reap":
                client.reap()
            elif kind == "forget":
                client.forget(key)
            elif kind == "collect":
                _collect(worker, inner)
            elif client.force_release(key):
                client.discard(key)
        except dibs.ReservationError:
            pass  # recorded by the recording store; a remover's failure is judged there
        if before is not None and inner.freed.copies > before.copies:
            worker.recorder.emit(
                "collected",
                kind=kind,
                t0=now(),
                copies=inner.freed.copies - before.copies,
                bytes=inner.freed.bytes - before.bytes,
            )
        if stop == math.inf and not planned:
            return
        time.sleep(worker.rng.uniform(low, high))


def _collect(worker: Worker, store: Any) -> None:
    """One collection of the payloads no record refers to (``ReferencingStore.collect``), recorded:
    it removes no artifact, so it excuses no lost one."""
    t0 = now()
    try:
        freed = store.collect()
    except dibs.ReservationError as exc:
        worker.recorder.emit("collect", t0=t0, t1=now(), result=f"error:{type(exc).__name__}", error=str(exc))
        raise
    worker.recorder.emit("collect", t0=t0, t1=now(), result="ok", copies=freed.copies)


ROLES = {"race": _race, "threads": _threads, "until_done": _until_done, "loop": _loop, "remove": _remove}


def run(spec: dict[str, Any]) -> None:
    """The entry point of every worker (fork-server children call it directly)."""
    try:
        worker = Worker(spec)
    except BaseException as exc:
        _crashed(spec, exc)
        raise
    try:
        ROLES[spec["role"]](worker)
    except BaseException as exc:
        _crashed(spec, exc)
        raise
    finally:
        worker.recorder.emit("exit", t0=now())
        worker.close()


def _crashed(spec: dict[str, Any], exc: BaseException) -> None:
    """Record an exception that escaped the worker: dibs must raise only its own, clear errors."""
    recorder = Recorder(Path(spec["history"]) / f"{spec['proc']}.jsonl", str(spec["proc"]))
    recorder.emit(
        "crash",
        t0=now(),
        result=f"{type(exc).__module__}.{type(exc).__name__}",
        error=str(exc)[:500],
        traceback=traceback.format_exc(limit=8)[-3000:],
    )
    recorder.close()


def _select_sleep(seconds: float | SupportsIndex) -> None:
    select.select([], [], [], max(0.0, float(seconds)))


def main(argv: list[str] | None = None) -> None:
    """The entry point of workers started as ``python -m reliability.workers SPEC`` (with libfaketime)."""
    if "FAKETIME" in os.environ:
        # libfaketime 0.9.10 makes clock_nanosleep fail with EINVAL when the monotonic clock is left
        # unfaked (FAKETIME_DONT_FAKE_MONOTONIC=1), so time.sleep raises OSError; select() sleeps on
        # the same monotonic clock and is unaffected. Only this test process is patched, never dibs.
        time.sleep = _select_sleep
    args = sys.argv[1:] if argv is None else argv
    run(json.loads(args[0]))


if __name__ == "__main__":
    main()

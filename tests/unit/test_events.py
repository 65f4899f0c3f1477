"""The flow's events and the observer API: what a call reports, and that observers never break it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

import dibs
from dibs import events, flow
from dibs import steps as flow_steps
from dibs.events import _ONCE, Emitter, Observation, Observers, observe_once
from dibs.options import ask_of
from dibs.records import Held, LeaseRecord, LeaseToken
from dibs.stores.memory import MemoryStore
from tests.unit.conftest import FakeClock


@pytest.fixture
def heard(client: dibs.Reservations) -> Iterator[list[dibs.Event]]:
    events: list[dibs.Event] = []
    with client.observe(events.append):
        yield events


def names(events: list[dibs.Event]) -> list[str]:
    return [event.name for event in events]


def test_a_computed_call_reports_each_step_in_order(
    client: dibs.Reservations, heard: list[dibs.Event]
) -> None:
    assert client.run("k", lambda: [1, 2]) == [1, 2]
    assert names(heard) == ["asked", "lease_acquired", "artifact_stored", "finished"]
    stored, finished = heard[2], heard[3]
    assert isinstance(stored, dibs.ArtifactStored) and stored.size == len(b"[1,2]") and stored.token == 1
    assert isinstance(finished, dibs.Finished)
    assert (finished.outcome, finished.token, finished.stored) == ("computed", 1, True)
    assert {event.call for event in heard} == {heard[0].call}  # one call, one number
    assert {str(event.key) for event in heard} == {"unit/k"}
    assert {event.frontend for event in heard} == {"python"}


def test_a_hit_and_a_failure_report_their_own_steps(
    client: dibs.Reservations, heard: list[dibs.Event]
) -> None:
    client.run("k", lambda: 1)
    heard.clear()
    client.run("k", lambda: 2)
    assert names(heard) == ["asked", "artifact_found", "finished"]
    assert isinstance(heard[-1], dibs.Finished) and heard[-1].outcome == "hit"
    heard.clear()

    def fail() -> None:
        raise KeyError("partition 7")

    with pytest.raises(KeyError):
        client.run("bad", fail)
    assert names(heard) == ["asked", "lease_acquired", "work_failed", "lease_released", "finished"]
    failed, finished = heard[2], heard[-1]
    assert isinstance(failed, dibs.WorkFailed) and failed.error == "KeyError: 'partition 7'"
    assert isinstance(finished, dibs.Finished)
    assert (finished.outcome, finished.error_type, finished.token) == ("failed", "KeyError", 1)


def test_an_observer_that_raises_is_logged_once_and_never_breaks_the_call(
    client: dibs.Reservations, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(event: dibs.Event) -> None:
        raise RuntimeError("observer bug")

    with client.observe(broken), caplog.at_level(logging.ERROR, "dibs"):
        assert client.run("k", lambda: 1) == 1
        assert client.run("k", lambda: 2) == 1
    complaints = [r for r in caplog.records if "observer" in r.getMessage()]
    assert len(complaints) == 1 and "RuntimeError: observer bug" in (complaints[0].exc_text or "")


def test_process_observers_hear_every_client_until_closed(clock: FakeClock) -> None:
    heard: list[dibs.Event] = []
    one = dibs.Reservations(MemoryStore(clock=clock), namespace="a")
    two = dibs.Reservations(MemoryStore(clock=clock), namespace="b")
    with dibs.observe(heard.append):
        one.run("k", lambda: 1)
        two.run("k", lambda: 2)
    one.run("other", lambda: 3)  # closed: not heard
    assert sorted({str(event.key) for event in heard}) == ["a/k", "b/k"]


def test_an_observer_installed_from_many_threads_hears_each_event_once(
    client: dibs.Reservations,
) -> None:
    heard: list[dibs.Event] = []
    made: list[int] = []

    def make() -> dibs.Observer:
        made.append(1)
        return heard.append

    with ThreadPoolExecutor(8) as pool:
        observations = list(pool.map(lambda _: observe_once(make), range(32)))
    try:
        assert len(made) == 1 and len({id(o) for o in observations}) == 1
        client.run("once", lambda: 1)
        assert names(heard) == ["asked", "lease_acquired", "artifact_stored", "finished"]
    finally:
        observations[0].close()
        assert make not in _ONCE  # closed, forgotten: the next observe_once installs it again


def test_an_observer_installed_once_is_installed_again_after_it_was_closed(
    client: dibs.Reservations,
) -> None:
    heard: list[dibs.Event] = []
    made: list[int] = []

    def make() -> dibs.Observer:
        made.append(1)
        return heard.append

    first = observe_once(make)
    first.close()
    client.run("closed", lambda: 1)
    assert heard == []  # closed: not heard
    second = observe_once(make)
    try:
        assert second is not first and len(made) == 2
        assert observe_once(make) is second  # once again, until it is closed
        client.run("again", lambda: 1)
        assert names(heard) == ["asked", "lease_acquired", "artifact_stored", "finished"]
        first.close()  # closing the old one again changes nothing
        client.run("still", lambda: 1)
        assert len(heard) == 8
    finally:
        second.close()
        _ONCE.pop(make, None)


class _RacingClose(Observation):
    """An observation whose ``_closed`` flag, read by two closing threads, is read by both before
    either sets it, if nothing keeps them apart (a barrier; a lock around the check keeps the second
    out, and the barrier lets the first go on after a while)."""

    def __init__(self, observers: Observers, observer: dibs.Observer) -> None:
        self._meeting = threading.Barrier(2)
        self._flag = False
        super().__init__(observers, observer)

    @property
    def _closed(self) -> bool:  # type: ignore[override]
        flag = self._flag
        with contextlib.suppress(threading.BrokenBarrierError):
            self._meeting.wait(0.5)
        return flag

    @_closed.setter
    def _closed(self, value: bool) -> None:
        self._flag = value


def test_two_threads_closing_one_observation_remove_it_once() -> None:
    """Closed by two threads at once, an observation removes its observer once: not also an equal
    observer registered by someone else (a bound method equals every other of the same list)."""
    observers, heard = Observers(), list[object]()
    observers.add(heard.append)
    racing = _RacingClose(observers, heard.append)
    observers.add(heard.append)  # someone else's, equal to it
    closers = [threading.Thread(target=racing.close) for _ in range(2)]
    for closer in closers:
        closer.start()
    for closer in closers:
        closer.join()
    assert list(observers) == [heard.append]  # one removed, the other's still there


def test_observe_once_never_hands_out_the_observation_another_thread_is_closing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A thread closing the installed observation holds the lock while it forgets and removes it; an
    ``observe_once`` meanwhile waits for it and installs a new one, instead of reading the old one
    without the lock and handing it out closed."""
    read = threading.Event()

    class _Once(dict):  # type: ignore[type-arg]
        def get(self, key: object, default: object = None) -> object:
            read.set()
            return super().get(key, default)

    monkeypatch.setattr(events, "_ONCE", _Once())

    def make() -> dibs.Observer:
        return lambda _event: None

    first = observe_once(make)
    got: list[Observation] = []
    with events._ONCE_LOCK:  # what first.close() does, held here so the other thread comes meanwhile
        read.clear()
        other = threading.Thread(target=lambda: got.append(observe_once(make)))
        other.start()
        read.wait(0.5)  # it reads at once without the lock; with it, it waits for the lock
        del events._ONCE[make]
        Observation.close(first)
    other.join()
    try:
        assert got[0] is not first and not got[0]._closed
        assert got[0].observer in list(events.PROCESS)
    finally:
        got[0].close()


def test_a_call_observer_hears_only_its_call(client: dibs.Reservations) -> None:
    heard: list[dibs.Event] = []
    client.compute("k", lambda: 1, observer=heard.append)
    client.compute("other", lambda: 1)
    assert {str(event.key) for event in heard} == {"unit/k"}


def test_store_unavailable_at_the_first_ask_follows_the_policy_and_says_so(clock: FakeClock) -> None:
    class Down(MemoryStore):
        def acquire(self, *args: object, **kwargs: object) -> object:  # type: ignore[override]
            raise dibs.StoreUnavailable("store down")

    heard: list[dibs.Event] = []
    lenient = dibs.Reservations(Down(clock=clock), on_store_unavailable="run")
    assert lenient.compute("k", lambda: 7, observer=heard.append).role == "unreserved"
    assert names(heard) == ["asked", "ran_unreserved", "finished"]
    assert isinstance(heard[-1], dibs.Finished) and heard[-1].outcome == "unreserved"
    heard.clear()
    strict = dibs.Reservations(Down(clock=clock))
    with pytest.raises(dibs.StoreUnavailable):
        strict.compute("k", lambda: 7, observer=heard.append)
    assert names(heard) == ["asked", "finished"]
    assert isinstance(heard[-1], dibs.Finished) and heard[-1].error_type == "StoreUnavailable"


def test_a_wait_that_times_out_reports_the_holder(client: dibs.Reservations) -> None:
    held = client.get_or_reserve("k", owner="alice")
    assert isinstance(held, dibs.Acquired)
    heard: list[dibs.Event] = []
    with pytest.raises(dibs.WaitTimeout, match="still held by 'alice'"):
        client.compute("k", lambda: 1, timeout=0, observer=heard.append)
    assert names(heard) == ["asked", "key_busy", "waited", "finished"]
    busy, waited = heard[1], heard[2]
    assert isinstance(busy, dibs.KeyBusy) and (busy.holder, busy.expires_in) == ("alice", 30)
    assert isinstance(waited, dibs.Waited) and (waited.outcome, waited.holder) == ("timeout", "alice")


def test_the_async_face_reports_the_same_steps(client: dibs.Reservations, heard: list[dibs.Event]) -> None:
    async def work() -> int:
        return 5

    async def main() -> None:
        assert await client.aio().run("k", work) == 5
        assert await client.aio().run("k", work) == 5

    asyncio.run(main())
    assert names(heard) == [
        *["asked", "lease_acquired", "artifact_stored", "finished"],
        *["asked", "artifact_found", "finished"],
    ]


def test_the_flow_is_sans_io_and_resumes_from_what_a_deferral_carries(client: dibs.Reservations) -> None:
    """A flow driven by hand: it stops at its wait step (as an Airflow operator defers), and a new
    flow resumed from the :class:`~dibs.flow.Waiting` it carried counts the whole wait."""
    now = [100.0]
    key = client.key("k")
    emitter = Emitter(key, "bob", "test", (lambda event: None,))
    ask = ask_of(client.settings, key, "bob", {"refresh": True})
    lease = LeaseRecord(
        key, "alice", LeaseToken(4, "id"), acquired_at=0.0, expires_at=30.0, ttl=30.0, attempt=1
    )
    busy = Held(lease, 0.0)
    steps = flow.compute_once(
        ask,
        emitter=emitter,
        rules=client.rules,
        policy="fail",
        timeout=60,
        max_age=None,
        clock=lambda: now[0],
    )
    assert isinstance(next(steps), dibs.Asked)
    assert isinstance(steps.send(None), flow_steps.Ask)
    assert isinstance(steps.send(busy), dibs.KeyBusy)
    wait = steps.send(None)
    assert isinstance(wait, flow_steps.Wait)
    assert wait.waiting == flow.Waiting(started=100.0, holder="alice", min_token=4)
    assert (
        wait.ask.request.min_fence == 4 and wait.ask.request.max_age is None
    )  # the refresh waits for alice's result
    steps.close()

    now[0] = 190.0  # resumed 90 s later: past the 60 s timeout
    resumed = flow.compute_once(
        ask,
        emitter=emitter,
        rules=client.rules,
        policy="fail",
        timeout=60,
        max_age=None,
        resume=wait.waiting,
        clock=lambda: now[0],
    )
    asked = next(resumed)
    assert isinstance(asked, dibs.Asked) and asked.min_token == 4 and not asked.refresh
    assert isinstance(resumed.send(None), flow_steps.Ask)
    assert isinstance(resumed.send(busy), dibs.KeyBusy)
    waited = resumed.send(None)
    assert isinstance(waited, dibs.Waited) and (waited.seconds, waited.outcome) == (90.0, "timeout")
    with pytest.raises(dibs.WaitTimeout, match=r"after 90\.0s: still held by 'alice'"):
        while True:
            resumed.send(None)


@pytest.mark.parametrize("face", ["sync", "async"])
def test_a_failed_work_stops_its_heartbeats_before_releasing(
    client: dibs.Reservations, monkeypatch: pytest.MonkeyPatch, face: str
) -> None:
    """A heartbeat still running after the release would find the lease gone and report a false
    "lease lost": both faces of ``hold`` stop the heartbeats first (the sync one used to release
    while its heartbeat thread still ran)."""
    order: list[str] = []
    stop, release = dibs.KeepAlive.stop, dibs.Lease.release

    def stopping(self: dibs.KeepAlive) -> None:
        order.append("stop heartbeats")
        stop(self)

    def releasing(self: dibs.Lease, error: object = None) -> None:
        order.append("release")
        release(self, error)  # type: ignore[arg-type]

    monkeypatch.setattr(dibs.KeepAlive, "stop", stopping)
    monkeypatch.setattr(dibs.Lease, "release", releasing)

    def fail() -> None:
        raise KeyError("partition 7")

    async def afail() -> None:
        fail()

    with pytest.raises(KeyError):
        if face == "sync":
            client.run("k", fail)
        else:
            asyncio.run(client.aio().run("k", afail))
    assert order[:2] == ["stop heartbeats", "release"]


def test_a_call_nobody_listens_to_builds_no_event(client: dibs.Reservations) -> None:
    key = client.key("k")
    quiet = flow.compute_once(
        ask_of(client.settings, key, "bob", {}),
        emitter=Emitter(key, "bob", "test", (Observers(),)),
        rules=client.rules,
        policy="fail",
        timeout=None,
        max_age=None,
    )
    assert isinstance(next(quiet), flow_steps.Ask)  # no Asked before it: nobody wanted one


@pytest.mark.usefixtures("no_process_observers")
def test_a_process_observer_that_names_its_kinds_hears_only_those_and_no_other_event_is_built(
    client: dibs.Reservations, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[type[dibs.Event]] = []
    real_build = events.build

    def counting(kind: type[dibs.Event], fields: dict[str, object]) -> dibs.Event:
        built.append(kind)
        return real_build(kind, fields)

    monkeypatch.setattr(events, "build", counting)

    class Outcomes:
        kinds = frozenset({dibs.Finished})

        def __init__(self) -> None:
            self.heard: list[dibs.Event] = []

        def __call__(self, event: dibs.Event) -> None:
            self.heard.append(event)

    outcomes, everything = Outcomes(), []
    with dibs.observe(outcomes):
        client.run("k1", lambda: 1)
        assert built == [dibs.Finished]  # the ask, the lease, the artifact: nobody asked for them
        with dibs.observe(everything.append):  # kinds unnamed: every kind, for it alone
            client.run("k2", lambda: 1)
    assert [type(e) for e in outcomes.heard] == [dibs.Finished, dibs.Finished]
    assert names(everything) == ["asked", "lease_acquired", "artifact_stored", "finished"]


def test_an_event_built_fast_is_the_dataclass_s_own() -> None:
    key = dibs.Key("ns", "k")
    common = {"key": key, "owner": "o", "frontend": "python", "call": 7, "store": "sqlite"}
    fast = events.build(dibs.LeaseAcquired, {**common, "token": 3, "attempt": 2, "acquired_at": 1.5})
    slow = dibs.LeaseAcquired(**common, token=3, attempt=2, acquired_at=1.5, at=fast.at)
    assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    assert (fast.took_over_from, fast.failures, fast.expired_by) == (None, 0, None)  # the defaults
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.token = 4  # type: ignore[misc]
    given = events.build(dibs.Asked, {**common, "at": 42.0})
    assert given.at == 42.0 and given.refresh is False
    with pytest.raises(TypeError, match="unexpected keyword argument 'tokn'"):
        events.build(dibs.LeaseAcquired, {**common, "tokn": 3, "attempt": 2, "acquired_at": 1.5})
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'attempt'"):
        events.build(dibs.LeaseAcquired, {**common, "token": 3, "acquired_at": 1.5})

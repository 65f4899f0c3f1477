"""Client policy over the in-memory store: outcomes, run/compute, failures, hand-off, settings."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import dibs
from dibs.stores.memory import MemoryStore
from tests.unit.conftest import FakeClock


def test_get_or_reserve_answers_hit_acquired_busy(client: dibs.Reservations) -> None:
    got = client.get_or_reserve("k", owner="alice")
    assert isinstance(got, dibs.Acquired) and got.lease.owner == "alice" and got.lease.token == 1
    busy = client.get_or_reserve("k", owner="bob")
    assert isinstance(busy, dibs.Busy)
    assert (busy.holder, busy.attempt, busy.remaining) == ("alice", 1, 30)
    got.lease.complete({"rows": 3})
    hit = client.get_or_reserve("k", owner="bob")
    assert isinstance(hit, dibs.Hit)
    assert (hit.value, hit.producer, hit.token, hit.serializer) == ({"rows": 3}, "alice", 1, "json")


def test_expiry_follows_the_store_clock_not_sleeps(client: dibs.Reservations, clock: FakeClock) -> None:
    first = client.get_or_reserve("k", owner="alice")
    assert isinstance(first, dibs.Acquired)
    clock.now += 29.9
    assert isinstance(client.get_or_reserve("k", owner="bob"), dibs.Busy)
    clock.now += 0.2
    second = client.get_or_reserve("k", owner="bob")
    assert isinstance(second, dibs.Acquired) and second.took_over_from == "alice" and second.lease.token == 2
    with pytest.raises(dibs.LeaseLost, match="taken over by 'bob' with token 2"):
        first.lease.complete("stale")


def test_run_computes_once_and_returns_the_stored_value_after(client: dibs.Reservations) -> None:
    calls: list[int] = []

    def work(x: int) -> int:
        calls.append(x)
        return x * 2

    assert client.run("double", work, 21) == 42
    assert client.run("double", work, 99) == 42  # same key: the artifact, not a new computation
    assert calls == [21]
    report = client.compute("double", work, args=(1,))
    assert (report.role, report.value, report.producer) == ("hit", 42, report.producer)


def test_run_releases_with_the_failure_and_reraises(client: dibs.Reservations) -> None:
    def fail() -> None:
        raise KeyError("partition 7")

    with pytest.raises(KeyError):
        client.run("flaky", fail)
    state = client.status("flaky")
    assert state.status == "failed" and state.failure is not None and "partition 7" in state.failure.error
    assert client.run("flaky", lambda: "second try") == "second try"


def test_max_failures_stops_a_thundering_retry_until_forgotten(clock: FakeClock) -> None:
    client = dibs.Reservations(MemoryStore(clock=clock), ttl=30, max_failures=2)

    def fail() -> None:
        raise RuntimeError("bad input")

    for _ in range(2):
        with pytest.raises(RuntimeError):
            client.run("k", fail)
    with pytest.raises(dibs.TooManyFailures, match=r"failed 2 times.*bad input.*dibs forget"):
        client.run("k", fail)
    assert client.status("k").lease is None  # refusing did not leave a lease behind
    client.forget("k")
    assert client.run("k", lambda: "ok") == "ok"


def test_a_value_that_cannot_be_stored_is_returned_and_releases_the_lease(
    client: dibs.Reservations, caplog: pytest.LogCaptureFixture
) -> None:
    # The reservation never changes a result: the value is returned to this run, not shared.
    report = client.compute("k", lambda: {1, 2})
    assert (report.role, report.value, report.stored) == ("computed", {1, 2}, False)
    state = client.status("k")
    assert state.lease is None and state.failure is not None and "as JSON" in state.failure.error
    assert any(r.levelname == "ERROR" and "cannot be stored" in r.getMessage() for r in caplog.records)


CALLS: list[tuple[str, int]] = []  # module level: what a function closes over is part of its key


def test_reserved_decorator_derives_keys_from_arguments(client: dibs.Reservations) -> None:
    CALLS.clear()

    @client.reserved(version="1")
    def features(day: str, limit: int = 10) -> list[str]:
        CALLS.append((day, limit))
        return [day] * 2

    assert features("2026-11-25") == ["2026-11-25"] * 2
    assert features(day="2026-11-25", limit=10) == ["2026-11-25"] * 2
    assert features("2026-11-26") == ["2026-11-26"] * 2
    assert CALLS == [("2026-11-25", 10), ("2026-11-26", 10)]
    names = {s.key.name for s in client.list()}
    assert len(names) == 2 and all(
        n.startswith("test_reserved_decorator_derives_keys_from_arguments.features@1/") for n in names
    )


def test_reserved_decorator_with_a_key_template(client: dibs.Reservations) -> None:
    @client.reserved(key="daily-{day}")
    def daily(day: str) -> str:
        return day.upper()

    assert daily("mon") == "MON"
    assert client.status("daily-mon").status == "done"


def test_exported_lease_resumes_in_another_client_and_refuses_when_stolen(
    client: dibs.Reservations, clock: FakeClock
) -> None:
    got = client.get_or_reserve("handoff", owner="orchestrator")
    assert isinstance(got, dibs.Acquired)
    exported = got.lease.export()
    remote = dibs.Reservations(client.store, namespace="unit", ttl=30)
    resumed = remote.resume(exported)
    assert resumed.token == got.lease.token
    resumed.heartbeat()  # both sides may keep it alive
    got.lease.heartbeat()

    clock.now += 31
    assert isinstance(client.get_or_reserve("handoff", owner="usurper"), dibs.Acquired)
    with pytest.raises(dibs.LeaseLost, match=r"cannot resume.*usurper"):
        remote.resume(exported)
    with pytest.raises(dibs.ConfigurationError, match="not an exported dibs lease"):
        remote.resume("garbage")


def test_keep_alive_reports_a_lost_lease_to_the_work(client: dibs.Reservations) -> None:
    got = client.get_or_reserve("k", owner="alice")
    assert isinstance(got, dibs.Acquired)
    told = threading.Event()
    with got.lease.keep_alive(interval=0.05, on_lost=lambda _: told.set()) as keeper:
        client.force_release("k")
        assert told.wait(30)
        with pytest.raises(dibs.LeaseLost, match="released"):
            keeper.check()


def test_keep_alive_fails_the_lease_when_its_heartbeats_keep_raising_an_unexpected_error(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An error that is not an outage (a store's bug, its table dropped under it) used to end the
    heartbeat thread with an unhandled exception: the work went on as if the lease were kept and was
    never told. It is retried as an outage is, and fails the lease once it has lasted a whole ttl."""
    client = dibs.Reservations(MemoryStore(clock=clock), namespace="unit", ttl=0.3)
    got = client.get_or_reserve("k", owner="alice")
    assert isinstance(got, dibs.Acquired)

    def broken(*args: object, **kwargs: object) -> object:
        raise RuntimeError("relation dibs_reservations does not exist")

    monkeypatch.setattr(client.store, "heartbeat", broken)
    crashed: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", crashed.append)
    told: list[dibs.LeaseLost] = []
    keeping = got.lease.keep_alive(interval=0.05, on_lost=told.append)
    with caplog.at_level("WARNING", logger="dibs"), keeping as keeper:
        assert keeper.lost.wait(30)
        with pytest.raises(dibs.LeaseLost, match=r"heartbeats failed for .*than the ttl.*does not exist"):
            keeper.check()
    assert crashed == []
    assert [error.fields["reason"] for error in told] == ["heartbeat_failed"]
    assert isinstance(told[0].__cause__, RuntimeError)  # the store's own error, traceback and all
    tracebacks = [r for r in caplog.records if "heartbeat of" in r.getMessage() and r.exc_info]
    # Logged once however many retries a slow machine fits in the ttl (none, if the first heartbeat
    # ran late): the first of a row of such errors says where it came from, the retries only that
    # they failed.
    assert len(tracebacks) == 1


def test_wait_times_out_naming_the_holder(client: dibs.Reservations) -> None:
    client.get_or_reserve("k", owner="slowpoke")
    with pytest.raises(dibs.WaitTimeout, match="held by 'slowpoke'"):
        client.acquire("k", owner="me", timeout=0.05)
    with pytest.raises(dibs.WaitTimeout, match="slowpoke"):
        client.wait("k", timeout=0.05)
    assert client.wait("free-key", timeout=0.05) is None
    with pytest.raises(dibs.WaitTimeout, match="not computed yet"):
        client.wait("free-key", timeout=0.05, for_artifact=True)


def test_async_face_uses_the_same_store(client: dibs.Reservations) -> None:
    async def scenario() -> tuple[object, object]:
        aio = client.aio()
        got = await aio.get_or_reserve("a", owner="x")
        assert isinstance(got, dibs.Acquired)
        got.lease.complete(5)
        return await aio.acquire("a"), await aio.wait("a")

    acquired, waited = asyncio.run(scenario())
    assert isinstance(acquired, dibs.Hit) and acquired.value == 5
    assert isinstance(waited, dibs.Hit) and waited.value == 5


def test_an_option_a_call_does_not_take_is_refused_by_both_faces(client: dibs.Reservations) -> None:
    """The options arrive as ``**options`` (one TypedDict per kind of call): a misspelt one must still
    fail as a misspelt keyword argument does, not be ignored (a wait without its timeout never ends)."""
    options: dict[str, Any] = {"timout": 0.05}
    calls: tuple[Callable[..., object], ...] = (client.acquire, client.wait, client.get_or_reserve)
    for call in calls:
        with pytest.raises(TypeError, match="unexpected keyword argument 'timout'"):
            call("k", **options)
    with pytest.raises(TypeError, match=r"compute\(\) got an unexpected keyword argument 'timout'"):
        client.compute("k", lambda: 1, **options)
    assert client.status("k").lease is None  # refused before anything was asked

    async def scenario() -> None:
        aio = client.aio()
        faces: tuple[Callable[..., Awaitable[object]], ...] = (aio.acquire, aio.wait, aio.get_or_reserve)
        for call in faces:
            with pytest.raises(TypeError, match="unexpected keyword argument 'timout'"):
                await call("k", **options)

    asyncio.run(scenario())


def test_pickle_artifacts_need_the_signing_key_to_be_read(clock: FakeClock) -> None:
    store = MemoryStore(clock=clock)
    writer = dibs.Reservations(store, serializer="pickle", signing_key="s" * 32)
    assert writer.run("p", lambda: {3, 4}) == {3, 4}
    with pytest.raises(dibs.SerializationError, match="cannot read safely"):
        dibs.Reservations(store).get_or_reserve("p")
    reader = dibs.Reservations(store, signing_key="s" * 32)
    hit = reader.get_or_reserve("p")
    assert isinstance(hit, dibs.Hit) and hit.value == {3, 4}


def test_store_unavailable_policy_run_computes_unreserved(clock: FakeClock) -> None:
    class Down(MemoryStore):
        def acquire(self, *args: object, **kwargs: object) -> object:  # type: ignore[override]
            raise dibs.StoreUnavailable("store down")

    failing = dibs.Reservations(Down(clock=clock))
    with pytest.raises(dibs.StoreUnavailable):
        failing.run("k", lambda: 1)
    lenient = dibs.Reservations(Down(clock=clock), on_store_unavailable="run")
    report = lenient.compute("k", lambda: 7)
    assert (report.role, report.value, report.stored) == ("unreserved", 7, False)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ttl": 0}, "ttl must be a number of seconds greater than 0 and at most 315,360,000, got 0"),
        ({"ttl": 3e10}, "ttl must be a number of seconds greater than 0 and at most 315,360,000, got 3"),
        ({"ttl": "60"}, "ttl must be a number of seconds, got '60'"),
        ({"ttl": float("nan")}, "ttl must be a number"),
        ({"ttl": 10, "heartbeat_interval": 10}, "must be shorter than ttl"),
        ({"ttl": 10, "max_lease_age": 5}, "must be at least the ttl"),
        ({"namespace": "bad name"}, "invalid namespace 'bad name'"),
        ({"max_failures": 0}, "max_failures must be a positive integer"),
        ({"on_store_unavailable": "ignore"}, "must be 'fail' or 'run'"),
    ],
)
def test_bad_settings_are_named(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(dibs.ConfigurationError, match=message.replace("(", r"\(")):
        dibs.Reservations("memory://settings", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("not a url", "is not a URL"),
        ("ftp://host/x", "unknown store scheme 'ftp'"),
        ("sqlite://", "names no file"),
        ("sqlite:////nonexistent-dir/sub/dibs.db", "does not exist"),
        ("sqlite:///x.db?synchronous=SOMETIMES", "synchronous='SOMETIMES'"),
        ("postgresql://u:hunter2@127.0.0.1:1/db", "127.0.0.1"),
    ],
)
def test_bad_store_urls_get_clear_errors_without_secrets(url: str, message: str) -> None:
    with pytest.raises(dibs.ReservationError, match=message) as info:
        # A URL that parses opens without a connection: a server that is not there says so at first use.
        dibs.Reservations(url).status("k")
    assert "hunter2" not in str(info.value)


def test_an_artifact_handed_to_many_waiters_is_decoded_once_per_process(
    client: dibs.Reservations, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Immutable JSON values are shared (issue 20); a mutable one is decoded for each caller."""
    import dibs.artifacts as artifacts_module
    from dibs.serializers import load_artifact as original

    loads: list[object] = []

    def counted(*args: object) -> object:
        loads.append(args)
        return original(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(artifacts_module, "load_artifact", counted)
    for name, value in (("text", "a value"), ("mapping", {"a": [1]})):
        got = client.get_or_reserve(name)
        assert isinstance(got, dibs.Acquired)
        got.lease.complete(value)
        state = client.store.read(client.key(name))
        assert state.artifact is not None
        other = dibs.Reservations(client.store, namespace="unit")
        values = [c.decode(state.key, state.artifact) for c in (client, other, client)]
        assert values == [value] * 3
        if name == "text":
            assert len(loads) == 1
        else:
            assert len(loads) == 1 + 3 and values[0] is not values[1]


def test_a_takeover_says_why_when_the_lease_expired_before_the_wait_asked_again(clock: FakeClock) -> None:
    """The wait's first ask after its watch may already find the holder's lease expired: the takeover
    still knows the lease it waited on (the first ask's), so it says its holder stopped heartbeating."""

    class ExpiresBeforeTheWaitAsks(MemoryStore):
        asks = 0

        def acquire(self, key: Any, request: Any) -> Any:
            self.asks += 1
            if self.asks == 3:  # the holder's, the waiter's first; then the wait's, past the expiry
                clock.now += 31
            return super().acquire(key, request)

    client = dibs.Reservations(ExpiresBeforeTheWaitAsks(clock=clock), ttl=30)
    assert isinstance(client.get_or_reserve("k", owner="stopped"), dibs.Acquired)
    heard: list[dibs.events.Event] = []
    report = client.compute("k", lambda: 2, owner="waiter", observer=heard.append)
    assert (report.value, report.role) == (2, "computed")
    (acquired,) = [event for event in heard if isinstance(event, dibs.events.LeaseAcquired)]
    assert (acquired.took_over_from, acquired.expired_by) == ("stopped", "heartbeating")

"""``@reserved`` inside one process, against the session's Prefect API.

Concurrency here uses threads (sync flows) or one event loop (async flows); the multi-process
scenarios are in ``test_processes.py``. The holder of a key blocks on an event the test controls, so
every overlap is certain rather than timed.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Literal
from uuid import UUID

import pytest

pytest.importorskip("prefect")

import cloudpickle  # type: ignore[import-untyped]
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterTaskRunId,
    LogFilter,
    LogFilterTaskRunId,
)
from prefect.client.schemas.objects import State
from prefect.exceptions import ObjectNotFound

import dibs
import prefect_dibs.tasks
from dibs.errors import ConfigurationError, WaitTimeout
from dibs.keys import Key, derive_key
from prefect import flow, task
from prefect_dibs import DibsStore, reserved
from prefect_dibs.tasks import artifact_key
from tests.prefect.support import wait_until


@pytest.fixture
def client(dibs_url: str) -> Iterator[dibs.Reservations]:
    with dibs.Reservations(dibs_url) as reservations:
        yield reservations


def _task_run_id(state: State[Any]) -> UUID:
    task_run_id = state.state_details.task_run_id
    assert task_run_id is not None
    return task_run_id


def _task_run(task_run_id: UUID) -> Any:
    with get_client(sync_client=True) as api:
        return api.read_task_run(task_run_id)


def _finished(task_run_id: UUID) -> Any:
    """The task run once the API shows its final state (it records runs from events, a little later)."""

    def final() -> Any:
        try:
            run = _task_run(task_run_id)
        except ObjectNotFound:
            return None
        return run if run.state_type is not None and run.state_type.value == "COMPLETED" else None

    return wait_until(final, what="the task run's final state in the API")


def _logs(task_run_id: UUID) -> list[str]:
    with get_client(sync_client=True) as api:
        logs = api.read_logs(log_filter=LogFilter(task_run_id=LogFilterTaskRunId(any_=[task_run_id])))
    return [log.message for log in logs]


def _artifacts(task_run_id: UUID) -> list[Any]:
    with get_client(sync_client=True) as api:
        return list(
            api.read_artifacts(
                artifact_filter=ArtifactFilter(task_run_id=ArtifactFilterTaskRunId(any_=[task_run_id]))
            )
        )


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    return thread, out


def test_a_second_flow_run_gets_the_stored_artifact(dibs_url: str, client: dibs.Reservations) -> None:
    calls: list[int] = []

    @reserved(dibs_url)
    @task
    def double(x: int) -> dict[str, int]:
        calls.append(x)
        return {"doubled": 2 * x}

    @flow
    def pipeline(x: int) -> State[Any]:
        return double(x, return_state=True)

    first = pipeline(21)
    second = pipeline(21)
    assert first.result() == second.result() == {"doubled": 42}
    assert calls == [21]

    # The artifact is a plain JSON dibs artifact under the derived key: Airflow or any dibs client
    # computing the same function with the same arguments finds it.
    name = derive_key(double.fn, (21,), {})
    assert name == derive_key(double.fn, (), {"x": 21})
    hit = client.get_or_reserve(name)
    assert isinstance(hit, dibs.Hit) and hit.value == {"doubled": 42} and hit.serializer == "json"
    assert hit.producer == f"prefect-task-run:{_task_run(_task_run_id(first)).name}:{_task_run_id(first)}"

    (summary,) = wait_until(lambda: _artifacts(_task_run_id(second)), what="the summary artifact")
    assert summary.type == "markdown" and "**hit**" in summary.data
    assert summary.description == f"dibs: hit default/{name}"
    # Keyed, so Prefect's Artifacts page lists it: one entry per dibs key, each run a version of it.
    assert summary.key == artifact_key(Key("default", name)) and summary.key.startswith(
        "dibs-default-test-a-"
    )
    (first_summary,) = _artifacts(_task_run_id(first))
    assert first_summary.key == summary.key and "**computed**" in first_summary.data

    # A hit ran nothing: it ends Completed, named Cached, as a hit of Prefect's own cache does.
    assert (first.type.value, first.name) == ("COMPLETED", "Completed")
    assert (second.type.value, second.name) == ("COMPLETED", "Cached")
    assert second.message == f"dibs: default/{name} was already computed by {hit.producer!r} (token 1)"
    assert _finished(_task_run_id(second)).state.name == "Cached"

    # However it is called, the caller gets the value, never the state.
    @flow
    def called_every_way(x: int) -> list[Any]:
        submitted = double.submit(x)
        return [double(x), submitted.result(), submitted.state.name, double.map([x, x]).result()]

    assert called_every_way(21) == [{"doubled": 42}, {"doubled": 42}, "Cached", [{"doubled": 42}] * 2]
    assert calls == [21]


def test_concurrent_runs_compute_once_and_the_waiter_says_so(dibs_url: str) -> None:
    started, gate = threading.Event(), threading.Event()
    calls: list[int] = []

    @reserved(dibs_url, key="slow-{x}", ttl=5)
    @task
    def slow(x: int) -> int:
        calls.append(x)
        started.set()
        assert gate.wait(120)
        return x + 1

    @flow
    def pipeline(x: int) -> State[Any]:
        return slow(x, return_state=True)

    holder_thread, holder = _in_thread(lambda: pipeline(1))
    assert started.wait(120)
    waiter_thread, waiter = _in_thread(lambda: pipeline(1))

    def waiting_run() -> Any:
        from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterState, TaskRunFilterStateName

        with get_client(sync_client=True) as api:
            runs = api.read_task_runs(
                task_run_filter=TaskRunFilter(
                    state=TaskRunFilterState(type=None, name=TaskRunFilterStateName(any_=["Waiting"]))
                )
            )
        # The server records the state name and the state itself in steps: wait for both.
        return [run for run in runs if run.name.startswith("slow-") and run.state is not None]

    (waiting,) = wait_until(waiting_run, what="the waiter's Waiting state in the API")
    assert waiting.state.type.value == "RUNNING"
    assert "waiting for default/slow-1 held by 'prefect-task-run:slow-" in waiting.state.message
    lines = wait_until(
        lambda: [m for m in _logs(waiting.id) if "is being computed by" in m], what="a log line"
    )
    assert "waiting for its result instead of computing it again" in lines[0]

    gate.set()
    holder_thread.join(120)
    waiter_thread.join(120)
    assert holder[0].result() == waiter[0].result() == 2
    assert calls == [1]

    # The waiter ran nothing: like a hit of Prefect's own cache, it ends Completed, named Cached.
    finished = _finished(_task_run_id(waiter[0]))
    assert finished.state.name == "Cached"
    assert "was computed by 'prefect-task-run:slow-" in finished.state.message
    assert _finished(_task_run_id(holder[0])).state.name == "Completed"
    (summary,) = wait_until(lambda: _artifacts(waiting.id), what="the waiter's summary artifact")
    assert "**waited**" in summary.data and "prefect-task-run:slow-" in summary.data


@pytest.mark.anyio
async def test_async_waiter_does_not_block_the_event_loop(
    dibs_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = asyncio.Event()
    calls: list[int] = []
    waiting: list[str] = []
    announce = prefect_dibs.tasks._Reservation.announce_wait

    def record_wait(self: Any, ctx: Any, logger: Any, busy: dibs.Busy) -> None:
        waiting.append(busy.holder)
        announce(self, ctx, logger, busy)

    monkeypatch.setattr(prefect_dibs.tasks._Reservation, "announce_wait", record_wait)

    @reserved(dibs_url, key="async-{x}")
    @task
    async def fetch(x: int) -> int:
        calls.append(x)
        await gate.wait()  # set by this loop: a blocked loop would never get there
        return x * 10

    @flow
    async def pipeline(x: int) -> int:
        return await fetch(x)

    async def open_gate_once_one_waits() -> None:
        while not waiting:  # the second flow run waits on the first; this loop still runs us
            await asyncio.sleep(0.01)
        for _ in range(10):  # and keeps running us while that wait goes on
            await asyncio.sleep(0.01)
        gate.set()

    results = await asyncio.wait_for(
        asyncio.gather(pipeline(4), pipeline(4), open_gate_once_one_waits()), timeout=120
    )
    assert results[:2] == [40, 40]
    assert calls == [4]
    assert len(waiting) == 1 and waiting[0].startswith("prefect-task-run:fetch-")


def test_mapped_duplicates_in_one_flow_compute_once(dibs_url: str) -> None:
    calls: list[int] = []

    @reserved(dibs_url, key="mapped-{x}")
    @task
    def square(x: int) -> int:
        calls.append(x)
        return x * x

    @flow
    def pipeline() -> list[int]:
        return square.map([2, 2, 3, 2, 3]).result()  # concurrent task runs on Prefect's thread pool

    assert pipeline() == [4, 4, 9, 4, 9]
    assert sorted(calls) == [2, 3]


def test_failure_releases_with_the_error_and_the_retry_reenters_as_the_same_owner(
    dibs_url: str, client: dibs.Reservations
) -> None:
    owners: list[str] = []

    @reserved(dibs_url, key="flaky")
    @task(retries=1, retry_delay_seconds=0)
    def flaky() -> str:
        from prefect.context import TaskRunContext

        ctx = TaskRunContext.get()
        assert ctx is not None
        owners.append(ctx.task_run.id.hex)
        if len(owners) == 1:
            raise RuntimeError("first attempt fails")
        return "ok"

    @flow
    def pipeline() -> str:
        return flaky()

    assert pipeline() == "ok"
    assert len(owners) == 2 and owners[0] == owners[1]
    state = client.status("flaky")
    assert state.failure is not None and state.failure.count == 1
    assert "RuntimeError: first attempt fails" in state.failure.error
    assert state.artifact is not None and state.artifact.producer == state.failure.owner
    assert state.artifact.fence == 2  # released after the failure, taken again by the retry


def test_a_retry_after_a_crash_reenters_its_own_live_lease(
    dibs_url: str, client: dibs.Reservations, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If an attempt dies without releasing (a crash), the retry is the same owner: it re-enters the
    lease at once instead of waiting for it to expire (ttl 60, but the wait timeout is 30 s)."""
    monkeypatch.setattr(dibs.holding, "release_after", lambda *args: None)  # the "crash"
    attempts: list[int] = []

    @reserved(dibs_url, key="crashy", timeout=30)
    @task(retries=1, retry_delay_seconds=0)
    def crashy() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("killed")
        return "ok"

    @flow
    def pipeline() -> str:
        return crashy()

    assert pipeline() == "ok"
    state = client.status("crashy")
    assert state.artifact is not None and state.artifact.fence == 1  # the same lease, re-entered
    assert state.failure is None


def test_waiting_times_out_with_the_holder_named(dibs_url: str, client: dibs.Reservations) -> None:
    got = client.get_or_reserve("busy", owner="someone-else")
    assert isinstance(got, dibs.Acquired)

    @reserved(dibs_url, key="busy", timeout=0.2, progress_interval=0.05)
    @task
    def never() -> None:
        raise AssertionError("must not run while someone else holds the key")

    @flow
    def pipeline() -> None:
        never()

    with pytest.raises(WaitTimeout, match="still held by 'someone-else'"):
        pipeline()
    got.lease.release()


def test_a_waiter_says_every_progress_interval_that_it_still_waits(
    dibs_url: str, client: dibs.Reservations, caplog: pytest.LogCaptureFixture
) -> None:
    got = client.get_or_reserve("slow", owner="someone-else")
    assert isinstance(got, dibs.Acquired)
    heard: list[dibs.StillWaiting] = []

    @reserved(dibs_url, key="slow", progress_interval=0.1)
    def build() -> None:
        raise AssertionError("must not run while someone else holds the key")

    def observe(event: dibs.Event) -> None:
        if isinstance(event, dibs.StillWaiting):
            heard.append(event)
            if len(heard) == 2:
                got.lease.complete("built elsewhere")

    with dibs.observe(observe), caplog.at_level("INFO"):
        assert build() == "built elsewhere"
    assert [event.holder for event in heard] == ["someone-else", "someone-else"]
    assert heard[0].seconds < heard[1].seconds
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("still waiting for")]
    assert len(lines) == 2 and "held by 'someone-else'" in lines[0]


def test_an_expired_holder_is_taken_over(dibs_url: str) -> None:
    with dibs.Reservations(dibs_url, ttl=0.5) as short:
        dead = short.get_or_reserve("orphan", owner="dead-worker")  # never heartbeats, never completes
        assert isinstance(dead, dibs.Acquired)

    @reserved(dibs_url, key="orphan")
    @task
    def orphan() -> str:
        return "recomputed"

    @flow
    def pipeline() -> State[Any]:
        return orphan(return_state=True)

    state = pipeline()
    assert state.result() == "recomputed"
    lines = wait_until(
        lambda: [m for m in _logs(_task_run_id(state)) if "took over" in m], what="takeover log"
    )
    assert "'dead-worker'" in lines[0]
    (summary,) = wait_until(lambda: _artifacts(_task_run_id(state)), what="the summary artifact")
    assert "took over from" in summary.data


def test_keys_from_templates_callables_and_versions(dibs_url: str, client: dibs.Reservations) -> None:
    calls: list[str] = []

    def body(day: str, verbose: bool = False) -> str:
        calls.append(day)
        return day.upper()

    templated = reserved(dibs_url, key="report-{day}")(task(body))
    by_callable = reserved(dibs_url, key=lambda day, verbose=False: f"custom-{day}")(task(body))
    v1 = reserved(dibs_url, version="1", exclude=("verbose",))(task(body))
    v2 = reserved(dibs_url, version="2", exclude=("verbose",))(task(body))

    @flow
    def pipeline() -> list[str]:
        return [
            templated("mon"),
            by_callable("tue"),
            v1("wed", verbose=True),
            v1("wed"),  # verbose is excluded from the key: a hit
            v2("wed"),  # another version: computed again
        ]

    assert pipeline() == ["MON", "TUE", "WED", "WED", "WED"]
    assert calls == ["mon", "tue", "wed", "wed"]
    assert client.status("report-mon").status == "done"
    assert client.status("custom-tue").status == "done"
    assert client.status(derive_key(body, ("wed",), {}, version="2", exclude=("verbose",))).status == "done"


def test_a_plain_dibs_client_and_the_task_share_artifacts(dibs_url: str, client: dibs.Reservations) -> None:
    assert client.run("shared-7", lambda: {"from": "dibs"}) == {"from": "dibs"}

    @reserved(dibs_url, key="shared-{n}")
    @task
    def shared(n: int) -> dict[str, str]:
        raise AssertionError("already computed elsewhere")

    @flow
    def pipeline() -> dict[str, str]:
        return shared(7)

    assert pipeline() == {"from": "dibs"}


def test_task_over_reserved_and_plain_functions(dibs_url: str) -> None:
    calls: list[int] = []

    @task
    @reserved(dibs_url, key="inner-{x}")
    def inner(x: int) -> int:
        calls.append(x)
        return x

    @reserved(dibs_url, key="plain-{x}")
    def plain(x: int) -> int:
        calls.append(x)
        return -x

    @flow
    def pipeline() -> list[int]:
        return [inner(1), inner(1)]

    assert pipeline() == [1, 1]
    assert [plain(2), plain(2)] == [-2, -2]  # outside any flow: the owner is host:pid:random
    assert calls == [1, 2]


def test_the_reserved_task_keeps_its_options_and_pickles(dibs_url: str) -> None:
    @reserved(dibs_url, key="opts")
    @task(name="named", retries=3, tags=["t"])
    def original() -> int:
        return 1

    assert (original.name, original.retries, original.tags) == ("named", 3, {"t"})
    renamed = original.with_options(name="renamed")
    assert renamed.fn is original.fn  # still reserved
    assert type(renamed) is type(original)  # and its hits still end Cached
    clone = cloudpickle.loads(cloudpickle.dumps(original))
    assert clone.fn.__dibs_reservation__.store == dibs_url

    @flow
    def pipeline() -> int:
        return clone()  # type: ignore[no-any-return]

    assert pipeline() == 1


def test_bare_decorator_uses_the_default_store(monkeypatch: pytest.MonkeyPatch, dibs_url: str) -> None:
    monkeypatch.setenv("DIBS_STORE_URL", dibs_url)

    @reserved
    @task
    def answer() -> int:
        return 42

    @flow
    def pipeline() -> int:
        return answer()

    assert pipeline() == 42
    with dibs.Reservations(dibs_url) as client:
        assert client.status(derive_key(answer.fn, (), {})).status == "done"


def test_the_store_may_be_a_block_its_name_or_a_client(dibs_url: str, client: dibs.Reservations) -> None:
    name = f"store-{uuid.uuid4().hex[:8]}"
    DibsStore(url=dibs_url, namespace="team.blocks", wait_timeout=5).save(name)

    @task
    def value(tag: str) -> str:
        return tag

    by_block = reserved(DibsStore(url=dibs_url, namespace="team.blocks"), key="b-{tag}")(value)
    by_name = reserved(name, key="n-{tag}")(value)
    by_client = reserved(client, key="c-{tag}")(value)

    @flow
    def pipeline() -> list[str]:
        return [by_block("x"), by_name("y"), by_client("z")]

    assert pipeline() == ["x", "y", "z"]
    assert client.status(dibs.Key("team.blocks", "b-x")).status == "done"
    assert client.status(dibs.Key("team.blocks", "n-y")).status == "done"
    assert client.status("c-z").status == "done"


@pytest.mark.anyio
async def test_an_async_task_loads_its_block_by_name(dibs_url: str, client: dibs.Reservations) -> None:
    name = f"async-{uuid.uuid4().hex[:8]}"
    await DibsStore(url=dibs_url).save(name)

    @reserved(name, key="async-block-{x}")
    @task
    async def plus_one(x: int) -> int:
        return x + 1

    @flow
    async def pipeline() -> int:
        return await plus_one(1)

    assert await pipeline() == 2
    assert client.status("async-block-1").status == "done"


def test_decoration_errors_are_clear(dibs_url: str, client: dibs.Reservations) -> None:
    @task
    def gen() -> Iterator[int]:
        yield 1

    with pytest.raises(TypeError, match="generator"):
        reserved(dibs_url)(gen)
    with pytest.raises(ConfigurationError, match="version= only applies"):
        reserved(dibs_url, key="k", version="1")
    with pytest.raises(ConfigurationError, match="heartbeat_interval"):
        reserved(dibs_url, ttl=1, heartbeat_interval=1)
    with pytest.raises(ConfigurationError, match="timeout"):
        reserved(dibs_url, timeout=-1)
    with pytest.raises(ConfigurationError, match="cannot be applied"):
        reserved(client, ttl=5)(lambda: 1)()


def test_a_value_json_cannot_store_is_still_returned(dibs_url: str, client: dibs.Reservations) -> None:
    """The reservation never changes a result: an unstorable value is returned, and the lease is
    released with the failure recorded so waiters compute it themselves."""

    @reserved(dibs_url, key="unstorable")
    @task
    def unstorable() -> set[int]:
        return {1, 2}

    @flow
    def pipeline() -> set[int]:
        return unstorable()

    assert pipeline() == {1, 2}
    state = client.status("unstorable")
    assert state.artifact is None and state.lease is None
    assert state.failure is not None and "SerializationError" in state.failure.error


@pytest.mark.parametrize("policy", ["run", "fail"])
def test_an_unreachable_store_follows_the_blocks_policy(policy: Literal["run", "fail"]) -> None:
    """A real store that refuses every connection (nothing listens on port 1): the flow's first ask
    decides, as for every front end. With 'run' the task runs unreserved (and says so, with the flow's
    events), with 'fail' it fails with StoreUnavailable."""
    calls: list[int] = []
    heard: list[str] = []
    unreachable = "postgresql+psycopg://postgres@127.0.0.1:1/dibs"

    @reserved(DibsStore(url=unreachable, on_store_unavailable=policy), key="offline-{x}")
    @task
    def offline(x: int) -> int:
        calls.append(x)
        return x

    @flow
    def pipeline() -> State[Any]:
        return offline(3, return_state=True)

    with dibs.observe(lambda event: heard.append(event.name)):
        if policy == "fail":
            with pytest.raises(dibs.StoreUnavailable, match="port 1"):
                pipeline()
            assert calls == [] and heard == ["asked", "finished"]
            return
        state = pipeline()
    assert state.result() == 3 and calls == [3]
    assert heard == ["asked", "ran_unreserved", "finished"]  # the flow's events, as for every front end
    lines = wait_until(lambda: [m for m in _logs(_task_run_id(state)) if "unreserved" in m], what="a warning")
    assert "on_store_unavailable='run'" in lines[0]
    (summary,) = wait_until(lambda: _artifacts(_task_run_id(state)), what="the summary artifact")
    assert "**unreserved**" in summary.data

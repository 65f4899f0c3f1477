"""Metrics and traces through the real OpenTelemetry SDK: what a dashboard and a trace viewer get."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

import dibs
import dibs.observers.later
from dibs.observers.later import Later
from dibs.observers.measures import METRICS, Measurement
from dibs.observers.otel import OpenTelemetry, instrument
from dibs.seam import StoreIO
from tests.observability.sdk import Telemetry, observed

WORK_SECONDS = 1.0
COMMON = {"dibs.namespace", "dibs.store", "dibs.frontend"}


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    with observed() as seen:
        yield seen


def _all_points(telemetry: Telemetry) -> dict[str, list[Any]]:
    return {name: telemetry.points(name) for name in METRICS}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[dibs.Reservations]:
    with dibs.Reservations(f"sqlite:///{tmp_path / 'dibs.db'}", namespace="otel", ttl=30) as reservations:
        yield reservations


def by_outcome(points: list[Any]) -> dict[str, float]:
    return {point.attributes["dibs.outcome"]: point.value for point in points}


def race(client: dibs.Reservations, racers: int) -> list[dibs.RunReport]:
    """``racers`` threads on one key: the one that gets the lease computes for WORK_SECONDS, after
    every other one has found the key busy (so each of them waits, whatever the scheduling)."""
    busy = threading.Semaphore(0)
    reports: list[dibs.RunReport] = []
    errors: list[BaseException] = []

    def heard(event: dibs.Event) -> None:
        if isinstance(event, dibs.KeyBusy):
            busy.release()

    def work() -> str:
        for _ in range(racers - 1):
            assert busy.acquire(timeout=30), "a racer never found the key busy"
        time.sleep(WORK_SECONDS)
        return "value"

    start = threading.Barrier(racers)

    def racer(index: int) -> None:
        start.wait()
        try:
            reports.append(client.compute("race", work, owner=f"racer-{index}", observer=heard))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=racer, args=(index,)) for index in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    return reports


def test_four_racers_and_a_hit_give_the_issues_numbers(
    client: dibs.Reservations, telemetry: Telemetry
) -> None:
    reports = race(client, 4)
    assert sorted(report.role for report in reports) == ["computed", "waited", "waited", "waited"]
    hit = client.compute("race", lambda: "never", owner="late")
    assert hit.role == "hit"

    assert by_outcome(telemetry.points("dibs.reservation.outcomes")) == {"computed": 1, "waited": 3, "hit": 1}
    (computed,) = telemetry.points("dibs.compute.duration")
    assert computed.count == 1 and computed.sum >= WORK_SECONDS
    (waits,) = telemetry.points("dibs.wait.duration")
    assert waits.count == 3 and waits.attributes["dibs.outcome"] == "waited"
    assert waits.min >= WORK_SECONDS  # each waiter found the key busy before the work began to sleep
    # Every waiter and the hit were spared the producer's compute time, as its artifact recorded it.
    (saved,) = telemetry.points("dibs.compute.saved")
    assert saved.value == pytest.approx(4 * computed.sum) and saved.value >= 4 * WORK_SECONDS
    (handoffs,) = telemetry.points("dibs.handoff.duration")
    # A handoff (artifact stored -> waiter returns) is only the end of a wait that spanned the work.
    assert handoffs.count == 3 and handoffs.sum < waits.min
    operations = {
        (point.attributes["dibs.store.operation"], point.attributes.get("error.type")): point.count
        for point in telemetry.points("dibs.store.operation.duration")
    }
    assert operations[("complete", None)] == 1
    assert operations[("acquire", None)] >= 5  # every call asked at least once
    # Recorded while the work ran (the holder's +1, the waiters' +3), back to 0 once every call ended.
    assert [point.value for point in telemetry.points("dibs.leases.active")] == [0]
    assert [point.value for point in telemetry.points("dibs.waiters.active")] == [0]
    assert {
        point.attributes["dibs.store"] for point in telemetry.points("dibs.store.operation.duration")
    } == {"sqlite"}


def test_no_metric_carries_a_key_a_token_or_an_owner(client: dibs.Reservations, telemetry: Telemetry) -> None:
    race(client, 2)
    client.compute("race", lambda: "never", owner="late")
    seen: set[str] = set()
    for name, points in _all_points(telemetry).items():
        for point in points:
            keys = set(point.attributes)
            assert keys <= COMMON | set(METRICS[name].attributes), (name, keys)
            assert not {str(v) for v in point.attributes.values()} & {"otel/race", "racer-0", "racer-1", "1"}
            seen.add(name)
    assert {"dibs.reservation.outcomes", "dibs.store.operation.duration", "dibs.compute.saved"} <= seen


def test_each_call_is_one_span_nested_under_the_callers(
    client: dibs.Reservations, telemetry: Telemetry
) -> None:
    tracer = telemetry.tracers.get_tracer("test")
    with tracer.start_as_current_span("airflow task") as parent:
        race(client, 2)  # threads: no active span there, so these spans are roots
        inner: list[str] = []

        def work() -> str:
            inner.append(trace.get_current_span().get_span_context().span_id.__format__("x"))
            return "fresh"

        client.compute("own", work, owner="me")
    spans = telemetry.finished_spans()
    assert len(spans) == 3
    own = next(span for span in spans if span.attributes and span.attributes["dibs.key"] == "otel/own")
    assert own.parent is not None and own.parent.span_id == parent.get_span_context().span_id
    assert inner == [format(own.context.span_id, "x")]  # the work runs inside the dibs.reserve span
    assert own.attributes["dibs.outcome"] == "computed" and own.attributes["dibs.token"] == 1
    assert [event.name for event in own.events] == ["stored"]  # the span's start is the ask

    racers = [span for span in spans if span is not own]
    computed = next(
        span for span in racers if span.attributes and span.attributes["dibs.outcome"] == "computed"
    )
    waited = next(span for span in racers if span.attributes and span.attributes["dibs.outcome"] == "waited")
    assert waited.attributes is not None and computed.attributes is not None
    assert waited.attributes["dibs.holder"] == computed.attributes["dibs.owner"]
    assert [event.name for event in waited.events] == ["waiting on holder", "artifact found"]
    assert waited.parent is None


def test_a_span_ended_off_the_callers_path_keeps_the_calls_times_and_attributes(
    client: dibs.Reservations, telemetry: Telemetry
) -> None:
    """The recorder's thread gives the span its events, attributes and end a moment after the call:
    with the times the call's events happened, not the recorder's."""
    before = time.time_ns()
    client.compute("timed", lambda: "value", owner="me")
    returned = time.time_ns()
    (span,) = telemetry.finished_spans()  # flushed now, later than the call's end
    assert span.start_time is not None and span.end_time is not None
    assert before <= span.start_time <= span.end_time <= returned
    (stored,) = span.events
    assert span.start_time <= stored.timestamp <= span.end_time
    assert span.attributes is not None
    assert {key: span.attributes[key] for key in ("dibs.key", *COMMON, "dibs.owner", "dibs.outcome")} == {
        "dibs.key": "otel/timed",
        "dibs.namespace": "otel",
        "dibs.store": "sqlite",
        "dibs.frontend": "python",
        "dibs.owner": "me",
        "dibs.outcome": "computed",
    }


def test_without_an_active_span_the_whole_span_is_made_later_under_the_callers(
    client: dibs.Reservations,
) -> None:
    """``active_span=False``: the span is made on the recorder's thread, still a child of the span
    the call started under, with the call's times; the work runs under the caller's span."""
    spans = InMemorySpanExporter()
    tracers = TracerProvider()
    tracers.add_span_processor(SimpleSpanProcessor(spans))
    meters = MeterProvider(metric_readers=[InMemoryMetricReader()])
    observer = OpenTelemetry(meters, tracers, active_span=False)
    seen: list[trace.Span] = []
    started: list[int] = []

    def work() -> str:
        started.append(time.time_ns())
        seen.append(trace.get_current_span())
        return "value"

    client.compute("warm", lambda: "value")  # unobserved: the store's first call sets it up
    with dibs.observe(observer), tracers.get_tracer("test").start_as_current_span("airflow task") as parent:
        before = time.time_ns()
        client.compute("later", work, owner="me")
        returned = time.time_ns()
    observer.flush()
    (span,) = [span for span in spans.get_finished_spans() if span.name == "dibs.reserve"]
    assert seen == [parent]  # not the dibs.reserve span
    assert span.parent is not None and span.parent.span_id == parent.get_span_context().span_id
    assert span.start_time is not None and span.end_time is not None
    # The call's ask, not the recorder's turn (which comes a batch delay after the ask, while the work
    # or later).
    assert before <= span.start_time <= started[0] <= span.end_time <= returned
    assert [event.name for event in span.events] == ["stored"]
    assert span.attributes is not None
    assert (span.attributes["dibs.key"], span.attributes["dibs.owner"], span.attributes["dibs.outcome"]) == (
        "otel/later",
        "me",
        "computed",
    )
    meters.shutdown()
    tracers.shutdown()


def test_a_failed_call_is_an_error_span_and_counted_failed(
    client: dibs.Reservations, telemetry: Telemetry
) -> None:
    def fail() -> None:
        raise KeyError("partition 7")

    with pytest.raises(KeyError):
        client.compute("bad", fail, owner="me")
    assert by_outcome(telemetry.points("dibs.reservation.outcomes")) == {"failed": 1}
    (span,) = telemetry.finished_spans()
    assert span.status.status_code == trace.StatusCode.ERROR
    assert span.attributes is not None and span.attributes["error.type"] == "KeyError"
    assert [event.name for event in span.events] == ["work failed"]


def test_store_operations_reach_the_process_observers_that_ask_for_them_once(
    client: dibs.Reservations,
) -> None:
    class Asking(list[dibs.Event]):
        kinds = dibs.events.EVERY_KIND

        def __call__(self, event: dibs.Event) -> None:
            self.append(event)

    plain: list[dibs.Event] = []
    asking = Asking()
    client.compute("quiet", lambda: 1, owner="me")  # nobody listening: nothing to hear, nothing breaks
    with dibs.observe(plain.append), dibs.observe(asking):
        started = time.perf_counter()
        client.compute("quiet", lambda: 1, owner="me")
        elapsed = time.perf_counter() - started
    assert [event.name for event in plain] == ["asked", "artifact_found", "finished"]  # the call's steps
    operations = [event for event in asking if isinstance(event, dibs.StoreOperation)]
    assert [event.operation for event in operations] == ["acquire"]  # one hit: one acquire, timed once
    assert 0 < operations[0].seconds <= elapsed  # timed, in seconds, within the call
    assert operations[0].store == "sqlite" and operations[0].call == 0


def test_a_batch_records_the_points_of_a_counter_with_the_same_attributes_as_their_sum() -> None:
    """What the SDK is handed a moment later: an uncontended call's lease +1 and -1 cancel out (the
    SDK charges microseconds per point) once the series exists; histograms keep every point; order
    is kept."""
    recorded: list[Measurement] = []
    later = Later(recorded.append, additive={"calls", "active"})
    a, b = {"dibs.store": "sqlite"}, {"dibs.store": "redis"}
    later.put(
        [
            Measurement("active", 1, a),
            Measurement("calls", 1, a),
            Measurement("seconds", 0.5, a),
            Measurement("calls", 1, b),
            Measurement("active", -1, a),
            Measurement("calls", 2, a),
            Measurement("seconds", 0.25, a),
        ]
    )
    later.flush()
    assert recorded == [
        Measurement("active", 0, a),  # once, so that a reader shows the series (at 0, not "no data")
        Measurement("calls", 3, a),
        Measurement("seconds", 0.5, a),
        Measurement("calls", 1, b),
        Measurement("seconds", 0.25, a),
    ]
    recorded.clear()
    later.put([Measurement("active", 1, a), Measurement("calls", 1, a), Measurement("active", -1, a)])
    later.flush()
    assert recorded == [Measurement("calls", 1, a)]  # the series exists: a sum of 0 changes nothing


def test_heartbeats_report_their_lateness_and_a_lost_lease_its_reason(
    tmp_path: Path, telemetry: Telemetry
) -> None:
    beat, lost = threading.Event(), threading.Event()
    beats: list[dibs.HeartbeatSent] = []

    def heard(event: dibs.Event) -> None:
        if isinstance(event, dibs.HeartbeatSent):
            beats.append(event)
            beat.set()
        elif isinstance(event, dibs.LostLease):
            lost.set()

    with dibs.Reservations(f"sqlite:///{tmp_path / 'short.db'}", namespace="otel", ttl=0.3) as client:

        def work() -> str:
            assert beat.wait(30), "no heartbeat"
            client.force_release("released-under-it")  # an operator's repair while the work runs
            assert lost.wait(30), "the lease was never found lost"
            return "late"

        report = client.compute("released-under-it", work, owner="me", observer=heard)
    assert report.role == "computed" and not report.stored
    (lateness,) = telemetry.points("dibs.heartbeat.lateness")
    assert lateness.count == len(beats) >= 1  # one point per heartbeat sent, with its own lateness
    assert lateness.sum == pytest.approx(sum(beat.lateness for beat in beats))
    (lost_point,) = telemetry.points("dibs.lease.lost")
    assert (lost_point.attributes["dibs.reason"], lost_point.value) == ("released", 1)
    # computed, and its value not stored (fenced out by the release): the metric says so, and why
    assert by_outcome(telemetry.points("dibs.reservation.outcomes")) == {"computed": 1}
    (not_stored,) = telemetry.points("dibs.reservation.not_stored")
    assert (not_stored.attributes["dibs.reason"], not_stored.value) == ("fenced", 1)
    failed_beats = [
        point
        for point in telemetry.points("dibs.store.operation.duration")
        if point.attributes.get("error.type") == "LeaseLost"
    ]
    assert {point.attributes["dibs.store.operation"] for point in failed_beats} >= {"heartbeat"}


def test_a_sampled_out_call_has_no_span_but_its_metrics_and_its_context(client: dibs.Reservations) -> None:
    """A sampler that drops the call's span: nothing recorded on it (the observer does not even build
    its events' attributes), the work still runs under its context, the metrics are all there."""
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    spans = InMemorySpanExporter()
    tracers = TracerProvider(sampler=ALWAYS_OFF)
    tracers.add_span_processor(SimpleSpanProcessor(spans))
    observer = OpenTelemetry(meters, tracers)
    seen: list[trace.Span] = []

    def work() -> str:
        seen.append(trace.get_current_span())
        return "fresh"

    try:
        with dibs.observe(observer):
            client.compute("dropped", work, owner="me")
            client.compute("dropped", work, owner="me")  # a hit
        observer.flush()
        assert spans.get_finished_spans() == ()
        (span,) = seen
        assert span.get_span_context().is_valid and not span.is_recording()
        assert trace.get_current_span() is trace.INVALID_SPAN  # the call's context detached again
        data = reader.get_metrics_data()
        assert data is not None
        points: list[Any] = [
            point
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
            if metric.name == "dibs.reservation.outcomes"
            for point in metric.data.data_points
        ]
        outcomes = by_outcome(points)
        assert outcomes == {"computed": 1, "hit": 1}
    finally:
        meters.shutdown()
        tracers.shutdown()


# -- the front end a store operation serves (issue 18: every metric carries dibs.frontend) ------------------
def frontends(telemetry: Telemetry) -> dict[tuple[str, str | None], int]:
    """The store operations recorded, by operation and front end (``None``: no front end)."""
    found: dict[tuple[str, str | None], int] = {}
    for point in telemetry.points("dibs.store.operation.duration"):
        which = (point.attributes["dibs.store.operation"], point.attributes.get("dibs.frontend"))
        found[which] = found.get(which, 0) + point.count
    return found


def test_a_python_call_s_store_operations_name_its_front_end(
    client: dibs.Reservations, telemetry: Telemetry
) -> None:
    assert client.run("py", lambda: 1) == 1
    assert client.run("py", lambda: 2) == 1  # a hit
    assert frontends(telemetry) == {("acquire", "python"): 2, ("complete", "python"): 1}


def test_the_store_operations_of_another_front_end_s_call_name_that_one(
    client: dibs.Reservations, telemetry: Telemetry
) -> None:
    """What Airflow's operator, Prefect's task and ``dibs run`` do: drive a call they made with their
    own ``frontend=``; what a failure releases names it too."""
    call = client.call("af", frontend="airflow")
    assert call.drive(StoreIO(client, lambda: 1, emit=call.emitter)).role == "computed"

    def fail() -> None:
        raise KeyError("no rows")

    call = client.call("broken", frontend="cli")
    with pytest.raises(KeyError):
        call.drive(StoreIO(client, fail, emit=call.emitter))
    assert frontends(telemetry) == {
        ("acquire", "airflow"): 1,
        ("complete", "airflow"): 1,
        ("acquire", "cli"): 1,
        ("release", "cli"): 1,
    }


def test_an_async_call_s_store_operations_in_the_io_executor_name_its_front_end(
    tmp_path: Path, telemetry: Telemetry
) -> None:
    """The async client asks, completes and releases in the runtime's I/O executor, whose threads
    serve every call: each job carries its call's front end there. A lease refused after too many
    failures is made and released in the executor too."""

    async def fail() -> None:
        raise KeyError("no rows")

    async def calls(client: dibs.AsyncReservations) -> None:
        assert (await client.compute("fine", lambda: asyncio.sleep(0, "v"))).role == "computed"
        with pytest.raises(KeyError):
            await client.compute("broken", fail)
        with pytest.raises(dibs.TooManyFailures):
            await client.compute("broken", fail)

    with dibs.Reservations(f"sqlite:///{tmp_path / 'a.db'}", namespace="otel", max_failures=1) as client:
        asyncio.run(calls(client.aio()))
    assert frontends(telemetry) == {
        ("acquire", "python"): 3,
        ("complete", "python"): 1,
        ("release", "python"): 2,  # the failure's, and the refused lease's
    }


def test_heartbeats_name_the_front_end_of_the_call_that_made_the_lease(
    tmp_path: Path, telemetry: Telemetry
) -> None:
    """Heartbeats run on a thread that serves no call: the lease says whose they are."""
    beat = threading.Event()

    def heard(event: dibs.Event) -> None:
        if isinstance(event, dibs.HeartbeatSent):
            beat.set()

    def work() -> str:
        assert beat.wait(30), "no heartbeat"
        return "value"

    with dibs.Reservations(f"sqlite:///{tmp_path / 'beat.db'}", namespace="otel", ttl=0.3) as client:
        call = client.call("beating", frontend="prefect", observer=heard)
        call.drive(StoreIO(client, work, emit=call.emitter))
    found = frontends(telemetry)
    assert found.get(("heartbeat", "prefect"), 0) >= 1
    assert {frontend for _, frontend in found} == {"prefect"}


def test_the_watch_hub_s_shared_reads_name_no_front_end(telemetry: Telemetry) -> None:
    """The hub reads a key once for every waiter on it, whatever their calls: its reads name no front
    end, while the calls' own operations (a waiter's asks included) name theirs."""
    from dibs.stores.memory import MemoryStore  # no read_many: the hub's reads are timed one by one

    holding, busy = threading.Event(), threading.Semaphore(0)
    operations: list[tuple[str, str, str]] = []  # (thread, operation, front end)
    hub_read = threading.Event()

    class Heard:
        kinds = dibs.events.EVERY_KIND

        def __call__(self, event: dibs.Event) -> None:
            if isinstance(event, dibs.KeyBusy):
                busy.release()
            elif isinstance(event, dibs.StoreOperation):
                thread = threading.current_thread().name
                operations.append((thread, event.operation, event.frontend))
                if thread.startswith("dibs-hub-"):
                    hub_read.set()

    def work() -> str:
        holding.set()
        assert busy.acquire(timeout=30), "the waiter never found the key busy"
        assert hub_read.wait(30), "the hub never read the key"
        return "value"

    with dibs.Reservations(MemoryStore(), namespace="otel", ttl=30) as client, dibs.observe(Heard()):
        holder = threading.Thread(target=lambda: client.run("shared", work), name="holder")
        waiter = threading.Thread(target=lambda: client.run("shared", lambda: "never"), name="waiter")
        holder.start()
        assert holding.wait(30)  # the holder first: the waiter waits on it
        waiter.start()
        holder.join()
        waiter.join()
    hub = {
        (operation, frontend) for thread, operation, frontend in operations if thread.startswith("dibs-hub-")
    }
    assert hub == {("read", "")}
    calls = {
        (thread, operation, frontend)
        for thread, operation, frontend in operations
        if thread in ("holder", "waiter")
    }
    assert calls >= {
        ("holder", "acquire", "python"),
        ("holder", "complete", "python"),
        ("waiter", "acquire", "python"),
    }
    assert {frontend for _, _, frontend in calls} == {"python"}
    found = frontends(telemetry)  # in the metrics: the hub's reads without dibs.frontend
    assert found[("read", None)] >= 1
    assert {frontend for (operation, frontend) in found if operation != "read"} == {"python"}


EXIT_SCRIPT = """
import json, sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

import dibs
import dibs.observers.later
from dibs.observers.otel import instrument

dibs.observers.later.BATCH_DELAY = 3600  # the recorder never gets to it: only the exit flush can

class ToFile(SpanExporter):
    def export(self, spans):
        with open(sys.argv[1], "a") as out:
            for span in spans:
                line = {"name": span.name, "outcome": span.attributes.get("dibs.outcome")}
                out.write(json.dumps(line) + "\\n")
        return SpanExportResult.SUCCESS

instrument()  # on the global (proxy) provider, before the application configures its own
provider = TracerProvider()  # registers its exit hook (shutdown: export what is pending) now
provider.add_span_processor(BatchSpanProcessor(ToFile()))
trace.set_tracer_provider(provider)
dibs.Reservations(sys.argv[2], namespace="exit").run("k", lambda: 1)
# no flush: the process just ends, as a task process does
"""


def test_spans_of_the_last_calls_reach_a_provider_set_up_after_the_observer(tmp_path: Path) -> None:
    exported = tmp_path / "spans.jsonl"
    subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT, str(exported), f"sqlite:///{tmp_path / 'dibs.db'}"],
        check=True,
        timeout=60,
    )
    lines = exported.read_text().splitlines() if exported.exists() else []
    spans = [json.loads(line) for line in lines]
    assert [span for span in spans if span["name"] == "dibs.reserve"] == [
        {"name": "dibs.reserve", "outcome": "computed"}
    ]


def test_a_forked_child_records_its_own_calls_and_never_the_parents(tmp_path: Path) -> None:
    """The child of a fork has the parent's recorder state but not its thread: here the state a fork
    copies mid-batch (a call's events queued, the wake-up set, the lock held by the recorder). The
    child must still record its own call, once, and not the parent's (the parent records those)."""
    seen = Telemetry()
    seen.observer = OpenTelemetry(seen.meters, seen.tracers)
    later = seen.observer._later
    read, write = os.pipe()
    with dibs.observe(seen.observer), dibs.Reservations(f"sqlite:///{tmp_path / 'dibs.db'}") as client:
        client.run("first", lambda: 0)  # the recorder's thread runs from here on
        seen.observer.flush()
        with later._flushing:  # the parent's recorder, mid-batch: the call's events stay queued
            client.run("parents", lambda: 1)
            assert later._queue and later._wake.is_set()
            pid = os.fork()
            if pid == 0:  # the child: its own call, then what its exporter got, through the pipe
                status = 1
                try:
                    signal.alarm(20)  # a child stuck on the copied lock must not hang the test
                    client.run("childs", lambda: 2)
                    seen.observer.flush()
                    spans = [span.attributes["dibs.key"] for span in seen.spans.get_finished_spans()]
                    spans.remove("default/first")  # exported before the fork: the child's copy has it
                    os.write(write, json.dumps(spans).encode())
                    status = 0
                finally:
                    os._exit(status)
        _, waited = os.waitpid(pid, 0)
        os.close(write)
        with os.fdopen(read) as pipe:
            reported = pipe.read()
        assert os.waitstatus_to_exitcode(waited) == 0, reported
        assert json.loads(reported) == ["default/childs"]
        keys = [span.attributes["dibs.key"] for span in seen.finished_spans()]
        assert keys == ["default/first", "default/parents"]


def test_closing_the_instrumentation_ends_the_spans_before_the_provider_shuts_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dibs.observers.later, "BATCH_DELAY", 3600)  # only close() can end the span
    seen = Telemetry()
    observation = instrument(seen.meters, seen.tracers)
    with dibs.Reservations(f"sqlite:///{tmp_path / 'dibs.db'}") as client:
        client.run("closed", lambda: 1)
    observation.close()
    seen.tracers.shutdown()  # what an application does last; a span ended after it is dropped
    spans = [span for span in seen.spans.get_finished_spans() if span.name == "dibs.reserve"]
    assert [span.attributes["dibs.outcome"] for span in spans] == ["computed"]


def test_the_auto_instrumentation_entry_point_instruments_and_uninstruments(tmp_path: Path) -> None:
    # What `opentelemetry-instrument` loads (the docs run it in processes of their own): dibs's
    # instrumentor, found by its entry point, publishing through the providers it is given.
    from importlib.metadata import entry_points

    (found,) = [e for e in entry_points(group="opentelemetry_instrumentor") if e.name == "dibs"]
    seen = Telemetry()
    instrumentor = found.load()()
    instrumentor.instrument(meter_provider=seen.meters, tracer_provider=seen.tracers)
    try:
        seen.observer = instrumentor._observation.observer
        with dibs.Reservations(f"sqlite:///{tmp_path / 'auto.db'}", namespace="otel") as client:
            client.run("auto", lambda: 1)
            assert by_outcome(seen.points("dibs.reservation.outcomes")) == {"computed": 1}
            assert [span.attributes["dibs.outcome"] for span in seen.finished_spans()] == ["computed"]
            instrumentor.uninstrument()
            client.run("auto", lambda: 1)  # a hit nobody publishes any more
        assert by_outcome(seen.points("dibs.reservation.outcomes")) == {"computed": 1}
    finally:
        instrumentor.uninstrument()
        seen.meters.shutdown()
        seen.tracers.shutdown()

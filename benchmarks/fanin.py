"""7. Fan-in: N async waiters in one event loop of one process, as a triggerer holds deferred tasks.

One waiter process (fresh, started for this benchmark) runs N waiting coroutines in one event loop:
Airflow's :class:`~dibs_provider.triggers.reservation.ReservationTrigger` ``run()`` where Airflow is
importable (each builds its own hook, exactly as in a triggerer, from the connection its task handed it), else
:meth:`dibs.AsyncReservations.wait`. They wait on **one** key, or on **N distinct** keys (one each).
The benchmark process holds the keys and, 50 to 250 ms after every waiter is subscribed to the
process's watch hub, completes them (one after another for N keys). Per case:

* **hand-off**: from the holder's ``complete`` call on a waiter's key to that waiter's coroutine
  returning, on the machine's monotonic clock (shared by all processes), p50 / p99 over all waiters;
* **errors**: waiters that did not return ``done`` with the holder's token (or raised, or were still
  waiting after the case's time limit); must be 0;
* **event-loop lag**: a ticker coroutine sleeps 5 ms again and again in the same loop; its worst
  oversleep from the first waiter's start to the last one's return (setting up the N waits, waiting,
  the hand-off). Baseline: the same ticker alone in the same loop just before;
* **server connections** of the waiter process, counted by the server: its URL carries a tag
  (PostgreSQL ``application_name``, Redis ``client_name``) and the benchmark process samples
  ``pg_stat_activity`` / ``CLIENT LIST`` every 20 ms; for SQLite, the process's open descriptors of
  the database file (one per SQLite connection), from ``/proc``. Bound: the pool plus the hub's
  listening connection (PostgreSQL 3 + 1, Redis 4 including the subscription);
* **CPU seconds** of the waiter process for the case (``time.process_time``), and its peak thread count;
* the store's **raw notification round trip** (:mod:`benchmarks.notify_rtt`: PostgreSQL NOTIFY →
  LISTEN → SELECT, Redis PUBLISH → pattern message → GET, SQLite commit → ``data_version`` → SELECT),
  measured in the same run before the cases; hand-off p50 is reported against it.

Baselines measured in the same run, interleaved round by round: N = 1 with the same code (ratios of
p50 and of CPU seconds), the idle loop's lag, and the connection bound. And what any N triggers cost
an event loop of the same process and thread, with the same heap (a fresh loop of its own, in its own
``asyncio.run``, not the waiters' loop), right after each round of the largest N on one key: N of Airflow's
own ``DateTimeTrigger.run()`` (standard provider) started at once, firing 1 s later, and N bare
coroutines that only ``asyncio.sleep`` as long; the worst lag of each from the first start to the last
return, and while starting (their first 0.5 s). Every measured start, dibs's and the baselines', follows a
``gc.collect()``, and the full collections that land in each window are counted (``gc.callbacks``):
a full collection stalls whichever coroutine tips it, so lags are compared with their counts beside.
What ``ReservationTrigger`` adds is the difference.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import json
import math
import multiprocessing.connection
import os
import random
import shutil
import statistics
import tempfile
import threading
import time
import traceback
import urllib.parse
import uuid
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import dibs
from benchmarks import notify_rtt
from benchmarks.pool import process_context
from benchmarks.settings import Settings
from benchmarks.stats import lag_text, percentile, ratio, summarize
from benchmarks.targets import Target
from dibs.runtime import runtime

NAMESPACE = "bench.fanin"
#: The ticker's sleep: its oversleep is the event loop's lag.
TICK = 0.005
#: Connections one process may hold per store (the tests' bound): the pool plus the hub's listener.
BOUND = {"postgres": 4, "redis": 4}
LAYOUTS = ("one", "distinct")


# -- the waiter process -----------------------------------------------------------------------------


class _Ticker:
    """Sleeps ``TICK`` again and again on the running loop; records when each wake-up was due, when it
    came, and how late it was."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float, float]] = []  # (due, woke, lag)
        self.threads = threading.active_count()
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + TICK
            await asyncio.sleep(TICK)
            woke = loop.time()
            self.samples.append((due, woke, max(0.0, woke - due)))
            self.threads = max(self.threads, threading.active_count())

    def __enter__(self) -> _Ticker:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()

    def stats(self, since: float = -math.inf, until: float = math.inf) -> dict[str, Any]:
        """The worst and p99 lag of the wake-ups late during ``since`` to ``until`` (monotonic), in ms;
        ``None`` if no tick was (then the window was not measured: not "no lag").

        A tick counts in every window its lateness overlaps (from when it was due to when it woke): a
        stall that spans a window, or begins in it and ends after it, is that window's lag too."""
        lags = [lag for due, woke, lag in self.samples if due < until and woke >= since]
        return {
            "worst_ms": max(lags) * 1e3 if lags else None,
            "p99_ms": percentile(lags, 99) * 1e3 if lags else None,
            "ticks": len(lags),
        }


class _FullCollections:
    """When the garbage collector began full (oldest-generation) collections while inside: each
    stalls the loop, in whichever coroutine tips it, so a window's lag is read beside its count."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def _seen(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info.get("generation") == 2:
            self.times.append(time.monotonic())

    def __enter__(self) -> _FullCollections:
        gc.callbacks.append(self._seen)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._seen)

    def count(self, since: float = -math.inf, until: float = math.inf) -> int:
        return sum(since <= moment < until for moment in self.times)


def _worst(values: Iterable[float | None]) -> float | None:
    """The largest of the measured values (``None``: not measured), ``None`` if none was."""
    return max((value for value in values if value is not None), default=None)


async def _drain_io() -> None:
    """Return once everything queued in the runtime's I/O executor before this call has finished:
    one job per thread, all meeting at a barrier, can only run together once the queue ahead is done."""
    threads = runtime().IO_THREADS
    barrier = threading.Barrier(threads)
    await asyncio.gather(*(runtime().io(barrier.wait, 60.0) for _ in range(threads)))


async def _floor(count: int, settle: float) -> dict[str, Any]:
    """The event loop's own floor: ``count`` coroutines awaiting a future each, all resolved by one
    ``call_soon_threadsafe`` from another thread (what the hub does per loop); latency from that call."""
    loop = asyncio.get_running_loop()
    futures = [loop.create_future() for _ in range(count)]

    async def wait(future: asyncio.Future[None]) -> float:
        await future
        return time.monotonic()

    tasks = [loop.create_task(wait(future)) for future in futures]
    await asyncio.sleep(settle)
    fired: list[float] = []

    def resolve_all() -> None:
        for future in futures:
            future.set_result(None)

    def fire() -> None:
        fired.append(time.monotonic())
        loop.call_soon_threadsafe(resolve_all)

    threading.Thread(target=fire, name="bench-fanin-floor").start()
    arrivals = await asyncio.gather(*tasks)
    return {"latencies": [arrived - fired[0] for arrived in arrivals]}


#: How long the baseline triggers and coroutines wait before they return (s), and the part of it
#: counted as their start.
BASELINE_HOLD, BASELINE_START = 1.0, 0.5


def _import_baseline_trigger() -> Any:
    """Airflow's own most trivial trigger, if the standard provider is installed."""
    try:
        from airflow.providers.standard.triggers.temporal import DateTimeTrigger
    except ImportError:
        return None
    return DateTimeTrigger


def _import_trigger() -> Any:
    try:
        from dibs_provider.triggers.reservation import ReservationTrigger
    except ImportError:
        return None
    return ReservationTrigger


class _Waiters:
    """What the waiter process keeps between cases: the way it waits and the store it waits on."""

    def __init__(self) -> None:
        self.trigger_class = _import_trigger()
        self.api = "trigger" if self.trigger_class is not None else "aio"
        self.url = ""
        self.conn_id = ""
        self.connection: dict[str, Any] = {}
        self.store: Any = None
        self.requests: collections.Counter[str] = collections.Counter()

    def open(self, url: str, conn_id: str) -> None:
        """Wait on ``url`` from now on: the Airflow connection the triggers read, and the shared store
        (the same object the triggers' clients get, so its hub counts their subscriptions)."""
        self.url, self.conn_id = url, conn_id
        connection = {"conn_type": "dibs", "extra": {"store_url": url, "namespace": NAMESPACE}}
        os.environ[f"AIRFLOW_CONN_{conn_id.upper()}"] = json.dumps(connection)
        # What a deferred task hands its trigger (DibsHook.for_trigger): the connection's fields, its
        # extra as the JSON text Airflow keeps.
        self.connection = {"conn_type": "dibs", "extra": json.dumps(connection["extra"])}
        self.store = runtime().share_store(url)
        self._count_requests(self.store)

    def _count_requests(self, store: Any) -> None:
        """Count the requests every client of the process sends through the shared store object (the
        waiters' reads and asks, the hub's batched reads): instance attributes shadow the methods."""
        counter = self.requests
        for name in ("read", "read_many", "acquire"):
            method = getattr(store, name)

            def counted(*args: Any, _method: Any = method, _name: str = name) -> Any:
                counter[_name] += 1
                return _method(*args)

            setattr(store, name, counted)

    def close(self) -> None:
        """Give everything back, so that the next store starts from an empty runtime."""
        if self.store is not None:
            runtime().return_store(self.store)
            self.store = None
        runtime().close()

    async def wait_one(self, key: str, token: int) -> tuple[float | None, str | None]:
        """Wait as a deferred task does; (arrival time, ``None``) or (``None``, what went wrong)."""
        try:
            if self.trigger_class is not None:
                trigger = self.trigger_class(
                    key, dibs_conn_id=self.conn_id, holder="holder", connection=self.connection
                )
                event = await anext(trigger.run())
                arrived = time.monotonic()
                payload = event.payload
                if payload.get("status") != "done" or payload.get("token") != token:
                    return None, f"{key}: event {payload!r}"
                return arrived, None
            client = dibs.Reservations(self.url, namespace=NAMESPACE).aio()
            try:
                hit = await client.wait(key)
            finally:
                client.client.close()
            arrived = time.monotonic()
            if hit is None or hit.value != f"artifact-of-{key}" or hit.token != token:
                return None, f"{key}: got {hit!r}"
            return arrived, None
        except Exception as exc:
            return None, f"{key}: {type(exc).__name__}: {exc}"

    async def case(
        self, conn: multiprocessing.connection.Connection, keys: list[str], tokens: dict[str, int], spec: Any
    ) -> dict[str, Any]:
        """Start a waiter per key, tell the holder once all of them wait, collect their returns.

        "All of them wait" means: every waiter subscribed to the hub, and the I/O executor drained of
        their first reads (a waiter subscribes, then reads the key once more before it parks). The
        holder says "completing" just before its first ``complete``: the hand-off phase starts there.
        """
        loop = asyncio.get_running_loop()
        with _Ticker() as idle:
            await asyncio.sleep(spec["idle_s"])
        hub = runtime().hub(self.store)
        assert hub is not None, f"{self.url} has no watch hub"
        base_waiters = hub.waiters
        marks: dict[str, float] = {}
        counted: dict[str, dict[str, int]] = {}  # the request counters at each mark

        def mark(phase: str) -> None:
            marks[phase] = time.monotonic()
            marks[f"{phase}_loop_cpu"] = time.thread_time()
            counted[phase] = dict(self.requests)

        # Every measured start begins with the collector's counts reset, as the baselines' do: whether a
        # full collection lands in a start then depends on what that start allocates, not on the past.
        gc.collect()
        cpu_started = time.process_time()
        mark("start")
        with _FullCollections() as collections, _Ticker() as ticker:
            tasks = [loop.create_task(self.wait_one(key, tokens[key])) for key in keys]
            deadline = marks["start"] + spec["timeout_s"]
            while hub.waiters - base_waiters < len(keys) and time.monotonic() < deadline:
                if any(task.done() for task in tasks):
                    break  # one returned before the holder completed anything: reported below
                await asyncio.sleep(0.002)
            await _drain_io()
            mark("parked")
            loop.add_reader(conn.fileno(), lambda: (conn.recv(), mark("completing")))
            try:
                conn.send(("ready", {"at": marks["parked"], "subscribed": hub.waiters - base_waiters}))
                _, pending = await asyncio.wait(tasks, timeout=max(1.0, deadline - time.monotonic()))
            finally:
                loop.remove_reader(conn.fileno())
            for task in pending:
                task.cancel()
            mark("end")
        cpu = time.process_time() - cpu_started
        if "completing" not in marks:  # every waiter returned before the holder began: an error below
            mark("completing")
        arrivals: list[float | None] = []
        errors: list[str] = []
        for task in tasks:
            if task in pending:
                arrivals.append(None)
                errors.append(f"still waiting after {spec['timeout_s']:.0f} s")
                continue
            arrived, error = task.result()
            arrivals.append(arrived)
            if error is not None:
                errors.append(error)

        def requests(after: str, until: str) -> dict[str, int]:
            return {
                name: counted[until].get(name, 0) - counted[after].get(name, 0)
                for name in ("read", "read_many", "acquire")
            }

        return {
            "arrivals": arrivals,
            "errors": len(errors),
            "error_samples": errors[:5],
            "setup_s": marks["parked"] - marks["start"],
            "wait_s": marks["completing"] - marks["parked"],
            "cpu_s": cpu,
            "handoff_loop_cpu_s": marks["end_loop_cpu"] - marks["completing_loop_cpu"],
            "requests": {
                "setup": requests("start", "parked"),
                "wait": requests("parked", "completing"),
                "handoff": requests("completing", "end"),
            },
            "lag": {
                "setup": ticker.stats(until=marks["parked"]),
                "wait": ticker.stats(since=marks["parked"], until=marks["completing"]),
                "handoff": ticker.stats(since=marks["completing"]),
                "idle": idle.stats(),
            },
            "full_collections": {
                "setup": collections.count(until=marks["parked"]),
                "wait": collections.count(since=marks["parked"], until=marks["completing"]),
                "handoff": collections.count(since=marks["completing"]),
            },
            "threads_before": idle.threads,
            "threads_peak": ticker.threads,
            "floor": await _floor(len(keys), spec["idle_s"]),
        }

    async def baseline(self, count: int, spec: Any) -> dict[str, Any]:
        """What ``count`` triggers that do nothing cost this loop: Airflow's ``DateTimeTrigger`` (if
        installed) and bare coroutines, started at once, returning after :data:`BASELINE_HOLD`."""
        import datetime

        loop = asyncio.get_running_loop()
        found: dict[str, Any] = {}
        trigger_class = _import_baseline_trigger()
        kinds = ["bare"] if trigger_class is None else ["trigger", "bare"]
        for kind in kinds:
            with _Ticker() as idle:
                await asyncio.sleep(spec["idle_s"])
            gc.collect()  # as before each of dibs's starts
            with _FullCollections() as collections, _Ticker() as ticker:
                started = time.monotonic()
                if kind == "trigger":
                    moment = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=BASELINE_HOLD)
                    tasks = [loop.create_task(anext(trigger_class(moment).run())) for _ in range(count)]
                else:
                    tasks = [loop.create_task(asyncio.sleep(BASELINE_HOLD)) for _ in range(count)]
                await asyncio.gather(*tasks)
            found[kind] = {
                "start_ms": ticker.stats(until=started + BASELINE_START)["worst_ms"],
                "all_ms": ticker.stats()["worst_ms"],
                "idle_ms": idle.stats()["worst_ms"],
                "full_collections_start": collections.count(until=started + BASELINE_START),
                "full_collections_all": len(collections.times),
            }
        found["trigger_label"] = None if trigger_class is None else "DateTimeTrigger.run()"
        return found


def waiter_main(conn: multiprocessing.connection.Connection, airflow_home: str, log_path: str) -> None:
    """(A plain ``Process`` target.) Serve cases until told to stop.

    Its output (a hook logs a line per trigger) goes to ``log_path``, shown if a case fails."""
    with open(log_path, "ab") as log_file:
        os.dup2(log_file.fileno(), 1)
        os.dup2(log_file.fileno(), 2)
    os.environ["AIRFLOW_HOME"] = airflow_home
    os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = os.path.join(airflow_home, "dags")
    os.environ.pop("DIBS_STORE_URL", None)
    waiters = _Waiters()
    conn.send(("started", {"api": waiters.api, "pid": os.getpid()}))
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        kind = message[0]
        try:
            if kind == "stop":
                waiters.close()
                return
            if kind == "open":
                waiters.open(message[1], message[2])
                conn.send(("done", None))
            elif kind == "close":
                waiters.close()
                conn.send(("done", None))
            elif kind == "case":
                _, keys, tokens, spec = message
                conn.send(("done", asyncio.run(waiters.case(conn, keys, tokens, spec))))
            elif kind == "baseline":
                _, count, spec = message
                conn.send(("done", asyncio.run(waiters.baseline(count, spec))))
        except BaseException:
            conn.send(("error", traceback.format_exc()))


# -- the benchmark process: holder, connection counter, statistics ------------------------------------


class WaiterProcess:
    """The waiter process, seen from the benchmark process.

    :meth:`start` only launches it: it then imports Airflow (seconds), so the driver may start it
    early, while a benchmark that measures no time (the waiter load) runs. Use it as a context manager.
    """

    def __init__(self) -> None:
        self._scratch = Path(tempfile.mkdtemp(prefix="dibs-bench-fanin-"))
        self.log_path = self._scratch / "waiter.log"
        self.process: BaseProcess | None = None
        self._conn: multiprocessing.connection.Connection | None = None
        self.api = ""
        self.pid = 0

    def start(self) -> WaiterProcess:
        if self.process is None:
            context = process_context()
            self._conn, child = context.Pipe()
            self.process = context.Process(
                target=waiter_main,
                args=(child, str(self._scratch / "airflow"), str(self.log_path)),
                daemon=True,
                name="bench-fanin",
            )
            self.process.start()
            child.close()
        return self

    def wait_started(self) -> None:
        """Block until the process has imported what it waits with; learn which way it waits."""
        if not self.pid:
            info = self.start().receive("started", 600)
            self.api, self.pid = info["api"], info["pid"]

    def tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return "(no output)"

    def send(self, *message: Any) -> None:
        assert self._conn is not None, "start() first"
        self._conn.send(message)

    def receive(self, expected: str, timeout: float) -> Any:
        assert self._conn is not None, "start() first"
        if not self._conn.poll(timeout):
            raise RuntimeError(f"the fan-in waiter process sent nothing for {timeout:.0f} s")
        kind, value = self._conn.recv()
        if kind == "error":
            raise RuntimeError(
                f"the fan-in waiter process failed:\n{value}\nIts output ends with:\n{self.tail()}"
            )
        if kind != expected:
            raise RuntimeError(f"the fan-in waiter process sent {kind!r}, expected {expected!r}: {value!r}")
        return value

    def call(self, *message: Any, timeout: float = 300) -> Any:
        self.send(*message)
        return self.receive("done", timeout)

    def close(self) -> None:
        if self.process is not None and self._conn is not None:
            with contextlib.suppress(OSError):
                self.send("stop")
            self.process.join(timeout=30)
            if self.process.is_alive():
                self.process.kill()
                self.process.join()
            self._conn.close()
        shutil.rmtree(self._scratch, ignore_errors=True)

    def __enter__(self) -> WaiterProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Peak:
    """Samples ``measure()`` every 20 ms in a thread and keeps the highest value (``None``: not countable)."""

    def __init__(self, measure: Callable[[], int | None]) -> None:
        self._measure = measure
        self._stop = threading.Event()
        self.peak: int | None = None
        self._thread = threading.Thread(target=self._run, name="bench-fanin-peak", daemon=True)

    def _look(self) -> None:
        value = self._measure()
        if value is not None:
            self.peak = value if self.peak is None else max(self.peak, value)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._look()
            self._stop.wait(0.02)

    def __enter__(self) -> _Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._look()


@contextlib.contextmanager
def _counter(target: Target, waiter_pid: Callable[[], int]) -> Iterator[tuple[str, Callable[[], int | None]]]:
    """The target's URL tagged for this benchmark, and how to count the waiter process's connections."""
    tag = f"dibs-fanin-{uuid.uuid4().hex[:10]}"
    separator = "&" if "?" in target.url else "?"
    if target.family == "postgres":
        import psycopg

        base = target.url.split("?", 1)[0].replace("postgresql+psycopg://", "postgresql://", 1)
        with psycopg.connect(base, autocommit=True) as admin:

            def count_postgres() -> int | None:
                row = admin.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (tag,)
                ).fetchone()
                return int(row[0]) if row else 0

            yield f"{target.url}{separator}application_name={tag}", count_postgres
        return
    if target.family == "redis":
        import redis

        client = redis.Redis.from_url(target.url.split("?", 1)[0])
        try:

            def count_redis() -> int | None:
                return sum(1 for entry in client.client_list() if entry.get("name") == tag)

            yield f"{target.url}{separator}client_name={tag}", count_redis
        finally:
            client.close()
        return
    if target.family == "sqlite":
        database = os.path.realpath(urllib.parse.unquote(target.url.split("///", 1)[1].split("?", 1)[0]))

        def count_sqlite() -> int | None:
            folder = Path(f"/proc/{waiter_pid()}/fd")
            found = 0
            with contextlib.suppress(OSError):
                for entry in folder.iterdir():
                    with contextlib.suppress(OSError):
                        found += os.readlink(entry) == database
            return found

        yield target.url, count_sqlite if Path("/proc/self/fd").is_dir() else (lambda: None)
        return
    yield target.url, lambda: None


def _one_case(
    waiter: WaiterProcess,
    holder: dibs.Reservations,
    count_connections: Callable[[], int | None],
    count: int,
    *,
    layout: str,
    hold: float,
    settings: Settings,
) -> dict[str, Any]:
    """N waiters on one key or on N keys; the holder completes ``hold`` seconds after they all wait."""
    run_id = uuid.uuid4().hex[:10]
    names = [f"{run_id}-{index}" for index in range(count)] if layout == "distinct" else [run_id]
    leases = {}
    for name in names:
        got = holder.get_or_reserve(name, owner="holder")
        assert isinstance(got, dibs.Acquired), got
        leases[name] = got.lease
    keys = names if layout == "distinct" else names * count
    tokens = {name: lease.token for name, lease in leases.items()}
    spec = {"idle_s": settings.fanin_idle, "timeout_s": settings.fanin_timeout}
    completed: dict[str, float] = {}
    with _Peak(count_connections) as connections:
        waiter.send("case", keys, tokens, spec)
        waiter.receive("ready", settings.fanin_timeout + 60)
        time.sleep(hold)
        waiter.send("completing")
        for name, lease in leases.items():
            completed[name] = time.monotonic()
            lease.complete(f"artifact-of-{name}")
        finished = time.monotonic()
        result = waiter.receive("done", settings.fanin_timeout + 60)
    arrivals = result.pop("arrivals")
    result.update(
        latencies=[arrived - completed[key] for key, arrived in zip(keys, arrivals, strict=True) if arrived],
        holder_s=finished - min(completed.values()),
        hold_s=hold,
        connections_peak=connections.peak,
    )
    return result


def _merge(rounds: list[dict[str, Any]], count: int) -> dict[str, Any]:
    """One row from a case's rounds: latencies pooled, the worst lag and connections, median CPU."""
    latencies = [value for one in rounds for value in one["latencies"]]
    peaks = [one["connections_peak"] for one in rounds if one["connections_peak"] is not None]

    def median(value: Callable[[dict[str, Any]], float]) -> float:
        return statistics.median(value(one) for one in rounds)

    return {
        "waiters": count,
        "rounds": len(rounds),
        "hold_s": [min(one["hold_s"] for one in rounds), max(one["hold_s"] for one in rounds)],
        "latency_ms": summarize(latencies).to_dict(1e3),
        "floor_ms": summarize([value for one in rounds for value in one["floor"]["latencies"]]).to_dict(1e3),
        "errors": sum(one["errors"] for one in rounds),
        "error_samples": [sample for one in rounds for sample in one["error_samples"]][:5],
        "lag_worst_ms": {
            phase: _worst(one["lag"][phase]["worst_ms"] for one in rounds)
            for phase in ("idle", "setup", "wait", "handoff")
        },
        # full collections in each phase, summed over the rounds (each start follows a gc.collect())
        "full_collections": {
            phase: sum(one["full_collections"][phase] for one in rounds)
            for phase in ("setup", "wait", "handoff")
        },
        "connections_peak": max(peaks) if peaks else None,
        "threads_peak": max(one["threads_peak"] for one in rounds),
        "threads_before": min(one["threads_before"] for one in rounds),
        "cpu_s": median(lambda one: one["cpu_s"]),
        "handoff_loop_cpu_us_per_waiter": median(lambda one: one["handoff_loop_cpu_s"] / count * 1e6),
        "setup_s": median(lambda one: one["setup_s"]),
        "holder_s": median(lambda one: one["holder_s"]),
        # requests through the shared store object, per waiter and phase (the waiters' reads and asks,
        # the hub's batched reads; the feed's own probes are not requests through the store object)
        "requests_per_waiter": {
            phase: {
                name: statistics.median(one["requests"][phase][name] / count for one in rounds)
                for name in ("read", "read_many", "acquire")
            }
            for phase in ("setup", "wait", "handoff")
        },
    }


def _store(
    waiter: WaiterProcess, target: Target, settings: Settings, log: Callable[[str], None]
) -> dict[str, Any]:
    counts = settings.fanin_counts_by_store.get(target.name, settings.fanin_counts)
    rng = random.Random(7)
    # The store's own notification round trip, measured in this run: the floor of a push hand-off.
    notify = notify_rtt.measure(target.family, target.url)
    holder = dibs.Reservations(target.url, namespace=NAMESPACE, ttl=600)
    collected: dict[tuple[str, int], list[dict[str, Any]]] = {}
    baselines: list[dict[str, Any]] = []
    late: dict[str, Any] | None = None

    def case(count: int, layout: str, hold: float) -> dict[str, Any]:
        return _one_case(
            waiter, holder, count_connections, count, layout=layout, hold=hold, settings=settings
        )

    try:
        with _counter(target, lambda: waiter.pid) as (url, count_connections):
            waiter.call("open", url, f"dibs_fanin_{target.name}")
            try:
                case(1, "one", settings.handoff_hold[0])  # warm-up: the store opens, the schema is checked
                for number in range(max(settings.fanin_rounds.values())):
                    for count in counts:
                        if number >= settings.fanin_rounds.get(count, 1):
                            continue
                        for layout in LAYOUTS if count > 1 else ("one",):
                            one = case(count, layout, rng.uniform(*settings.handoff_hold))
                            collected.setdefault((layout, count), []).append(one)
                            if count == max(counts) and layout == "one":  # what any N triggers cost
                                spec = {"idle_s": settings.fanin_idle}
                                baselines.append(waiter.call("baseline", count, spec))
                if settings.fanin_late_hold:
                    late = _merge([case(max(counts), "one", settings.fanin_late_hold)], max(counts))
            finally:
                waiter.call("close")
    finally:
        holder.close()
    base = _merge(collected[("one", 1)], 1)
    per_store: dict[str, Any] = {
        "bound": BOUND.get(target.family),
        "counts": list(counts),
        "notify_rtt_ms": notify,
    }
    if notify is not None:
        log(f"fanin {target.name}: raw notification round trip p50 {notify['p50_ms']:.2f} ms")
    for layout in LAYOUTS:
        rows: dict[str, Any] = {}
        for count in counts:
            row = dict(base if count == 1 else _merge(collected[(layout, count)], count))
            rows[str(count)] = _with_ratios(row, base, notify)
            if count > 1:
                log(_line(target.name, layout, row))
        per_store[layout] = rows
    if baselines:
        per_store["baseline"] = _merge_baselines(baselines, max(counts))
        log(_baseline_line(target.name, per_store["baseline"]))
    if late is not None:
        per_store["late"] = _with_ratios(late, base, notify)
        log(_line(target.name, f"one, after {settings.fanin_late_hold:g} s,", late))
    return per_store


def _merge_baselines(rounds: list[dict[str, Any]], count: int) -> dict[str, Any]:
    """The worst lag of each baseline kind over its rounds."""
    merged: dict[str, Any] = {
        "waiters": count,
        "rounds": len(rounds),
        "trigger_label": rounds[0]["trigger_label"],
    }
    for kind in ("trigger", "bare"):
        if all(kind in one for one in rounds):
            merged[kind] = {
                name: _worst(one[kind][name] for one in rounds) for name in ("start_ms", "all_ms", "idle_ms")
            }
            for name in ("full_collections_start", "full_collections_all"):  # summed over the rounds
                merged[kind][name] = sum(one[kind][name] for one in rounds)
    return merged


def _collections_text(kind: dict[str, Any]) -> str:
    if "full_collections_start" not in kind:
        return ""
    return f" ({kind['full_collections_start']} / {kind['full_collections_all']} full collections)"


def _baseline_line(store: str, baseline: dict[str, Any]) -> str:
    parts = []
    if "trigger" in baseline:
        trigger = baseline["trigger"]
        parts.append(
            f"{baseline['trigger_label']} lag {lag_text(trigger['start_ms'])} ms starting, "
            f"{lag_text(trigger['all_ms'])} ms in all{_collections_text(trigger)}"
        )
    bare = baseline["bare"]
    parts.append(
        f"bare coroutines {lag_text(bare['start_ms'])} / {lag_text(bare['all_ms'])} ms"
        + _collections_text(bare)
    )
    return f"fanin {store} baseline N={baseline['waiters']}: " + "; ".join(parts)


def _with_ratios(
    row: dict[str, Any], base: dict[str, Any], notify: dict[str, Any] | None = None
) -> dict[str, Any]:
    row["p50_vs_n1"] = ratio(row["latency_ms"]["median"], base["latency_ms"]["median"])
    row["p50_vs_notify"] = None if notify is None else ratio(row["latency_ms"]["median"], notify["p50_ms"])
    row["p50_vs_floor"] = ratio(row["latency_ms"]["median"], row["floor_ms"]["median"])
    row["cpu_vs_n1"] = ratio(row["cpu_s"], base["cpu_s"])
    return row


def _line(store: str, layout: str, row: dict[str, Any]) -> str:
    latency, lag = row["latency_ms"], row["lag_worst_ms"]
    return (
        f"fanin {store} {layout} N={row['waiters']}: "
        f"p50 {latency['median']:.1f} ms, p90 {latency['p90']:.1f} ms, p99 {latency['p99']:.1f} ms "
        f"(floor {row['floor_ms']['median']:.1f} ms"
        + (f", {row['p50_vs_notify']:.0f}x the store's notification" if row.get("p50_vs_notify") else "")
        + f"), errors {row['errors']}, lag {lag_text(lag['wait'])}/"
        f"{lag_text(lag['handoff'])} ms waiting/handing off ({lag_text(lag['setup'])} setting up), "
        f"connections {row['connections_peak']}, CPU {row['cpu_s']:.2f} s, "
        f"hand-off {row['handoff_loop_cpu_us_per_waiter']:.0f} µs/waiter on the loop"
    )


def run(
    targets: list[Target], settings: Settings, log: Callable[[str], None], waiter: WaiterProcess
) -> dict[str, Any]:
    """The fan-in cases on every chosen store, with ``waiter`` (started here if it is not yet)."""
    chosen = [target for target in targets if target.name in settings.fanin_stores]
    results: dict[str, Any] = {
        "stores": {},
        "tick_ms": TICK * 1e3,
        "late_hold_s": settings.fanin_late_hold,
        "problems": [],
    }
    log("fanin: waiting for the waiter process")
    waiter.wait_started()
    results["api"] = waiter.api
    results["api_label"] = (
        "ReservationTrigger.run() (Airflow provider)"
        if waiter.api == "trigger"
        else "AsyncReservations.wait (Airflow is not installed)"
    )
    for target in chosen:
        per_store = _store(waiter, target, settings, log)
        results["stores"][target.name] = per_store
        rows = [(f"{layout} N={n}", row) for layout in LAYOUTS for n, row in per_store[layout].items()]
        if "late" in per_store:
            rows.append((f"one N={per_store['late']['waiters']}, late", per_store["late"]))
        for name, row in rows:
            if row["errors"]:
                results["problems"].append(
                    f"fan-in {target.name} {name}: {row['errors']} waiter(s) failed, "
                    f"e.g. {row['error_samples'][:2]}"
                )
    return results

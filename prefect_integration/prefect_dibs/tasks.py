"""``@reserved``: a Prefect task whose identical calls compute once, whoever calls them.

Stack it over ``@task``::

    @reserved("sqlite:////shared/dibs.db", version="2")
    @task(retries=2)
    def build_features(day: str) -> dict: ...

Every call derives a key, ``qualname[@version]/<digest>`` with the digest covering the function's code
and its arguments, exactly as :func:`dibs.derive_key` does (so a plain ``dibs`` client or the Airflow
provider computing the same function with the same arguments shares the key, whichever module or
file the code is loaded from), and asks the store once:

* **hit**: the artifact exists; the task returns it, runs nothing, and ends ``Cached`` as a hit of
  Prefect's own cache does (see :mod:`prefect_dibs._cached`);
* **acquired**: this task run holds the lease; the work runs with background heartbeats, its value
  is stored as the key's artifact (JSON by default, so Airflow can read it too) and returned;
  a failure releases the lease with the error recorded, so a waiter takes over at once;
* **busy**: another run holds the lease; this one logs on whom it waits, records a ``Running`` state
  named ``Waiting`` (see :mod:`prefect_dibs._runs`), and waits (async tasks without blocking their
  event loop) until the artifact appears (it returns it, and ends ``Cached`` too) or the holder dies or
  fails (it takes over). If the key changes hands meanwhile, its logs and state say so at once.

The lease owner is the task run (its name and id), which Prefect keeps across retries: a retry
re-enters its own lease instead of waiting for it to expire.

Why not Prefect's own ``cache_policy`` with ``isolation_level="SERIALIZABLE"``? It does make a second
identical task wait, but its locks are never renewed nor expired (the task engine passes no hold
timeout), so a holder killed with SIGKILL leaves every waiter, and every future run, blocked; and a
waiting task looks like any Running one. :class:`prefect_dibs.DibsLockManager` fixes the first
part for users who want to keep Prefect's cache; ``@reserved`` also shares the result beyond Prefect.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import time
from collections.abc import Callable, Iterable
from typing import Any, Literal, TypeVar, overload

from dibs import Reservations, keys
from dibs.backoff import Backoff, Deadline
from dibs.config import default_owner, validate_seconds
from dibs.errors import ConfigurationError, StoreUnavailable
from dibs.keys import Key
from dibs.outcomes import Acquired, Busy, Hit, Outcome, RunReport
from dibs.runtime import runtime
from dibs.serializers import Serializer
from dibs.settings import validate_timings
from prefect_dibs import _cached, _runs
from prefect_dibs._clients import ClientSettings, StoreSpec, is_url, resolve_client
from prefect_dibs._watching import Seen, Watch, await_key, expiry_cause, wait_for_key

__all__ = ["KeySpec", "reserved"]

F = TypeVar("F", bound=Callable[..., Any])

#: ``key=``: a template formatted with the call's arguments (``"features-{day}"``), or a callable
#: receiving the task's arguments and returning the key name.
KeySpec = str | Callable[..., str]

Logger = Any  # a logging.Logger or Prefect's run-logger adapter


@overload
def reserved(store: F, /) -> F: ...


@overload
def reserved(
    store: StoreSpec = None,
    /,
    *,
    key: KeySpec | None = None,
    version: str | None = None,
    exclude: Iterable[str] = (),
    namespace: str | None = None,
    ttl: float | None = None,
    heartbeat_interval: float | None = None,
    timeout: float | None = None,
    serializer: str | Serializer | None = None,
    backoff: Backoff | None = None,
    progress_interval: float = 30.0,
    artifact: bool = True,
    max_age: float | None = None,
    refresh: bool | None = None,
) -> Callable[[F], F]: ...


def reserved(
    store: Any = None,
    /,
    *,
    key: KeySpec | None = None,
    version: str | None = None,
    exclude: Iterable[str] = (),
    namespace: str | None = None,
    ttl: float | None = None,
    heartbeat_interval: float | None = None,
    timeout: float | None = None,
    serializer: str | Serializer | None = None,
    backoff: Backoff | None = None,
    progress_interval: float = 30.0,
    artifact: bool = True,
    max_age: float | None = None,
    refresh: bool | None = None,
) -> Any:
    """Make identical calls of a Prefect task compute once across flow runs, processes and machines.

    :param store: a store URL, a :class:`~prefect_dibs.DibsStore` block or the name of a saved one,
        a :class:`dibs.Reservations` client, or ``None`` (``DIBS_STORE_URL``, then the embedded
        SQLite default, which only coordinates processes of one machine).
    :param key: override the derived key: a template such as ``"features-{day}"`` filled from the
        call's arguments, or a callable taking the task's arguments and returning the key name.
    :param version: part of the derived key, for what the source does not show (a helper it imports,
        the data behind it): the function's own code is already part of the key.
    :param exclude: parameters left out of the derived key (clients, loggers, flags that do not
        change the result).
    :param namespace: key namespace (default: the block's, else ``"default"``).
    :param ttl: seconds a lease lives without a heartbeat: a killed holder is taken over this long
        after its last heartbeat (default: the block's, else 60).
    :param heartbeat_interval: seconds between heartbeats (default a third of the ttl).
    :param timeout: seconds a waiter waits for another holder before failing with
        :class:`dibs.WaitTimeout` (default: the block's ``wait_timeout``, else forever).
    :param serializer: how the artifact is stored: ``"json"`` (default, readable by Airflow and any
        tool), ``"bytes"``, or a :class:`dibs.Serializer`; pickle needs a ``DibsStore`` with a signing key.
    :param backoff: how often a waiter polls stores that cannot notify (:class:`dibs.Backoff`).
    :param progress_interval: a waiter logs that it is still waiting this often (seconds).
    :param max_age: seconds after which a stored result is too old: the next call computes it again
        (default: the block's ``max_age``, else never), under the lease as always.
    :param refresh: compute again even if a result is stored; concurrent refreshes compute once.
        ``None`` (default) follows Prefect: the task's ``refresh_cache`` option (also set through
        ``with_options``), else the ``PREFECT_TASKS_REFRESH_CACHE`` setting.
    :param artifact: publish a Prefect markdown artifact saying whether this run computed, waited
        or hit, with the key, fencing token and producer.

    Stack it *over* ``@task`` (it returns a task with the same options), or under it / on a plain
    function (it returns a function; the reservation then also works outside Prefect).
    """
    if callable(store) and not isinstance(store, Reservations):
        return reserved()(store)  # bare ``@reserved``
    if version is not None and isinstance(key, str):
        raise ConfigurationError(
            "version= only applies to derived keys; put the version into the key template"
        )
    if key is not None and not (isinstance(key, str) or callable(key)):
        raise ConfigurationError(f"key= must be a template string or a callable, got {type(key).__name__}")
    validate_timings(ttl=ttl, heartbeat_interval=heartbeat_interval)  # the core's rules, said now
    Deadline(timeout)  # >= 0 seconds or None, as every dibs wait timeout
    validate_seconds("progress_interval", progress_interval)
    settings = ClientSettings(
        namespace=keys.validate_namespace(namespace) if namespace is not None else None,
        ttl=ttl,
        heartbeat_interval=heartbeat_interval,
        serializer=serializer,
        backoff=backoff,
        max_age=validate_seconds("max_age", max_age, allow_none=True),
    )

    def reservation(fn: Callable[..., Any]) -> _Reservation:
        return _Reservation(
            fn,
            store=store,
            key=key,
            version=version,
            exclude=tuple(exclude),
            settings=settings,
            timeout=timeout,
            progress_interval=progress_interval,
            artifact=artifact,
            refresh=refresh,
        )

    def decorate(target: F) -> F:
        from prefect import Task

        if isinstance(target, Task):
            if target.isgenerator:
                raise TypeError(
                    f"@reserved cannot wrap the generator task {target.name!r}: a stream has no artifact"
                )
            reserved_task = copy.copy(target)
            reserved_task.fn = reservation(target.fn).wrapper()
            _cached.adopt(reserved_task)  # hits end Cached, as Prefect's own cache hits do
            return reserved_task
        if not callable(target):
            raise TypeError(f"@reserved decorates a Prefect task or a function, got {type(target).__name__}")
        if inspect.isgeneratorfunction(target) or inspect.isasyncgenfunction(target):
            raise TypeError(f"@reserved cannot wrap the generator {target!r}: a stream has no artifact")
        return reservation(target).wrapper()  # type: ignore[return-value]  # functools.wraps keeps the signature

    return decorate


class _Reservation:
    """One reserved function's configuration, and the sync and async ways of running a call of it.

    It holds only configuration (no client, no thread), so a task that Prefect pickles for another
    process (Dask, Ray, a process pool) arrives intact and opens its own client there.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        store: StoreSpec,
        key: KeySpec | None,
        version: str | None,
        exclude: tuple[str, ...],
        settings: ClientSettings,
        timeout: float | None,
        progress_interval: float,
        artifact: bool,
        refresh: bool | None,
    ) -> None:
        self.fn = fn
        self.store = store
        self.key = key
        self.version = version
        self.exclude = exclude
        self.settings = settings
        self.timeout = timeout
        self.progress_interval = progress_interval
        self.artifact = artifact
        self.refresh = refresh

    def wrapper(self) -> Callable[..., Any]:
        fn = self.fn
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_reserved(*args: Any, **kwargs: Any) -> Any:
                return await self.arun(args, kwargs)

            async_reserved.__dibs_reservation__ = self  # type: ignore[attr-defined]
            return async_reserved

        @functools.wraps(fn)
        def sync_reserved(*args: Any, **kwargs: Any) -> Any:
            return self.run(args, kwargs)

        sync_reserved.__dibs_reservation__ = self  # type: ignore[attr-defined]
        return sync_reserved

    # -- what both worlds share ----------------------------------------------------------------------
    def key_name(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        if callable(self.key):
            name = self.key(*args, **kwargs)
            if not isinstance(name, str):
                raise ConfigurationError(
                    f"key= callable of {keys.qualified_name(self.fn)} returned {type(name).__name__} "
                    f"{name!r}; it must return the key name as a string"
                )
            return name
        if isinstance(self.key, str):
            return keys.format_key(self.key, self.fn, args, kwargs)
        return keys.derive_key(self.fn, args, kwargs, version=self.version, exclude=self.exclude)

    def resolve(self) -> tuple[Reservations, float | None]:
        """The client, and the wait timeout (ours, else the block's). Blocking (may load a block)."""
        client = resolve_client(self.store, self.settings)
        timeout = self.timeout
        if timeout is None:
            timeout = _block_wait_timeout(self.store)
        return client, timeout

    def refresh_wanted(self, ctx: Any) -> bool:
        """``refresh=``, else Prefect's own switch for this task run (see :func:`reserved`)."""
        if self.refresh is not None:
            return self.refresh
        return _runs.refresh_cache(ctx)

    def announce_wait(self, ctx: Any, logger: Logger, busy: Busy) -> None:
        logger.info(
            "%s is being computed by %s (lease attempt %d on this key, for %.1fs so far); waiting for its "
            "result instead of computing it again (its lease runs %.1fs more unless renewed: if that run "
            "dies, this one takes over)",
            busy.key,
            _runs.holder_link(busy.holder),
            busy.attempt,
            max(0.0, busy.now - busy.since),
            busy.remaining,
        )
        if busy.last_failure is not None:
            logger.info(
                "%s failed %d time(s) before; last error from %r: %s",
                busy.key,
                busy.last_failure.count,
                busy.last_failure.owner,
                busy.last_failure.error,
            )
        _runs.mark_state(ctx, "Waiting", f"waiting for {busy.key} held by {busy.holder!r}")

    def watch(self, ctx: Any, logger: Logger) -> Watch:
        """What this run says while it waits: a new holder at once (logs and state), and every
        ``progress_interval`` seconds that it still waits."""

        def changed(seen: Seen) -> None:
            busy = seen.busy
            logger.info("%s changed hands: now held by %s", busy.key, _runs.holder_link(busy.holder))
            _runs.mark_state(ctx, "Waiting", f"waiting for {busy.key} held by {busy.holder!r}")

        def progress(seen: Seen, waited: float) -> None:
            logger.info(
                "still waiting for %s: held by %r, %.0fs so far", seen.busy.key, seen.busy.holder, waited
            )

        return Watch(changed, progress, self.progress_interval)

    def announce_acquired(
        self, ctx: Any, logger: Logger, got: Acquired, waited_on: str | None, seen: Seen | None
    ) -> None:
        if got.took_over_from is not None:
            logger.warning(
                "%s: took over from %r: %s; computing it now (token %d)",
                got.key,
                got.took_over_from,
                expiry_cause(got, seen, limit="maximum lease age"),
                got.lease.token,
            )
        elif waited_on is not None:
            logger.info("%s: %r released it without a result; computing it now", got.key, waited_on)
        else:
            logger.info("%s: not computed yet; this run computes it (token %d)", got.key, got.lease.token)
        if got.last_failure is not None:
            logger.info(
                "%s failed %d time(s) before; last error from %r: %s",
                got.key,
                got.last_failure.count,
                got.last_failure.owner,
                got.last_failure.error,
            )
        if waited_on is not None:
            _runs.mark_state(ctx, "Running", f"computing {got.key}")

    @staticmethod
    def hit_report(got: Hit, waited: float, waited_on: str | None, logger: Logger) -> tuple[RunReport, str]:
        """How a run that used the artifact reports it, and the message of its ``Cached`` state."""
        role: Literal["waited", "hit"] = "waited" if waited_on is not None else "hit"
        if role == "waited":
            logger.info(
                "%s: computed by %r while this run waited %.1fs; using its artifact (token %d)",
                got.key,
                got.producer,
                waited,
                got.token,
            )
            message = f"dibs: {got.key} was computed by {got.producer!r} while this run waited {waited:.1f}s"
        else:
            logger.info(
                "%s: already computed by %r; using its artifact (token %d)", got.key, got.producer, got.token
            )
            message = f"dibs: {got.key} was already computed by {got.producer!r}"
        report = RunReport(got.key, got.value, role, got.token, got.producer, waited, waited_on)
        return report, f"{message} (token {got.token})"

    def unreserved(
        self,
        client: Reservations | None,
        logger: Logger,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        exc: StoreUnavailable,
    ) -> Key:
        """Re-raise ``exc`` unless the policy says to run unreserved; then log it and return the key.

        The policy is the client's, or, when the store could not even be opened, the block's.
        """
        policy = client.on_store_unavailable if client is not None else _unreachable_policy(self.store)
        if policy == "fail":
            raise exc
        namespace = client.namespace if client is not None else self.settings.namespace or "default"
        key = Key(namespace, self.key_name(args, kwargs))
        logger.warning(
            "the dibs store is unreachable (%s); running %s unreserved (on_store_unavailable='run')", exc, key
        )
        return key

    # -- sync ----------------------------------------------------------------------------------------
    def run(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        ctx = _runs.task_run_context()
        logger = _runs.run_logger(ctx)
        owner = _runs.task_run_owner(ctx) if ctx is not None else default_owner()
        waited_on: str | None = None
        seen: Seen | None = None
        client: Reservations | None = None
        started = time.monotonic()
        try:
            client, timeout = self.resolve()
            key = client.key(self.key_name(args, kwargs))
            refresh = self.refresh_wanted(ctx)
            started = time.monotonic()  # waiting starts now: opening the store is not waiting
            got: Outcome = client.get_or_reserve(key, owner, refresh=refresh)
            min_token = got.token if refresh and isinstance(got, Busy) else None  # its result is fresh
            if isinstance(got, Busy):
                self.announce_wait(ctx, logger, got)
                got, seen = wait_for_key(
                    client, key, owner, got, self.watch(ctx, logger), timeout=timeout, min_token=min_token
                )
                waited_on = seen.busy.holder
                if isinstance(got, Busy):
                    raise got.timed_out(time.monotonic() - started)
        except StoreUnavailable as exc:
            report_key = self.unreserved(client, logger, args, kwargs, exc)
            value = self.fn(*args, **kwargs)
            self.publish(ctx, RunReport(report_key, value, "unreserved", None, owner, stored=False), logger)
            return value
        waited = time.monotonic() - started
        if isinstance(got, Hit):
            report, message = self.hit_report(got, waited, waited_on, logger)
            self.publish(ctx, report, logger)
            return _cached.as_cached(ctx, self, report, message)
        self.announce_acquired(ctx, logger, got, waited_on, seen)
        held = client.hold(got, lambda: self.fn(*args, **kwargs), logger=logger)
        report = dataclasses.replace(held, waited_seconds=waited, waited_on=waited_on)
        self.publish(ctx, report, logger)
        return report.value

    def publish(self, ctx: Any, report: RunReport, logger: Logger) -> None:
        if not self.artifact or ctx is None:
            return
        try:
            from prefect.artifacts import create_markdown_artifact

            create_markdown_artifact(markdown=report_markdown(report), description=_description(report))
        except Exception as exc:  # a summary must never fail the task
            logger.debug("could not publish the dibs summary artifact: %s", exc)

    # -- async ---------------------------------------------------------------------------------------
    async def arun(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """:meth:`run` for coroutine tasks: the same steps, awaited; the task's loop is never blocked."""
        ctx = _runs.task_run_context()
        logger = _runs.run_logger(ctx)
        owner = _runs.task_run_owner(ctx) if ctx is not None else default_owner()
        waited_on: str | None = None
        seen: Seen | None = None
        client: Reservations | None = None
        started = time.monotonic()
        try:
            resolved, timeout = await runtime().io(self.resolve)
            client, aclient = resolved, resolved.aio()
            key = resolved.key(self.key_name(args, kwargs))
            refresh = self.refresh_wanted(ctx)
            started = time.monotonic()  # waiting starts now: opening the store is not waiting
            got: Outcome = await aclient.get_or_reserve(key, owner, refresh=refresh)
            min_token = got.token if refresh and isinstance(got, Busy) else None  # its result is fresh
            if isinstance(got, Busy):
                self.announce_wait(ctx, logger, got)
                got, seen = await await_key(
                    aclient, key, owner, got, self.watch(ctx, logger), timeout=timeout, min_token=min_token
                )
                waited_on = seen.busy.holder
                if isinstance(got, Busy):
                    raise got.timed_out(time.monotonic() - started)
        except StoreUnavailable as exc:
            report_key = self.unreserved(client, logger, args, kwargs, exc)
            value = await self.fn(*args, **kwargs)
            await self.apublish(
                ctx, RunReport(report_key, value, "unreserved", None, owner, stored=False), logger
            )
            return value
        waited = time.monotonic() - started
        if isinstance(got, Hit):
            report, message = self.hit_report(got, waited, waited_on, logger)
            await self.apublish(ctx, report, logger)
            return _cached.as_cached(ctx, self, report, message)
        self.announce_acquired(ctx, logger, got, waited_on, seen)
        held = await aclient.hold(got, lambda: self.fn(*args, **kwargs), logger=logger)
        report = dataclasses.replace(held, waited_seconds=waited, waited_on=waited_on)
        await self.apublish(ctx, report, logger)
        return report.value

    async def apublish(self, ctx: Any, report: RunReport, logger: Logger) -> None:
        if not self.artifact or ctx is None:
            return
        try:
            from prefect.artifacts import acreate_markdown_artifact

            await acreate_markdown_artifact(
                markdown=report_markdown(report), description=_description(report)
            )
        except Exception as exc:  # a summary must never fail the task
            logger.debug("could not publish the dibs summary artifact: %s", exc)


def _block_wait_timeout(store: StoreSpec) -> float | None:
    from prefect_dibs import _clients
    from prefect_dibs.blocks import DibsStore

    if isinstance(store, str) and not is_url(store):
        store = _clients._load_block(store)
    return store.wait_timeout if isinstance(store, DibsStore) else None


def _unreachable_policy(store: StoreSpec) -> str:
    from prefect_dibs import _clients
    from prefect_dibs.blocks import DibsStore

    if isinstance(store, Reservations):
        return store.on_store_unavailable
    if isinstance(store, str) and not is_url(store):
        store = _clients._load_block(store)
    return store.on_store_unavailable if isinstance(store, DibsStore) else "fail"


_ROLE_WORDS = {
    "computed": "this run computed it",
    "waited": "another run computed it while this one waited",
    "hit": "it was already computed",
    "unreserved": "the store was unreachable; this run computed it unreserved",
}


def _description(report: RunReport) -> str:
    return f"dibs: {report.role} {report.key}"


def report_markdown(report: RunReport) -> str:
    """A short markdown summary of how a reserved task got its value, for a Prefect artifact."""
    rows = [
        ("outcome", f"**{report.role}**: {_ROLE_WORDS[report.role]}"),
        ("key", f"`{report.key}`"),
        ("fencing token", "" if report.token is None else str(report.token)),
        ("producer", f"`{report.producer}`" if report.producer else ""),
    ]
    if report.waited_on is not None:
        rows.append(("waited", f"{report.waited_seconds:.1f} s on `{report.waited_on}`"))
    if report.took_over_from is not None:
        rows.append(("took over from", f"`{report.took_over_from}` (its lease expired)"))
    if not report.stored and report.role == "computed":
        rows.append(("stored", "no: see the run's logs"))
    table = "\n".join(f"| {name} | {value} |" for name, value in rows)
    return f"### dibs reservation\n\n| | |\n| --- | --- |\n{table}\n"

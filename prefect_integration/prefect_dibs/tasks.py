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
import re
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypedDict, TypeVar, Unpack, overload

from dibs import Backoff, Reservations, RunReport, events, keys
from dibs.display import last_failure
from dibs.errors import ConfigurationError
from dibs.integration import (
    AsyncStoreIO,
    Call,
    Deadline,
    StoreIO,
    checked,
    default_owner,
    runtime,
    validate_seconds,
    validate_timings,
)
from dibs.keys import Key
from dibs.serializers import Serializer
from prefect_dibs import _cached, _runs
from prefect_dibs import events as prefect_events
from prefect_dibs._clients import ClientSettings, StoreBlock, StoreSpec, is_url, load_block, resolve_client
from prefect_dibs._takeover import expiry_cause
from prefect_dibs.payloads import PayloadsSpec, validate_payloads

__all__ = ["RESERVED_DEFAULTS", "KeySpec", "ReservedOptions", "reserved"]

F = TypeVar("F", bound=Callable[..., Any])

#: ``key=``: a template formatted with the call's arguments (``"features-{day}"``), or a callable
#: receiving the task's arguments and returning the key name.
KeySpec = str | Callable[..., str]

Logger = Any  # a logging.Logger or Prefect's run-logger adapter


class ReservedOptions(TypedDict, total=False):
    """The keyword options of ``@reserved(...)``, written once for its signatures (:func:`reserved`
    says what each does, :data:`RESERVED_DEFAULTS` holds their defaults): type checkers see every
    option, and a misspelt one is refused."""

    key: KeySpec | None
    version: str | None
    exclude: Iterable[str]
    namespace: str | None
    ttl: float | None
    heartbeat_interval: float | None
    timeout: float | None
    serializer: str | Serializer | None
    backoff: Backoff | None
    progress_interval: float
    artifact: bool
    max_age: float | None
    refresh: bool | None
    payloads: PayloadsSpec


_DEFAULTS: ReservedOptions = {
    "key": None,
    "version": None,
    "exclude": (),
    "namespace": None,
    "ttl": None,
    "heartbeat_interval": None,
    "timeout": None,
    "serializer": None,
    "backoff": None,
    "progress_interval": 30.0,
    "artifact": True,
    "max_age": None,
    "refresh": None,
    "payloads": None,
}
#: Every option's default, in one place (docs/prefect.md lists the options from here). Read-only:
#: every later ``@reserved`` starts from it, so a caller's change would silently alter all of them.
RESERVED_DEFAULTS: Mapping[str, Any] = types.MappingProxyType(_DEFAULTS)


@overload
def reserved(store: F, /) -> F: ...


@overload
def reserved(store: StoreSpec = None, /, **options: Unpack[ReservedOptions]) -> Callable[[F], F]: ...


def reserved(store: Any = None, /, **options: Unpack[ReservedOptions]) -> Any:
    """Make identical calls of a Prefect task compute once across flow runs, processes and machines.

    :param store: a store URL, a :class:`~prefect_dibs.DibsStore` block or the name of a saved one,
        a :class:`dibs.Reservations` client, or ``None`` (``DIBS_STORE_URL``, then the embedded
        SQLite default, which only coordinates processes of one machine).
    :param key: override the derived key: a template such as ``"features-{day}"`` filled from the
        call's arguments, or a callable taking the task's arguments and returning the key name
        (default: derived from the function's code and the call's arguments).
    :param version: part of the derived key, for what the source does not show (a helper it imports,
        the data behind it): the function's own code is already part of the key (default none).
    :param exclude: parameters left out of the derived key (clients, loggers, flags that do not
        change the result; default none).
    :param namespace: key namespace (default: the block's, else ``"default"``).
    :param ttl: seconds a lease lives without a heartbeat: a killed holder is taken over this long
        after its last heartbeat (default: the block's, else 60).
    :param heartbeat_interval: seconds between heartbeats (default a third of the ttl).
    :param timeout: seconds a waiter waits for another holder before failing with
        :class:`dibs.WaitTimeout` (default: the block's ``wait_timeout``, else forever).
    :param serializer: how the artifact is stored: ``"json"`` (default, readable by Airflow and any
        tool), ``"bytes"``, or a :class:`dibs.Serializer`; pickle needs a ``DibsStore`` with a signing key.
    :param backoff: how often a waiter polls stores that cannot notify (:class:`dibs.Backoff`;
        default: the block's, else the client's).
    :param progress_interval: a waiter logs that it is still waiting this often (seconds, default 30).
    :param max_age: seconds after which a stored result is too old: the next call computes it again
        (default: the block's ``max_age``, else never), under the lease as always.
    :param refresh: compute again even if a result is stored; concurrent refreshes compute once.
        ``None`` (default) follows Prefect: the task's ``refresh_cache`` option (also set through
        ``with_options``), else the ``PREFECT_TASKS_REFRESH_CACHE`` setting.
    :param payloads: where results over 64 KiB go, instead of the block's payload store: a Prefect
        filesystem block (``LocalFileSystem``, ``RemoteFileSystem``) or its slug such as
        ``"local-file-system/results"`` (as ``result_storage=`` takes it), or a payload store URL
        (see :mod:`prefect_dibs.payloads`; default: the block's, else none).
    :param artifact: publish a Prefect markdown artifact saying whether this run computed, waited
        or hit, with the key, fencing token and producer (default ``True``).

    Stack it *over* ``@task`` (it returns a task with the same options), or under it / on a plain
    function (it returns a function; the reservation then also works outside Prefect).
    """
    checked("reserved", options, ReservedOptions)  # as Python refuses a misspelt keyword argument
    if callable(store) and not isinstance(store, Reservations):
        return reserved()(store)  # bare ``@reserved``
    given: ReservedOptions = {**_DEFAULTS, **options}
    key, version, namespace = given["key"], given["version"], given["namespace"]
    ttl, heartbeat_interval, timeout = given["ttl"], given["heartbeat_interval"], given["timeout"]
    progress_interval, payloads = given["progress_interval"], given["payloads"]
    if version is not None and isinstance(key, str):
        raise ConfigurationError(
            "version= only applies to derived keys; put the version into the key template"
        )
    if key is not None and not (isinstance(key, str) or callable(key)):
        raise ConfigurationError(f"key= must be a template string or a callable, got {type(key).__name__}")
    validate_timings(ttl=ttl, heartbeat_interval=heartbeat_interval)  # the core's rules, said now
    Deadline(timeout)  # >= 0 seconds or None, as every dibs wait timeout
    validate_seconds("progress_interval", progress_interval)
    validate_payloads(payloads)
    settings = ClientSettings(
        namespace=keys.validate_namespace(namespace) if namespace is not None else None,
        ttl=ttl,
        heartbeat_interval=heartbeat_interval,
        serializer=given["serializer"],
        backoff=given["backoff"],
        max_age=validate_seconds("max_age", given["max_age"], allow_none=True),
    )

    def reservation(fn: Callable[..., Any]) -> _Reservation:
        return _Reservation(
            fn,
            store=store,
            key=key,
            version=version,
            exclude=tuple(given["exclude"]),
            settings=settings,
            timeout=timeout,
            progress_interval=progress_interval,
            artifact=given["artifact"],
            refresh=given["refresh"],
            payloads=payloads,
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


@dataclasses.dataclass(eq=False)
class _Reservation:
    """One reserved function's configuration, and the sync and async ways of running a call of it.

    It holds only configuration (no client, no thread), so a task that Prefect pickles for another
    process (Dask, Ray, a process pool) arrives intact and opens its own client there.
    """

    fn: Callable[..., Any]
    _: dataclasses.KW_ONLY
    store: StoreSpec
    key: KeySpec | None
    version: str | None
    exclude: tuple[str, ...]
    settings: ClientSettings
    timeout: float | None
    progress_interval: float
    artifact: bool
    refresh: bool | None
    payloads: PayloadsSpec

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
        client = resolve_client(self.store, self.settings, self.payloads)
        timeout = self.timeout
        if timeout is None:
            timeout = _block_wait_timeout(self.store)
        return client, timeout

    def refresh_wanted(self, ctx: Any) -> bool:
        """``refresh=``, else Prefect's own switch for this task run (see :func:`reserved`)."""
        if self.refresh is not None:
            return self.refresh
        return _runs.refresh_cache(ctx)

    def announce_wait(self, ctx: Any, logger: Logger, busy: events.KeyBusy) -> None:
        """The run found the key busy: say on whom it waits, and show ``Waiting``."""
        logger.info(
            "%s is being computed by %s (lease attempt %d on this key, for %.1fs so far); waiting for its "
            "result instead of computing it again (its lease runs %.1fs more unless renewed: if that run "
            "dies, this one takes over)",
            busy.key,
            _runs.holder_link(busy.holder),
            busy.attempt,
            busy.held_for,
            busy.expires_in,
        )
        if busy.last_failure is not None:
            logger.info(
                "%s %s", busy.key, last_failure(busy.failures, busy.last_failure_owner, busy.last_failure)
            )
        _runs.mark_state(ctx, "Waiting", f"waiting for {busy.key} held by {busy.holder!r}")

    def call(
        self,
        ctx: Any,
        logger: Logger,
        *,
        client: Reservations,
        timeout: float | None,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> tuple[Call, _Narrator]:
        """This task run's compute-once call (:mod:`dibs.flow`), and the narrator of its events."""
        prefect_events.install()  # its outcomes in the Prefect UI's event feed
        narrator = _Narrator(ctx, logger, self)
        call = client.call(
            self.key_name(args, kwargs),
            owner=_owner(ctx),
            timeout=timeout,
            refresh=self.refresh_wanted(ctx),
            frontend="prefect",
            observer=narrator,
            progress_every=self.progress_interval,
        )
        return call, narrator

    # -- sync ----------------------------------------------------------------------------------------
    def run(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        ctx = _runs.task_run_context()
        logger = _runs.run_logger(ctx)
        client, timeout = self.resolve()
        call, _ = self.call(ctx, logger, client=client, timeout=timeout, args=args, kwargs=kwargs)
        report = call.drive(
            StoreIO(client, lambda: self.fn(*args, **kwargs), emit=call.emitter, logger=logger)
        )
        self.publish(ctx, report, logger)
        return self.returned(ctx, report)

    def returned(self, ctx: Any, report: RunReport) -> Any:
        """What the task returns: a value it used from the store ends ``Cached``, as Prefect's own hits do."""
        if report.role not in ("hit", "waited"):
            return report.value
        if report.role == "waited":
            message = (
                f"dibs: {report.key} was computed by {report.producer!r} while this run waited "
                f"{report.waited_seconds:.1f}s"
            )
        else:
            message = f"dibs: {report.key} was already computed by {report.producer!r}"
        return _cached.as_cached(ctx, self, report, f"{message} (token {report.token})")

    def publish(self, ctx: Any, report: RunReport, logger: Logger) -> None:
        if not self.artifact or ctx is None:
            return
        try:
            from prefect.artifacts import create_markdown_artifact

            create_markdown_artifact(**_artifact(report))
        except Exception as exc:  # a summary must never fail the task
            logger.debug("could not publish the dibs summary artifact: %s", exc)

    # -- async ---------------------------------------------------------------------------------------
    async def arun(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """:meth:`run` for coroutine tasks: the same flow, awaited; the task's loop is never blocked."""
        ctx = _runs.task_run_context()
        logger = _runs.run_logger(ctx)
        client, timeout = await runtime().io(self.resolve)
        call, _ = self.call(ctx, logger, client=client, timeout=timeout, args=args, kwargs=kwargs)
        io = AsyncStoreIO(client, lambda: self.fn(*args, **kwargs), emit=call.emitter, logger=logger)
        report = await call.adrive(io)
        await self.apublish(ctx, report, logger)
        return self.returned(ctx, report)

    async def apublish(self, ctx: Any, report: RunReport, logger: Logger) -> None:
        """:meth:`publish` with Prefect's async call (a coroutine task's loop is never blocked)."""
        if not self.artifact or ctx is None:
            return
        try:
            from prefect.artifacts import acreate_markdown_artifact

            await acreate_markdown_artifact(**_artifact(report))
        except Exception as exc:  # a summary must never fail the task
            logger.debug("could not publish the dibs summary artifact: %s", exc)


def _artifact(report: RunReport) -> dict[str, Any]:
    """The run's summary artifact, as Prefect's ``create_markdown_artifact`` takes it."""
    return {
        "key": artifact_key(report.key),
        "markdown": report_markdown(report),
        "description": _description(report),
    }


def _owner(ctx: Any) -> str:
    return _runs.task_run_owner(ctx) if ctx is not None else default_owner()


def _say_unreserved(logger: Logger, key: Key | str, error: str) -> None:
    logger.warning(
        "the dibs store is unreachable (%s); running %s unreserved (on_store_unavailable='run')", error, key
    )


class _Narrator:
    """The flow's events in a Prefect run's words: its log lines and its ``Waiting``/``Running`` states.

    While the run waits, the flow's wait step tells it at once when the key changes hands
    (``HolderChanged``) and every ``progress_interval`` that it still waits (``StillWaiting``); the
    steps remember the last lease they saw, to explain a takeover.
    """

    def __init__(self, ctx: Any, logger: Logger, reservation: _Reservation) -> None:
        self.ctx, self.logger, self.reservation = ctx, logger, reservation
        self.waited: events.Waited | None = None
        self.announced = False

    def __call__(self, event: events.Event) -> None:
        if isinstance(event, events.KeyBusy) and not self.announced:
            self.announced = True
            self.reservation.announce_wait(self.ctx, self.logger, event)
        elif isinstance(event, events.HolderChanged):
            holder = _runs.holder_link(event.holder)
            self.logger.info("%s changed hands: now held by %s", event.key, holder)
            _runs.mark_state(self.ctx, "Waiting", f"waiting for {event.key} held by {event.holder!r}")
        elif isinstance(event, events.StillWaiting):
            self.logger.info(
                "still waiting for %s: held by %r, %.0fs so far", event.key, event.holder, event.seconds
            )
        elif isinstance(event, events.Waited):
            self.waited = event
        elif isinstance(event, events.ArtifactFound):
            self._found(event)
        elif isinstance(event, events.LeaseAcquired):
            self._acquired(event)
        elif isinstance(event, events.StoreUnreachable):
            patience = "as long as the wait may last" if event.patience is None else f"{event.patience:g}s"
            self.logger.warning(
                "the dibs store is unreachable (%s); this run holds nothing, so it keeps waiting for "
                "the store (outage_patience: %s)",
                event.error,
                patience,
            )
        elif isinstance(event, events.StoreReachable):
            self.logger.info("the dibs store answers again after %.1fs; waiting on", event.seconds)
        elif isinstance(event, events.RanUnreserved):
            _say_unreserved(self.logger, event.key, event.error)

    def _found(self, got: events.ArtifactFound) -> None:
        if got.waited:
            waited = 0.0 if self.waited is None else self.waited.seconds
            self.logger.info(
                "%s: computed by %r while this run waited %.1fs; using its artifact (token %d)",
                got.key,
                got.producer,
                waited,
                got.token,
            )
        else:
            self.logger.info(
                "%s: already computed by %r; using its artifact (token %d)", got.key, got.producer, got.token
            )

    def _acquired(self, got: events.LeaseAcquired) -> None:
        logger = self.logger
        waited_on = None if self.waited is None else self.waited.holder
        if got.took_over_from is not None:
            logger.warning(
                "%s: took over from %r: %s; computing it now (token %d)",
                got.key,
                got.took_over_from,
                expiry_cause(got, limit="maximum lease age"),
                got.token,
            )
        elif waited_on is not None:
            logger.info("%s: %r released it without a result; computing it now", got.key, waited_on)
        else:
            logger.info("%s: not computed yet; this run computes it (token %d)", got.key, got.token)
        if got.last_failure is not None:
            logger.info(
                "%s %s", got.key, last_failure(got.failures, got.last_failure_owner, got.last_failure)
            )
        if waited_on is not None:
            _runs.mark_state(self.ctx, "Running", f"computing {got.key}")


def _block_wait_timeout(store: StoreSpec) -> float | None:
    if isinstance(store, str) and not is_url(store):
        store = load_block(store)
    return store.wait_timeout if isinstance(store, StoreBlock) else None


_ROLE_WORDS = {
    "computed": "this run computed it",
    "waited": "another run computed it while this one waited",
    "hit": "it was already computed",
    "unreserved": "the store was unreachable; this run computed it unreserved",
}


def artifact_key(key: Key) -> str:
    """The Prefect artifact key of a dibs key's summaries: ``dibs-<namespace>-<name>-<digest>``, in the
    lowercase letters, digits and dashes Prefect takes. Prefect's Artifacts page lists only keyed
    artifacts, each key with its latest version and its history: there, each dibs key is one entry,
    its runs its versions. The digest keeps apart two keys whose names read alike once lowercased."""
    readable = re.sub(r"[^a-z0-9]+", "-", f"{key.namespace}-{key.name}".lower()).strip("-")[:80].rstrip("-")
    return f"dibs-{readable}-{key.digest[:8]}"


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

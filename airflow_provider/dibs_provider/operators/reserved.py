"""Reserved operators: the work of a task runs once per key across DAG runs, DAGs and retries.

Every reserved task asks the store one atomic question before it works
(:meth:`dibs.Reservations.get_or_reserve`):

* **hit**: the key's artifact exists. Nothing runs; the artifact is the task's return value (its XCom)
  and the log names the run that made it.
* **acquired**: this task holds the lease. The wrapped operator's ``execute`` runs while a background
  thread heartbeats the lease; its result is stored as the artifact and returned. If it raises, the
  lease is released with the failure recorded (so a waiting run takes over at once) and the task
  fails as it normally would. A value that cannot be stored, or a store that fails while storing it
  (then the connection's ``on_store_unavailable`` decides), is handled by the core's hold loop
  (:meth:`dibs.Reservations.hold`), exactly as for every other dibs caller.
* **busy**: another run holds the lease. The task *defers* to :class:`ReservationTrigger`, so no
  worker slot is held while it waits, and resumes in :meth:`ReservedOperatorMixin.execute_complete`
  when the artifact exists (it returns it) or the key is free again (it asks again, and may run the
  work or defer again). With ``reservation_deferrable=False`` it waits in the worker instead.
* **the store cannot be reached** when the task first asks: the connection's ``on_store_unavailable``
  decides, as for :meth:`dibs.Reservations.run`: ``fail`` (the default) fails the task with
  :class:`dibs.StoreUnavailable`; ``run`` runs the work without a lease and stores nothing (the outcome
  says ``unreserved``). A task that already waits (deferred, or resumed to ask again) holds nothing:
  it rides an outage out, for the connection's ``outage_patience`` (60 s by default) at most, in the
  triggerer and when it asks again; an outage that outlasts it ends the wait, and
  ``on_store_unavailable`` decides then as at the first ask (:class:`ReservationSensor`, which has
  nothing to run, fails).

The owner of a lease is the *logical* task, ``dag_id/run_id/task_id/map_index`` (no try number), so a
retry of a task whose worker died re-enters its own lease instead of waiting for it to expire.

Each task also pushes an XCom ``dibs_outcome`` saying how it got its value (``computed``, ``waited``,
``hit`` or ``unreserved``), with the key, token, producer, holder waited on and wait time. A value kept
in the connection's payload store is returned as a small reference instead (:mod:`dibs_provider.xcom`:
its XCom backend, or :func:`dibs_provider.xcom.resolve`, gives downstream tasks the value); a hit
then never loads the payload into the worker: it checks that the payload is there with its recorded
size, and the downstream reader checks its digest as it reads it.

Three ways in, one implementation (:class:`ReservedOperatorMixin`):

* ``@task.reserved`` (see :mod:`dibs_provider.decorators.reserved`),
* :class:`ReservedPythonOperator` for classic DAGs,
* :func:`reserved_operator` (or subclassing the mixin) for any existing operator, e.g.
  ``reserved_operator(BashOperator)``: its ``execute`` result becomes the artifact.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import time
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import BaseOperator
from airflow.sdk.definitions.context import KNOWN_CONTEXT_KEYS

from dibs import Hit, Reservations, events
from dibs.display import last_failure
from dibs.errors import ConfigurationError, InvalidKey, ReservationError, StoreUnavailable
from dibs.integration import (
    Call,
    Found,
    HeldLease,
    RunUnreserved,
    StoreIO,
    Suspend,
    Wait,
    Waiting,
    Work,
    failure_text,
    unread_hit,
    validate_seconds,
)
from dibs.keys import DERIVED_DIGEST_LENGTH, Key, canonical_json, derive_key, digest
from dibs.payloads import ReferencedArtifact, ReferencingStore, unread
from dibs_provider import xcom
from dibs_provider._compat import AirflowSkipException, TaskDeferred
from dibs_provider.hooks.dibs import DEFAULT_CONN_ID, DibsHook
from dibs_provider.links.reservation import ReservationLink
from dibs_provider.operators._stopping import release_killed
from dibs_provider.triggers.reservation import ReservationTrigger, error_from_event, parse_event

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = [
    "OUTCOME_XCOM_KEY",
    "ReservedOperatorMixin",
    "ReservedPythonOperator",
    "reserved_operator",
    "task_owner",
]

#: The XCom key under which every reserved task records how it got its value.
OUTCOME_XCOM_KEY = "dibs_outcome"

#: Template fields of the reservation itself: never part of a derived key.
_RESERVATION_FIELDS = frozenset({"reservation_key", "reservation_refresh"})
_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off", "", "none"})

Role = Literal["computed", "waited", "hit", "unreserved"]
OperatorT = TypeVar("OperatorT", bound=BaseOperator)


def task_owner(context: Context) -> str:
    """The lease owner of a task: the logical task, without the try number, so retries re-enter."""
    ti = context["ti"]
    return f"{ti.dag_id}/{ti.run_id}/{ti.task_id}/{ti.map_index}"


class ReservedOperatorMixin(BaseOperator):
    """Reserve the work of an operator: put this class *before* the operator in the bases.

    ::

        class ReservedBashOperator(ReservedOperatorMixin, BashOperator):
            template_fields = (*BashOperator.template_fields, "reservation_key")

    (which is what :func:`reserved_operator` does for you). The operator's ``execute`` runs only when
    this task acquires the key; its return value is stored as the artifact (JSON by default, so it must
    be JSON-serializable) and returned to every run that shares the key.

    :param reservation_key: the key name (templated, e.g. ``"features-{{ ds }}"``). Default: the
        operator's class, ``reservation_version`` and a canonical digest of its rendered template
        fields (see :meth:`default_reservation_key`).
    :param dibs_conn_id: the ``dibs`` connection (default ``dibs_default``).
    :param reservation_namespace: overrides the connection's namespace.
    :param reservation_ttl: lease ttl in seconds; overrides the connection's.
    :param reservation_version: part of the default key. For an operator class it is the only trace
        of the code (the wrapped operator's code is a library's): bump it when the result would change.
    :param reservation_wait_timeout: seconds to wait for another run's lease before failing with
        :class:`dibs.WaitTimeout`; default: the connection's, else as long as the holder's lease lives.
    :param reservation_deferrable: defer while another run holds the key (default); ``False`` waits in
        the worker.
    :param reservation_max_age: seconds after which a stored result is too old: the next run computes
        it again (under the lease: its waiters share the new value). Default: the connection's
        ``max_age``, else results never expire.
    :param reservation_refresh: compute again even if a result is stored (templated: a bool, or text
        such as ``"{{ params.refresh }}"`` that renders to true/false). Concurrent refreshes compute once.

    Parameter names carry a ``reservation_`` prefix so they never collide with the wrapped operator's
    own (many operators have a ``key`` or a ``deferrable``).
    """

    template_fields: Sequence[str] = ("reservation_key", "reservation_refresh")

    #: The task instance's "Reservation" button: its key on the provider's Reservations page.
    operator_extra_links = (ReservationLink(),)
    #: A derived key is known only at run time: the task records it in its rendered fields (Airflow
    #: writes them again when the task process ends, a deferral included), so a waiting task shows
    #: its key where users look, instead of ``reservation_key: null``.
    overwrite_rtif_after_execution: bool = True

    #: The key this task derived and put in ``reservation_key``, so a later call derives it again.
    _derived_key: str | None = None

    #: The lease of the work running now, for :meth:`on_kill` (``None`` while nothing runs).
    _dibs_lease: HeldLease | None = None

    def __init__(
        self,
        *,
        reservation_key: str | None = None,
        dibs_conn_id: str = DEFAULT_CONN_ID,
        reservation_namespace: str | None = None,
        reservation_ttl: float | None = None,
        reservation_version: str | None = None,
        reservation_wait_timeout: float | None = None,
        reservation_deferrable: bool = True,
        reservation_max_age: float | None = None,
        reservation_refresh: bool | str = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.reservation_key = reservation_key
        self.dibs_conn_id = dibs_conn_id
        self.reservation_namespace = reservation_namespace
        self.reservation_ttl = reservation_ttl
        self.reservation_version = reservation_version
        self.reservation_wait_timeout = reservation_wait_timeout
        self.reservation_deferrable = reservation_deferrable
        self.reservation_max_age = validate_seconds(
            "reservation_max_age", reservation_max_age, allow_none=True
        )
        self.reservation_refresh = reservation_refresh

    # -- the key --------------------------------------------------------------------------------------
    def default_reservation_key(self, context: Context) -> str:
        """The key when none is given: ``OperatorClass[@version]/<digest>``, where the digest covers the
        wrapped operator's import path and its rendered template fields.

        Template fields are what Airflow itself treats as an operator's per-run inputs, and they are
        rendered by now, so identical tasks in different DAG runs and DAGs agree on the key. If other
        arguments change the result, set ``reservation_version`` or ``reservation_key``.
        """
        fields = {
            name: getattr(self, name, None)
            for name in self.template_fields
            if name not in _RESERVATION_FIELDS
        }
        identity = _operator_identity(type(self))
        name = identity.rpartition(".")[2]
        try:
            inputs = digest({"operator": identity, "fields": fields}, length=DERIVED_DIGEST_LENGTH)
        except TypeError as exc:
            raise InvalidKey(
                f"{self.task_id}: cannot derive a reservation key from the template fields of {identity} "
                f"({exc}); pass reservation_key='...' (templated) instead",
                name=identity,
            ) from exc
        version = self.reservation_version
        if version is not None and (not isinstance(version, str) or not version or "/" in version):
            raise InvalidKey(
                f"{self.task_id}: reservation_version must be a non-empty string without '/', "
                f"got {version!r}",
                name=repr(version),
            )
        return f"{name}@{version}/{inputs}" if version else f"{name}/{inputs}"

    def resolve_reservation_key(self, context: Context) -> str:
        key = self.reservation_key
        if key is None or key is self._derived_key:  # derived (and shown) by an earlier call: again
            return self.default_reservation_key(context)
        if not isinstance(key, str) or not key.strip():
            raise InvalidKey(
                f"{self.task_id}: reservation_key rendered to {key!r}; it must be a non-empty string "
                "(e.g. 'features-{{ ds }}'), or None for the derived key",
                name=repr(key),
            )
        return key

    def refresh_requested(self) -> bool:
        """``reservation_refresh`` as rendered: a bool, or text Jinja made of one."""
        value = self.reservation_refresh
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ConfigurationError(
            f"{self.task_id}: reservation_refresh rendered to {value!r}; it must be true or false (a bool, "
            "or text such as 'true', 'false', '1', '0', e.g. '{{ params.refresh }}')",
            setting="reservation_refresh",
        )

    # -- what runs when the key is ours ---------------------------------------------------------------
    def execute_reserved(self, context: Context) -> Any:
        """The work: the wrapped operator's ``execute``. Runs only while this task holds the lease."""
        return super().execute(context)

    # -- Airflow entry points -------------------------------------------------------------------------
    def execute(self, context: Context) -> Any:
        return self._reserve(context, None)

    def on_kill(self) -> None:
        """Airflow is stopping this task (mark failed, a stopped run, SIGTERM): if its work holds the key,
        release the lease at once with the failure recorded, so a waiting run takes over now instead of
        after the ttl; then stop the wrapped operator's own work (see :mod:`._stopping`)."""
        lease = self._dibs_lease
        if lease is not None:
            release_killed(lease, self.log)
        super().on_kill()

    def execute_complete(self, context: Context, event: object = None, **_: Any) -> Any:
        """Resume after :class:`ReservationTrigger` fired: return the artifact, or try to reserve again.

        Only ``event`` is used: defer kwargs do not reach this method on every code path.
        """
        ev = parse_event(event)
        waiting = Waiting(
            started=float(ev["wait_started"]),
            deferrals=int(ev["deferrals"]),
            holder=ev.get("holder"),
            min_token=ev.get("min_token"),
        )
        waited = waiting.seconds(time.time())
        if ev["status"] == "timeout":
            # The flow decides, as for every waiter: one more ask, then the timeout (in the one wording
            # of every dibs wait) unless the key was done or freed at the last moment.
            self.log.info("dibs: %s: the wait timeout passed in the triggerer; asking once more", ev["key"])
        elif ev["status"] == "error":
            error = error_from_event(ev)
            if not isinstance(error, StoreUnavailable):
                raise error
            # The triggerer rode the outage out as long as the connection allows: the flow decides now,
            # as for any waiter whose outage outlasted its patience (on_store_unavailable).
            waiting = dataclasses.replace(waiting, unreachable=str(error))
        elif ev["status"] == "done":
            self.log.info(
                "dibs: %s was completed by %s (token %s) while this task waited %.1fs (%d deferral(s))",
                ev["key"],
                ev.get("producer"),
                ev.get("token"),
                waited,
                waiting.deferrals,
            )
        else:
            failure = ev.get("last_failure")
            self.log.info(
                "dibs: %s is free again (%s%s) after %.1fs; asking for the lease",
                ev["key"],
                ev.get("state"),
                f": last holder failed with {failure}" if failure else "",
                waited,
            )
        return self._reserve(context, waiting)

    # -- the flow ----------------------------------------------------------------------------------
    def _hook(self) -> DibsHook:
        return DibsHook(self.dibs_conn_id, namespace=self.reservation_namespace, ttl=self.reservation_ttl)

    def _reserve(self, context: Context, waiting: Waiting | None) -> Any:
        """Drive the core's compute-once flow (:mod:`dibs.flow`): the wait step defers, the events
        become this task's log lines and its ``dibs_outcome`` XCom."""
        name = self.resolve_reservation_key(context)
        if name is not self.reservation_key:  # derived: shown in the rendered field and the link
            self.reservation_key = self._derived_key = name
        owner = task_owner(context)
        hook = self._hook()
        timeout = (
            self.reservation_wait_timeout if self.reservation_wait_timeout is not None else hook.wait_timeout
        )
        with hook.get_client() as client:
            references = self._returns_references(client)
            narrator = _Narrator(self, context, client)
            call = client.call(
                name,
                owner=owner,
                timeout=timeout,
                max_age=self.reservation_max_age,
                refresh=self.refresh_requested(),
                resume=waiting,
                frontend="airflow",
                observer=narrator,
                clock=time.time,  # a wait resumes on whichever worker runs execute_complete
            )
            try:
                report = call.drive(_TaskSteps(self, context, client, call, hook, unread=references))
            except _Deferral as deferral:
                self.defer(trigger=deferral.trigger, method_name="execute_complete")
            if narrator.outcome is not None:
                # Pushed here, not from the observer: observers' errors are only logged, and a task
                # whose XCom could not be pushed must fail as any Airflow task would.
                context["ti"].xcom_push(key=OUTCOME_XCOM_KEY, value=narrator.outcome)
            if not references:
                return report.value
            return self._returned(client, client.key(name), report.value, report.token)

    def _returns_references(self, client: Reservations) -> bool:
        """Whether this task returns (as its ``return_value`` XCom) a reference to a value that lives in
        the payload store (:mod:`dibs_provider.xcom`) instead of the value, so the XCom never carries a
        payload, and a hit never loads one.

        Only where every reader gets the value back: the configured XCom backend resolves references
        (:class:`~dibs_provider.xcom.DibsXComBackend`), and Airflow does not look inside the value
        itself, as it does to expand mapped tasks over it (its length) or to push ``multiple_outputs``
        (its keys). Anywhere else a reference would reach a downstream task silently as a dict.
        """
        return (
            isinstance(client.store, ReferencingStore)
            and not getattr(self, "multiple_outputs", False)
            and not self._maps_dependants()
            and xcom.backend_resolves_references()
        )

    def _returned(self, client: Reservations, key: Key, value: Any, token: int | None) -> Any:
        """The reference to ``value`` (see :meth:`_returns_references`), when it lives in the payload
        store; else the value. A hit's value is the artifact itself, unread (:class:`_TaskSteps`)."""
        if isinstance(value, ReferencedArtifact):
            return xcom.reference(self.dibs_conn_id, key, value)
        if token is None:
            return value
        try:
            artifact = client.status(key).artifact
        except ReservationError:  # the value is in hand: a store hiccup only costs the reference
            return value
        if artifact is None or artifact.fence != token:
            return value  # replaced meanwhile: the value this task got is what it hands on
        found = xcom.reference(self.dibs_conn_id, key, artifact)
        return value if found is None else found

    def _maps_dependants(self) -> bool:
        """Whether a downstream task is mapped over this task's value (``.expand(x=this())``)."""
        try:
            return next(iter(self.iter_mapped_dependants()), None) is not None
        except Exception:  # no DAG (a bare operator in a test): nothing is mapped over it
            return False


class _Deferral(Suspend):
    """The flow's wait step, as this task's deferral to :class:`ReservationTrigger`."""

    def __init__(self, waiting: Waiting, trigger: ReservationTrigger) -> None:
        super().__init__(waiting)
        self.trigger = trigger


class _TaskSteps(StoreIO):
    """How a reserved task does the flow's steps: it defers at the wait (unless not deferrable), and
    holds the lease where ``on_kill`` can free the key at once (a :class:`~dibs.integration.HeldLease`).
    A task that returns references asks through the store's unread twin: a hit of a payload is the
    artifact itself, only checked to be there whole (its size), never loaded here; the downstream
    reader checks its digest as it reads it."""

    client: Reservations

    def __init__(
        self,
        operator: ReservedOperatorMixin,
        context: Context,
        client: Reservations,
        call: Call,
        hook: DibsHook,
        *,
        unread: bool = False,
    ) -> None:
        super().__init__(
            client,
            self._work,
            emit=call.emitter,
            failure_of=_failure_of,
            logger=operator.log,
            store=_unread(client.store) if unread else None,
        )
        self.operator, self.context, self.hook = operator, context, hook

    def found(self, step: Found) -> Hit:
        hit = unread_hit(step.key, step.artifact)  # a payload, unread: returned as a reference to it
        return hit if hit is not None else super().found(step)

    def wait(self, step: Wait) -> None:
        op, busy = self.operator, step.busy
        if op.reservation_deferrable:
            trigger = ReservationTrigger(
                busy.key.name,
                namespace=busy.key.namespace,
                dibs_conn_id=op.dibs_conn_id,
                timeout=step.timeout,
                holder=busy.holder,
                wait_started=step.waiting.started,
                deferrals=step.waiting.deferrals + 1,
                max_age=op.reservation_max_age,
                min_token=step.waiting.min_token,
                connection=self.hook.for_trigger(),  # the triggerer need not look it up
            )
            raise _Deferral(step.waiting, trigger)

    @contextlib.contextmanager
    def hold_scope(self, held: HeldLease) -> Iterator[None]:
        # A lease on_kill can end from the task's SIGTERM handler while the work runs (see ._stopping).
        with super().hold_scope(held):
            self.operator._dibs_lease = held
            try:
                yield
            finally:
                self.operator._dibs_lease = None

    def work(self, step: Work) -> Any:
        return self._work()

    def run_unreserved(self, step: RunUnreserved) -> Any:
        return self.operator.execute_reserved(self.context)

    def _work(self) -> Any:
        try:
            return self.operator.execute_reserved(self.context)
        except TaskDeferred:
            key = self.client.key(self.operator.resolve_reservation_key(self.context))
            raise ConfigurationError(
                f"{self.operator.task_id}: the wrapped operator deferred while holding the lease on {key}; "
                "a reserved operator must finish its work in execute(): turn its own deferrable mode "
                "off (e.g. deferrable=False)",
                key=str(key),
            ) from None


class _Narrator:
    """The flow's events in a reserved task's words: its log lines, and the ``dibs_outcome`` XCom
    (which the task pushes after the call)."""

    def __init__(self, operator: ReservedOperatorMixin, context: Context, client: Reservations) -> None:
        self.operator, self.context, self.client = operator, context, client
        self.waited: events.Waited | None = None
        #: The ``dibs_outcome`` XCom, once the call finished with a value (the task pushes it).
        self.outcome: dict[str, Any] | None = None

    def __call__(self, event: events.Event) -> None:
        log = self.operator.log
        if isinstance(event, events.KeyBusy):
            failure = f"; the previous lease failed: {event.last_failure}" if event.last_failure else ""
            how = (
                "deferring until it is done or free, without holding a worker slot"
                if self.operator.reservation_deferrable
                else "waiting in the worker"
            )
            log.info(
                "dibs: %s is held by %s (%s)%s; %s", event.key, event.holder, _holding(event), failure, how
            )
        elif isinstance(event, events.Waited):
            self.waited = event
        elif isinstance(event, events.ArtifactFound):
            if not event.waited:
                log.info(
                    "dibs: %s was already computed by %s (token %s); returning its artifact, running nothing",
                    event.key,
                    event.producer,
                    event.token,
                )
            else:
                waited = self.waited
                log.info(
                    "dibs: using the artifact of %s stored by %s (token %s) after waiting %.1fs on %s",
                    event.key,
                    event.producer,
                    event.token,
                    0.0 if waited is None else waited.seconds,
                    None if waited is None else waited.holder,
                )
        elif isinstance(event, events.LeaseAcquired):
            self._acquired(event)
        elif isinstance(event, events.StoreUnreachable):
            log.warning(
                "dibs: the store is unreachable (%s); %s holds nothing, so it keeps waiting for the store "
                "(outage_patience: %s)",
                event.error,
                self.operator.task_id,
                "as long as the wait may last" if event.patience is None else f"{event.patience:g}s",
            )
        elif isinstance(event, events.StoreReachable):
            log.info("dibs: the store answers again after %.1fs; waiting on", event.seconds)
        elif isinstance(event, events.RanUnreserved):
            log.warning(
                "dibs: the store is unavailable for %s; running the work unreserved (on_store_unavailable "
                "'run'): other runs may compute it too, and the result is not stored: %s",
                event.key,
                event.error,
            )
        elif isinstance(event, events.Finished):
            self._finished(event)

    def _acquired(self, event: events.LeaseAcquired) -> None:
        log, max_lease_age = self.operator.log, self.client.max_lease_age
        if event.took_over_from:
            log.warning(
                "dibs: took over %s from %s, whose lease had expired: it was not renewed in time (a crashed "
                "or stalled worker)%s (token %s)",
                event.key,
                event.took_over_from,
                "" if max_lease_age is None else f" or it reached max_lease_age ({max_lease_age:g}s)",
                event.token,
            )
        if event.last_failure is not None:
            log.info(
                "dibs: %s %s",
                event.key,
                last_failure(event.failures, event.last_failure_owner, event.last_failure),
            )
        log.info("dibs: acquired %s as %s (token %s); running the work", event.key, event.owner, event.token)

    def _finished(self, event: events.Finished) -> None:
        if event.outcome == "failed":
            if event.error_type == "StoreUnavailable" and event.token is None:
                self.operator.log.error(
                    "dibs: the store is unavailable for %s, not running the work (on_store_unavailable "
                    "'fail'): %s",
                    event.key,
                    event.error,
                )
            return
        role = "computed" if event.outcome == "took_over" else event.outcome
        outcome: dict[str, Any] = {
            "role": role,
            "key": str(event.key),
            "owner": event.owner,
            "waited_on": event.waited_on,
            "waited_seconds": round(event.waited_seconds, 3),
            "deferrals": event.deferrals,
            "token": event.token,
            "producer": event.producer,
            "stored": event.stored,
        }
        if role == "computed":
            outcome["took_over_from"] = event.took_over_from
        self.outcome = outcome


def _holding(busy: events.KeyBusy) -> str:
    """How long the holder's lease runs, said so that it is not read as Airflow's try number."""
    return f"lease attempt {busy.attempt} on this key, expires in {busy.expires_in:.1f}s unless renewed"


def _unread(store: Any) -> Any:
    """The store a task that returns references asks through (see :class:`_TaskSteps`)."""
    return unread(store, "size")


def _failure_of(exc: BaseException) -> str | None:
    """How a task's exception is recorded on its key: skipping is no failure (it is not counted)."""
    return None if isinstance(exc, AirflowSkipException) else failure_text(exc)


def _operator_identity(cls: type) -> str:
    """The class a reserved operator wraps (``airflow.providers.standard.operators.bash.BashOperator``)."""
    for base in cls.__mro__:
        if not issubclass(base, ReservedOperatorMixin):
            return f"{base.__module__}.{base.__qualname__}"
    return f"{cls.__module__}.{cls.__qualname__}"  # pragma: no cover - the mixin alone


# Context entries that are handles to the running task, not inputs to its work: never part of a key.
_CONTEXT_HANDLES = frozenset(
    {
        "ti",
        "task_instance",
        "dag_run",
        "dag",
        "task",
        "conf",
        "macros",
        "var",
        "conn",
        "inlets",
        "outlets",
        "inlet_events",
        "outlet_events",
        "triggering_asset_events",
        "task_state_store",
        "asset_state_store",
        "test_mode",
    }
)


def _is_data(name: str, value: Any) -> bool:
    if name in _CONTEXT_HANDLES:
        return False
    try:
        canonical_json(value)
    except Exception:  # TypeError for foreign objects; pydantic models can fail in their own ways
        return False
    return True


class ReservedPythonOperator(ReservedOperatorMixin, PythonOperator):
    """A :class:`PythonOperator` whose callable runs once per key (see :class:`ReservedOperatorMixin`).

    The default key is the callable's identity, ``reservation_version`` and a canonical digest of its
    arguments (:func:`dibs.keys.derive_key`): ``op_args``, ``op_kwargs`` and the context values the
    callable declares as parameters when they are data (``ds``, ``logical_date``, ``params``,
    ``templates_dict``...). Handles such as ``ti`` or ``dag_run`` are not inputs and are left out, as are
    the names in ``reservation_exclude``. A callable taking ``**context`` gets only its explicit arguments
    digested.

    :param reservation_exclude: parameter names to leave out of the default key (clients, loggers, run ids).
    """

    template_fields: Sequence[str] = (
        *PythonOperator.template_fields,
        "reservation_key",
        "reservation_refresh",
    )

    def __init__(self, *, reservation_exclude: Sequence[str] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reservation_exclude = tuple(reservation_exclude)

    def default_reservation_key(self, context: Context) -> str:
        fn: Callable[..., Any] = self.python_callable
        kwargs = dict(self.op_kwargs)
        exclude = list(self.reservation_exclude)
        try:
            parameters = inspect.signature(fn).parameters
        except (TypeError, ValueError):  # builtins without a signature
            parameters = {}  # type: ignore[assignment]
        positional = list(parameters)[: len(self.op_args)]
        available: Mapping[str, Any] = {**context, "templates_dict": self.templates_dict}
        for name, parameter in parameters.items():
            if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                continue
            if name in kwargs or name in positional:
                continue
            if name not in KNOWN_CONTEXT_KEYS and name != "templates_dict":
                continue
            value = available.get(name)
            dump = getattr(value, "dump", None)  # ParamsDict: its resolved values, not Param objects
            if callable(dump):
                value = dump()
            if _is_data(name, value):
                kwargs[name] = value
            else:
                kwargs[name] = None  # a handle (ti, dag_run...): bound for the signature, then excluded
                exclude.append(name)
        try:
            return derive_key(
                fn, tuple(self.op_args), kwargs, version=self.reservation_version, exclude=tuple(exclude)
            )
        except InvalidKey as exc:  # the core says what could not be digested; say which task it was
            raise InvalidKey(
                f"{self.task_id}: {exc.message} (in Airflow: reservation_key=, reservation_version= and "
                "reservation_exclude=)",
                **exc.fields,
            ) from exc


@functools.cache
def reserved_operator(operator_class: type[OperatorT]) -> type[ReservedOperatorMixin]:
    """The reserved variant of any operator class: ``reserved_operator(BashOperator)(task_id=..., ...)``.

    The new class takes the operator's own arguments plus the ``reservation_*`` ones of
    :class:`ReservedOperatorMixin`, and ``reservation_key`` is templated alongside the operator's fields.
    The same class is returned for the same operator, so DAG files can call this freely.
    """
    if not (isinstance(operator_class, type) and issubclass(operator_class, BaseOperator)):
        raise ConfigurationError(f"reserved_operator() takes an operator class, got {operator_class!r}")
    if issubclass(operator_class, ReservedOperatorMixin):
        return operator_class
    name = f"Reserved{operator_class.__name__}"
    namespace = {
        "__module__": __name__,
        "__qualname__": name,
        "__doc__": f"{operator_class.__name__}, reserved with dibs (see ReservedOperatorMixin).",
        "template_fields": (*operator_class.template_fields, "reservation_key", "reservation_refresh"),
        "operator_extra_links": (*operator_class.operator_extra_links, ReservationLink()),
    }
    # new_class picks Airflow's operator metaclass from the bases, as a class statement would.
    reserved = types.new_class(
        name, (ReservedOperatorMixin, operator_class), exec_body=lambda ns: ns.update(namespace)
    )
    return cast("type[ReservedOperatorMixin]", reserved)

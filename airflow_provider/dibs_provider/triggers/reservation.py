"""What a busy reserved task defers to: watch a key in the triggerer until it is worth asking again.

A task that finds another run holding its key does not keep a worker slot while it waits. It defers
to :class:`ReservationTrigger`, which watches the key with the core's async waiting loop
(:meth:`dibs.AsyncReservations.wait`: capped backoff with jitter, woken at once by stores that notify)
and fires exactly one event:

==========  =========================================================================================
status      meaning; what the resumed task does
==========  =========================================================================================
``done``    the artifact exists; the task reads it and returns it (no work)
``free``    nobody holds the key any more (released with a failure, or the holder's lease expired);
            the task asks again and runs the work itself if it wins, or defers again if not
``timeout`` the waiter's own timeout passed while the key was still held; the task asks once more
            and fails with :class:`dibs.WaitTimeout` unless the key was done or freed meanwhile
``error``   the store failed or the key is unusable: the matching :mod:`dibs.errors` exception (a
            store that cannot be reached is waited for first, for the connection's
            ``outage_patience``: a routine restart or a managed failover fails no deferred task)
==========  =========================================================================================

Events are plain JSON (they are stored in Airflow's database) and typed: errors travel as their dibs
class name, message and fields, and :func:`error_from_event` rebuilds the same exception in the task.
The artifact itself never travels in an event (it may be large), and the triggerer never loads it
either: the trigger waits for the artifact's record only (``wait(decode=False)``), so a payload kept
in a payload store is at most asked about (is it there, with its recorded size?), never opened, in
this long-lived process shared by thousands of triggers. The resumed task reads the value from the
store (or hands on a reference to it, see :mod:`dibs_provider.xcom`).

The trigger also echoes ``wait_started`` and ``deferrals`` from its own arguments, because the task
cannot rely on ``defer(kwargs=...)`` reaching it on every code path (``dag.test()`` drops them).

What a triggerer's first deferral waits for, and why none of it is here any more:

* The task hands the trigger its ``dibs`` connection as it read it (``connection``, see
  :meth:`DibsHook.for_trigger`): a trigger that looks a connection of the metadata database up is
  answered by Airflow's in-process execution API, which the triggerer builds on its first such
  request, blocking its loop for seconds (docs/airflow.md has the reproduction).
* Airflow imports a trigger's class on the triggerer's event loop: this module imports nothing of
  dibs's at its top (importing dibs takes a few tenths of a second); ``run`` imports what it needs
  on a thread, once per process, while the loop serves the other triggers.
"""

from __future__ import annotations

import asyncio
import importlib
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, NotRequired, TypedDict

from airflow.triggers.base import BaseTrigger, TriggerEvent

if TYPE_CHECKING:
    from dibs.errors import ReservationError
    from dibs.records import KeyState

__all__ = ["ReservationEvent", "ReservationTrigger", "error_from_event", "parse_event"]

EventStatus = Literal["done", "free", "timeout", "error"]
_STATUSES: frozenset[str] = frozenset({"done", "free", "timeout", "error"})


class ReservationEvent(TypedDict):
    """The payload of every event :class:`ReservationTrigger` fires."""

    status: EventStatus
    key: str
    holder: str | None
    """The holder the task deferred on (for logs)."""
    waited_seconds: float
    """How long this trigger watched the key."""
    wait_started: float
    """Unix time the task first found the key busy (echoed from the trigger's arguments)."""
    deferrals: int
    """How many times this task has deferred on the key, this time included (echoed)."""
    min_token: NotRequired[int | None]
    """A refresh waits for the artifact of this fencing token or a later one (echoed)."""
    token: NotRequired[int]
    """``done``: the fencing token of the lease that stored the artifact."""
    producer: NotRequired[str]
    """``done``: the owner that stored the artifact."""
    state: NotRequired[str]
    """``free``: what the key looked like, ``free``, ``expired`` or ``failed``."""
    last_failure: NotRequired[str | None]
    """``free``: the error the last holder released the key with, if it failed."""
    error_type: NotRequired[str]
    """``timeout``/``error``: the :mod:`dibs.errors` class name."""
    message: NotRequired[str]
    fields: NotRequired[dict[str, Any]]


class ReservationTrigger(BaseTrigger):
    """Fire once the key's artifact exists, or (unless ``for_artifact``) once nobody holds the key.

    :param key: the key name (in ``namespace``).
    :param namespace: the key's namespace; default: the connection's.
    :param dibs_conn_id: the ``dibs`` connection.
    :param for_artifact: only an artifact ends the wait (what :class:`ReservationSensor` wants); a freed
        or expired lease does not.
    :param timeout: seconds to watch before firing ``timeout``; ``None`` watches until the key changes.
    :param holder: the holder the task saw, echoed in the event for its logs.
    :param wait_started: Unix time the task first found the key busy (echoed).
    :param deferrals: how many times the task has deferred on this key, this time included (echoed).
    :param max_age: an artifact this old (seconds, store clock) does not end the wait.
    :param min_token: only an artifact stored under this fencing token or a later one ends the wait
        (a refresh waits for the result of the lease it found busy, not the artifact it replaces); echoed.
    :param connection: the ``dibs`` connection as the task read it (``{}``: there is none by that id),
        so the triggerer does not look it up (:meth:`DibsHook.for_trigger`); ``None``: look it up.
        Airflow keeps a trigger's arguments encrypted, and out of its API since 3.3.
    """

    def __init__(
        self,
        key: str,
        *,
        namespace: str | None = None,
        dibs_conn_id: str = "dibs_default",  # DibsHook's default (not imported: see the module docstring)
        for_artifact: bool = False,
        timeout: float | None = None,
        holder: str | None = None,
        wait_started: float | None = None,
        deferrals: int = 1,
        max_age: float | None = None,
        min_token: int | None = None,
        connection: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.key = key
        self.namespace = namespace
        self.dibs_conn_id = dibs_conn_id
        self.for_artifact = for_artifact
        self.timeout = timeout
        self.holder = holder
        self.wait_started = time.time() if wait_started is None else wait_started
        self.deferrals = deferrals
        self.max_age = max_age
        self.min_token = min_token
        self.connection = connection

    def __repr__(self) -> str:
        # Airflow's shows every argument: not the connection (it may hold a password).
        classpath, kwargs = self.serialize()
        if kwargs.get("connection"):
            kwargs["connection"] = "<as its task read it>"
        return str(self.repr(classpath, kwargs))

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "key": self.key,
                "namespace": self.namespace,
                "dibs_conn_id": self.dibs_conn_id,
                "for_artifact": self.for_artifact,
                "timeout": self.timeout,
                "holder": self.holder,
                "wait_started": self.wait_started,
                "deferrals": self.deferrals,
                "max_age": self.max_age,
                "min_token": self.min_token,
                "connection": self.connection,
            },
        )

    def _event(self, status: EventStatus, key: str, started: float, **details: Any) -> TriggerEvent:
        payload: dict[str, Any] = {
            "status": status,
            "key": key,
            "holder": self.holder,
            "waited_seconds": round(time.monotonic() - started, 3),
            "wait_started": self.wait_started,
            "deferrals": self.deferrals,
            "min_token": self.min_token,
            **details,
        }
        return TriggerEvent(payload)  # type: ignore[no-untyped-call]

    async def run(self) -> AsyncIterator[TriggerEvent]:
        started = time.monotonic()
        key = self.key
        dibs = await _dibs()
        try:
            # The hook is only needed for the client: not kept while the trigger waits (a thousand
            # waiting triggers keep as little as they can alive, issue 20).
            hook = dibs.DibsHook(self.dibs_conn_id, namespace=self.namespace)
            client = await hook.aget_client(self.connection)
            try:
                watched = client.client.key(self.key)  # validated once, and given to the wait as is
                key = str(watched)
                holders = _HolderLog(self.log, key, hook.store_described)
                hit = await client.wait(
                    watched,
                    timeout=self.timeout,
                    for_artifact=self.for_artifact,
                    max_age=self.max_age,
                    min_token=self.min_token,
                    decode=False,  # the record only: the task reads the value, never the triggerer
                    resumed=True,  # the task reached the store before it deferred: ride an outage out
                    seen=holders,
                )
                state = None if hit is not None else holders.last  # the state that ended the wait
            finally:
                await hook.aclose(client)
        except dibs.WaitTimeout as exc:
            yield self._event("timeout", key, started, **_error_details(exc))
            return
        except dibs.ReservationError as exc:
            self.log.warning("watching %s failed: %s: %s", key, type(exc).__name__, exc)
            yield self._event("error", key, started, **_error_details(exc))
            return
        if hit is not None:
            yield self._event("done", key, started, token=hit.token, producer=hit.producer)
            return
        assert state is not None
        yield self._event(
            "free",
            key,
            started,
            state=state.status,
            last_failure=state.failure.error if state.failure is not None else None,
        )


#: The module the trigger runs with (:mod:`._dibs`), once imported; the import under way, per loop.
_LOADED: dict[str, ModuleType] = {}
_IMPORTING: dict[asyncio.AbstractEventLoop, asyncio.Future[ModuleType]] = {}
_MODULE = "dibs_provider.triggers._dibs"


def _import() -> ModuleType:
    module = _LOADED[_MODULE] = importlib.import_module(_MODULE)  # whole: only once it is imported
    return module


async def _dibs() -> ModuleType:
    """The hook's module (dibs with it), imported once per process on a thread: imported on the loop,
    it would hold every other trigger of the triggerer up for as long as it takes. Every trigger that
    starts meanwhile waits for the same import; one that failed is tried again by the next trigger."""
    loaded = _LOADED.get(_MODULE)
    if loaded is not None:
        return loaded
    loop = asyncio.get_running_loop()
    importing = _IMPORTING.get(loop)
    if importing is None:
        importing = _IMPORTING[loop] = loop.run_in_executor(None, _import)
        importing.add_done_callback(lambda _: _IMPORTING.pop(loop, None))
    return await asyncio.shield(importing)


class _HolderLog:
    """The trigger's log of what it waits on: the key, its holder and when the holder's lease expires,
    said once at the start and again whenever another lease holds the key (a takeover, a new holder
    after a failure), so the triggerer's log of a deferred task names the run it waits for."""

    def __init__(self, log: Any, key: str, store: str = "") -> None:
        self.log, self.key = log, key
        #: The store, named in the first line only: settings parsed once for every trigger that starts
        #: with them are logged once, in the first trigger's log (the hook's ``aget_settings``).
        self.store = store
        self.holder: tuple[str, int] | None = None
        self.started = False
        #: The last state seen: the one that ended the wait.
        self.last: KeyState | None = None

    def __call__(self, state: KeyState) -> None:
        self.last = state
        lease = state.live_lease
        holder = None if lease is None else (lease.owner, int(lease.token.fence))
        if self.started and holder == self.holder:
            return
        first, self.started, self.holder = not self.started, True, holder
        where = f" in {self.store}" if first and self.store else ""
        if lease is None:
            if first:
                self.log.info(
                    "dibs: waiting on %s%s, which nobody holds now (%s)", self.key, where, state.status
                )
            return
        expires = datetime.fromtimestamp(lease.expires_at, tz=UTC).isoformat(timespec="seconds")
        self.log.info(
            "dibs: %s on %s%s, held by %s (token %s); the lease expires at %s (in %.1fs) unless renewed",
            "waiting" if first else "now waiting",
            self.key,
            where,
            lease.owner,
            lease.token.fence,
            expires,
            lease.expires_at - state.now,
        )


def _json_safe(value: Any) -> Any:
    return value if value is None or isinstance(value, str | int | float | bool) else repr(value)


def _error_details(exc: ReservationError) -> dict[str, Any]:
    return {
        "error_type": type(exc).__name__,
        "message": exc.message,
        "fields": {name: _json_safe(value) for name, value in exc.fields.items()},
    }


def parse_event(event: object) -> ReservationEvent:
    """Check that ``event`` is a payload :class:`ReservationTrigger` fired; a clear error otherwise."""
    from dibs.errors import ReservationError

    if (
        not isinstance(event, dict)
        or event.get("status") not in _STATUSES
        or not isinstance(event.get("key"), str)
        or not isinstance(event.get("wait_started"), int | float)
        or not isinstance(event.get("deferrals"), int)
    ):
        raise ReservationError(
            f"a reserved task was resumed with an event that ReservationTrigger did not fire: {event!r}; "
            "clear the task to start it again",
        )
    return event  # type: ignore[return-value]


def error_from_event(event: ReservationEvent) -> ReservationError:
    """The dibs exception a ``timeout`` or ``error`` event stands for, rebuilt with its fields."""
    from dibs import errors
    from dibs.errors import ReservationError

    name = event.get("error_type", "")
    cls = getattr(errors, name, None) if name in errors.__all__ else None
    if not (isinstance(cls, type) and issubclass(cls, ReservationError)):
        cls = ReservationError
    message = event.get("message") or f"waiting for {event['key']} failed ({name or 'no error type'})"
    return cls(message, **(event.get("fields") or {}))

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
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, Literal, NotRequired, TypedDict

from airflow.triggers.base import BaseTrigger, TriggerEvent

from dibs import errors
from dibs.errors import ReservationError, WaitTimeout
from dibs.records import KeyState
from dibs_provider.hooks.dibs import DEFAULT_CONN_ID, DibsHook

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
    """

    def __init__(
        self,
        key: str,
        *,
        namespace: str | None = None,
        dibs_conn_id: str = DEFAULT_CONN_ID,
        for_artifact: bool = False,
        timeout: float | None = None,
        holder: str | None = None,
        wait_started: float | None = None,
        deferrals: int = 1,
        max_age: float | None = None,
        min_token: int | None = None,
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
        try:
            # The hook is only needed for the client: not kept while the trigger waits (a thousand
            # waiting triggers keep as little as they can alive, issue 20).
            client = await DibsHook(self.dibs_conn_id, namespace=self.namespace).aget_client()
            try:
                watched = client.client.key(self.key)  # validated once, and given to the wait as is
                key = str(watched)
                holders = _HolderLog(self.log, key)
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
                await DibsHook.aclose(client)
        except WaitTimeout as exc:
            yield self._event("timeout", key, started, **_error_details(exc))
            return
        except ReservationError as exc:
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


class _HolderLog:
    """The trigger's log of what it waits on: the key, its holder and when the holder's lease expires,
    said once at the start and again whenever another lease holds the key (a takeover, a new holder
    after a failure), so the triggerer's log of a deferred task names the run it waits for."""

    def __init__(self, log: Any, key: str) -> None:
        self.log, self.key = log, key
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
        if lease is None:
            if first:
                self.log.info("dibs: waiting on %s, which nobody holds now (%s)", self.key, state.status)
            return
        expires = datetime.fromtimestamp(lease.expires_at, tz=UTC).isoformat(timespec="seconds")
        self.log.info(
            "dibs: %s on %s, held by %s (token %s); the lease expires at %s (in %.1fs) unless renewed",
            "waiting" if first else "now waiting",
            self.key,
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
    name = event.get("error_type", "")
    cls = getattr(errors, name, None) if name in errors.__all__ else None
    if not (isinstance(cls, type) and issubclass(cls, ReservationError)):
        cls = ReservationError
    message = event.get("message") or f"waiting for {event['key']} failed ({name or 'no error type'})"
    return cls(message, **(event.get("fields") or {}))

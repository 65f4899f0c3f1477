"""dibs's outcomes as Prefect events, so they show in the Prefect UI's event feed and automations can
react to them (``emit_event``, with the flow run and the task run as related resources).

===================================  ========================================================
event                                when
===================================  ========================================================
``dibs.reservation.computed``        a call computed the key's artifact under its lease
                                     (``stored: false`` and ``not_stored``: the value could not
                                     be stored, e.g. its lease was lost meanwhile)
``dibs.reservation.took-over``       a call took the lease over from an expired holder (as it
                                     happens; ``computed`` follows when its work ends)
``dibs.reservation.waited``          a call waited for another holder and used its artifact
``dibs.reservation.hit``             a call found the key's artifact and ran nothing
``dibs.reservation.failed``          a call failed (its work raised, its wait timed out, the
                                     store could not be reached, ...: ``error`` in the payload)
``dibs.reservation.unreserved``      the store could not be reached and the call ran its work
                                     without a lease (``on_store_unavailable="run"``)
``dibs.reservation.lease-lost``      a lease was lost while its work ran (``reason``)
===================================  ========================================================

A ``DibsLockManager`` lock is such a call too: ``computed`` when its task run computed the result
Prefect caches, ``hit`` or ``waited`` when Prefect served the task from its cache once it held the lock.

The resource is the key (``dibs.key.<namespace>/<name>``); the payload says who produced it, the
token, how long the call waited and what compute it was spared. :func:`install` hears every call of
the process that runs inside a Prefect flow or task run (``@reserved`` installs it; so may any code
that calls a :class:`dibs.Reservations` inside a run). Emitting never raises: Prefect's own
``emit_event`` drops what it cannot send, and an error here is logged once.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from dibs import events
from dibs.events import Event
from prefect_dibs import _runs

__all__ = ["PrefectEvents", "install"]

log = logging.getLogger("prefect_dibs")

#: The event each ending of a call emits (a takeover also ends as ``computed``: its own event came
#: when the lease was taken over).
_NAMES = {
    "computed": "dibs.reservation.computed",
    "took_over": "dibs.reservation.computed",
    "waited": "dibs.reservation.waited",
    "hit": "dibs.reservation.hit",
    "failed": "dibs.reservation.failed",
    "unreserved": "dibs.reservation.unreserved",
}


class PrefectEvents:
    """An observer (see :mod:`dibs.events`) that emits Prefect events for calls inside Prefect runs."""

    kinds = frozenset(
        {
            events.Asked,
            events.ArtifactFound,
            events.LeaseAcquired,
            events.LostLease,
            events.NotStored,
            events.Finished,
        }
    )

    def __init__(self) -> None:
        # Per call: the runs it belongs to (read when it asks: a lease lost is heard on the heartbeat
        # thread, outside the run's context) and what the artifact it used saved.
        self._calls: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._complained = False

    def __call__(self, event: Event) -> None:
        try:
            self._hear(event)
        except Exception:
            if not self._complained:
                self._complained = True
                log.warning("dibs: emitting a Prefect event failed; not logged again", exc_info=True)

    def _hear(self, event: Event) -> None:
        if isinstance(event, events.Asked):
            related = _related()
            if related:
                with self._lock:
                    self._calls[event.call] = {"related": related}
            return
        with self._lock:
            call = (
                self._calls.pop(event.call, None)
                if isinstance(event, events.Finished)
                else self._calls.get(event.call)
            )
        if call is None:
            return  # not inside a Prefect run (or asked before this observer was installed)
        if isinstance(event, events.ArtifactFound):
            call["compute_seconds"] = event.compute_seconds
        elif isinstance(event, events.NotStored):
            call["not_stored"] = event.reason
        elif isinstance(event, events.LeaseAcquired):
            if event.took_over_from is not None:  # said as it happens, not when the work ends
                payload = {
                    "token": event.token,
                    "owner": event.owner,
                    "took_over_from": event.took_over_from,
                    "expired_by": event.expired_by,
                }
                _emit("dibs.reservation.took-over", event, call, payload)
        elif isinstance(event, events.LostLease):
            _emit(
                "dibs.reservation.lease-lost",
                event,
                call,
                {"token": event.token, "reason": event.reason, "error": event.error},
            )
        elif isinstance(event, events.Finished) and event.outcome in _NAMES:
            payload = {
                "outcome": event.outcome,
                "token": event.token,
                "producer": event.producer,
                "owner": event.owner,
                "waited_on": event.waited_on,
                "took_over_from": event.took_over_from,
                "waited_seconds": round(event.waited_seconds, 3),
                "seconds": round(event.seconds, 3),
                "compute_seconds_saved": call.get("compute_seconds")
                if event.outcome in ("waited", "hit")
                else None,
                "store": event.store,
                "frontend": event.frontend,
            }
            if event.outcome in ("computed", "took_over"):
                payload["stored"] = event.stored
                payload["not_stored"] = call.get("not_stored")
            elif event.outcome == "failed":
                payload.update(error=event.error, error_type=event.error_type)
            _emit(_NAMES[event.outcome], event, call, payload)


def _related() -> list[dict[str, str]]:
    """The flow run and task run this call runs in, as Prefect's related resources."""
    related = []
    task_ctx = _runs.task_run_context()
    flow_ctx = _runs.flow_run_context()
    flow_run = getattr(flow_ctx, "flow_run", None)
    task_run = getattr(task_ctx, "task_run", None)
    if flow_run is None and task_run is not None and getattr(task_run, "flow_run_id", None) is not None:
        related.append(
            {
                "prefect.resource.id": f"prefect.flow-run.{task_run.flow_run_id}",
                "prefect.resource.role": "flow-run",
            }
        )
    if flow_run is not None:
        related.append(
            {
                "prefect.resource.id": f"prefect.flow-run.{flow_run.id}",
                "prefect.resource.role": "flow-run",
                "prefect.resource.name": str(flow_run.name),
            }
        )
    if task_run is not None:
        related.append(
            {
                "prefect.resource.id": f"prefect.task-run.{task_run.id}",
                "prefect.resource.role": "task-run",
                "prefect.resource.name": str(task_run.name),
            }
        )
    return related


def _emit(name: str, event: Event, call: dict[str, Any], payload: dict[str, Any]) -> None:
    from prefect.events import emit_event

    key = str(event.key)
    emit_event(
        event=name,
        resource={
            "prefect.resource.id": f"dibs.key.{key}",
            "prefect.resource.name": key,
            "dibs.namespace": event.key.namespace,
        },
        related=call["related"],
        payload={name: value for name, value in payload.items() if value is not None},
    )


def install() -> None:
    """Emit Prefect events for every call of this process made inside a Prefect run (once)."""
    events.observe_once(PrefectEvents)

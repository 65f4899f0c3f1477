"""What a reserved task or a lock knows about the Prefect run it is part of: its owner identity, its
logger, and how it shows that it is waiting.

Owners. A ``@reserved`` task's lease is owned by its task run (:func:`task_run_owner`). A lock of
:class:`~prefect_dibs.DibsLockManager` must stay Prefect's ``holder`` (Prefect releases and checks it
by holder), but a random holder id means nothing to a person: its owner is the run taking the lock
*and* the holder (:func:`lock_owner`), and :func:`lock_holder` gives the holder back.

Showing the wait. Prefect 3 runs task state changes client-side: the task engine keeps the task
run's state in memory and *emits* a ``prefect.task-run.<State name>`` event per change, which the
server records (``task_run_recorder``); it does not propose them to the API. A task that waits for
another run's lease therefore records a ``Running`` state named ``"Waiting"`` the same way the
engine does (``emit_task_run_state_change_event``) and updates the in-memory task run, so that the
engine's next state (``Completed``, ``Failed``) follows it in order. The type stays ``RUNNING``, as
Prefect's own ``Retrying`` does: the run is alive and will continue by itself; only its name says
what it is doing, and its message says on whom it waits. The server keeps the latest state by
timestamp, so the event needs no ``follows`` link to land in the right place.

All of this is best effort: failing to show a state never fails the task (the contract's "the
reservation machinery never changes a result").
"""

from __future__ import annotations

import logging
import re
from typing import Any

__all__ = [
    "FLOW_OWNER_PREFIX",
    "OWNER_PREFIX",
    "flow_run_context",
    "holder_link",
    "lock_holder",
    "lock_owner",
    "lock_run",
    "mark_state",
    "refresh_cache",
    "run_logger",
    "task_run_context",
    "task_run_owner",
]

log = logging.getLogger("prefect_dibs")

#: Owners of leases taken by Prefect task runs start with this, then the run's name and id.
OWNER_PREFIX = "prefect-task-run:"
#: ... and by flow runs (a lock taken by a flow-level transaction), this.
FLOW_OWNER_PREFIX = "prefect-flow-run:"
_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_RUN = rf"prefect-(?P<kind>task|flow)-run:.*?:(?P<id>{_UUID})"
_OWNER_RE = re.compile(rf"{_RUN}$", re.DOTALL)
#: A lock's owner: the run, ``#``, then Prefect's holder (which may be any text).
_LOCK_OWNER_RE = re.compile(rf"(?P<run>{_RUN})#(?P<holder>.*)$", re.DOTALL)


def task_run_context() -> Any:
    """The current ``TaskRunContext``, or ``None`` outside a task run."""
    from prefect.context import TaskRunContext

    return TaskRunContext.get()


def flow_run_context() -> Any:
    """The current ``FlowRunContext``, or ``None`` outside a flow run."""
    from prefect.context import FlowRunContext

    return FlowRunContext.get()


def task_run_owner(ctx: Any) -> str:
    """The lease owner for a task run: stable across Prefect retries of the run (same id, same name),
    so a retry re-enters its own lease instead of waiting for it to expire."""
    task_run = ctx.task_run
    return f"{OWNER_PREFIX}{task_run.name}:{task_run.id}"


def refresh_cache(ctx: Any) -> bool:
    """Prefect's "do not use cached results" switch for this task run: the task's ``refresh_cache``
    option (``with_options`` included), else the ``PREFECT_TASKS_REFRESH_CACHE`` setting, exactly as
    Prefect's task engine reads it."""
    task = getattr(ctx, "task", None)
    option = getattr(task, "refresh_cache", None)
    if option is not None:
        return bool(option)
    from prefect.settings import PREFECT_TASKS_REFRESH_CACHE

    return bool(PREFECT_TASKS_REFRESH_CACHE.value())


def _run_owner() -> str | None:
    """The task run of this call stack as an owner, else its flow run, else ``None``."""
    ctx = task_run_context()
    if ctx is not None:
        return task_run_owner(ctx)
    flow_ctx = flow_run_context()
    flow_run = getattr(flow_ctx, "flow_run", None)
    if flow_run is None:
        return None
    return f"{FLOW_OWNER_PREFIX}{flow_run.name}:{flow_run.id}"


def lock_owner(holder: str) -> str:
    """The lease owner of a lock Prefect takes for ``holder``: the run taking it, then the holder
    (just the holder outside any run)."""
    run = _run_owner()
    return holder if run is None else f"{run}#{holder}"


def lock_holder(owner: str) -> str:
    """The Prefect holder of a lock owned by ``owner`` (see :func:`lock_owner`)."""
    match = _LOCK_OWNER_RE.match(owner)
    return owner if match is None else match["holder"]


def lock_run(owner: str) -> str:
    """The run that holds a lock owned by ``owner``, as an owner string; the holder if no run took it."""
    match = _LOCK_OWNER_RE.match(owner)
    return owner if match is None else match["run"]


def holder_link(holder: str) -> str:
    """``holder`` for a log line, with a link to the Prefect UI when the holder is a task or flow run."""
    match = _OWNER_RE.match(holder)
    if match is None:
        return repr(holder)
    try:
        from prefect.settings import get_current_settings

        ui_url = get_current_settings().ui_url
    except Exception:  # a link is a courtesy
        ui_url = None
    if not ui_url:
        return repr(holder)
    return f"{holder!r} ({ui_url.rstrip('/')}/runs/{match['kind']}-run/{match['id']})"


def run_logger(ctx: Any) -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
    """The run's logger, whose lines reach the Prefect UI: the task run's (``ctx``), else the flow
    run's (a flow-level transaction, a reserved plain function called by a flow), else the
    ``prefect_dibs`` logger."""
    from prefect.logging import get_run_logger

    if ctx is not None:
        return get_run_logger(ctx)
    flow_ctx = flow_run_context()
    if flow_ctx is None or getattr(flow_ctx, "flow_run", None) is None:
        return log
    return get_run_logger(flow_ctx)


def mark_state(ctx: Any, name: str, message: str | None = None) -> None:
    """Record a ``Running`` state called ``name`` for the current task run (see the module docstring)."""
    if ctx is None:
        return
    try:
        from prefect.states import Running
        from prefect.utilities.engine import emit_task_run_state_change_event

        task_run = ctx.task_run
        last = task_run.state
        new: Any = Running(name=name, message=message)
        new.state_details.task_run_id = task_run.id
        new.state_details.flow_run_id = task_run.flow_run_id
        if last is not None and new.timestamp <= last.timestamp:
            # The server orders a run's states by timestamp; never tie with the previous one.
            from datetime import timedelta

            new.timestamp = last.timestamp + timedelta(microseconds=1)
        emit_task_run_state_change_event(task_run=task_run, initial_state=last, validated_state=new)
        # Keep the engine's in-memory run consistent: it builds its next event from these fields and
        # adds the time since the last Running state to total_run_time.
        if last is not None and last.is_running():
            task_run.total_run_time += new.timestamp - last.timestamp
        task_run.state = new
        task_run.state_id = new.id
        task_run.state_type = new.type
        task_run.state_name = new.name
    except Exception as exc:  # best effort: see the module docstring
        log.debug("could not record the %r state of this task run: %s", name, exc)

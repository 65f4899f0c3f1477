"""A reserved task that used a stored artifact ends ``Cached``, as Prefect's own cache shows a hit.

Prefect's task engine names a run's final ``Completed`` state ``"Cached"`` when the value came from its
cache (``task_engine.py``, ``handle_success``: ``terminal_state.name = "Cached"``), and the UI shows
it so. A reserved task that ran nothing, because the key's artifact existed (a hit) or another run
computed it while this one waited, is the same thing for whoever looks at the run.

The engine offers one public way for a task to choose its final state: the task function returns a
``State`` (``return_value_to_state``: a state the function built is used as the run's state, with its
data stored like any result). So on a hit, the reserved function returns ``Completed(name="Cached")``
with the value as its data. Futures (``.submit()``, ``.map()``) and ``return_state=True`` then hand
the caller the value or the state as for any task; only a direct call would hand back the state
itself (the engine returns what the function returned), so :class:`ReservedTask` unwraps that one
case. A reserved function returns a state only when it runs as the task function of a
:class:`ReservedTask`; called any other way (``task.fn(...)``, ``@task`` stacked over ``@reserved``, a
plain function) it returns the value.

All of this is best effort, like :mod:`prefect_dibs._runs`: if Prefect ever refuses, the task returns
the plain value and ends ``Completed``.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

from dibs import RunReport
from prefect import Task

__all__ = ["CACHED", "ReservedTask", "adopt", "as_cached", "value_of"]

log = logging.getLogger("prefect_dibs")

#: The name Prefect's task engine gives a ``Completed`` state whose value came from a cache.
CACHED = "Cached"

T = TypeVar("T")


class ReservedTask(Task):  # type: ignore[type-arg]
    """A Prefect ``Task`` whose function is reserved: a direct call returns the value even when the run
    ended ``Cached`` (see the module docstring). Everything else is Prefect's ``Task``."""

    def __call__(  # type: ignore[override]
        self, *args: Any, return_state: bool = False, wait_for: Any = None, **kwargs: Any
    ) -> Any:
        result = super().__call__(*args, return_state=return_state, wait_for=wait_for, **kwargs)
        if return_state:
            return result
        if inspect.isawaitable(result):
            return _awaited_value(result)
        return value_of(result)

    def with_options(self, *args: Any, **kwargs: Any) -> Any:
        copy = super().with_options(*args, **kwargs)
        if type(copy) is Task:  # Task.with_options builds a plain Task
            copy.__class__ = type(self)
        return copy


async def _awaited_value(result: Awaitable[Any]) -> Any:
    return value_of(await result)


def adopt(task: Task) -> None:  # type: ignore[type-arg]
    """Make ``task`` (a copy made for ``@reserved``) a :class:`ReservedTask`, if it is a plain ``Task``.

    Subclasses of ``Task`` (say, asset-materializing tasks) keep their class: their hits end ``Completed``.
    """
    if type(task) is Task:
        task.__class__ = ReservedTask


def as_cached(ctx: Any, reservation: object, report: RunReport, message: str) -> Any:
    """What the reserved function returns for a value it did not compute: a ``Completed`` state named
    ``Cached`` carrying it, when it runs as its :class:`ReservedTask`'s function; else the value."""
    task = getattr(ctx, "task", None)
    if (
        not isinstance(task, ReservedTask)
        or getattr(task.fn, "__dibs_reservation__", None) is not reservation
    ):
        return report.value
    try:
        from prefect.states import Completed

        return Completed(name=CACHED, message=message, data=report.value)
    except Exception as exc:  # best effort: see the module docstring
        log.debug("could not build the Cached state of this task run: %s", exc)
        return report.value


def value_of(result: Any) -> Any:
    """The value a direct call of a :class:`ReservedTask` returns: the data of a ``Cached`` state the
    reserved function returned, else ``result`` as it is."""
    from prefect.client.schemas.objects import State
    from prefect.results import ResultRecord  # type: ignore[attr-defined]  # public name, not in __all__

    if not (isinstance(result, State) and result.name == CACHED and result.is_completed()):
        return result
    data = result.data
    return data.result if isinstance(data, ResultRecord) else data

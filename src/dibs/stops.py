"""What stops work on purpose, and how a stop is recorded: a stop is no failure.

A leaf module: a :class:`~dibs.lease.Lease` records its release with it, and :mod:`dibs.holding`
decides with it, without either importing the other.
"""

from __future__ import annotations

import asyncio

__all__ = ["STOPS", "STOP_PREFIX", "failure_text", "is_stop"]


#: How every recorded stop begins (``stopped: KeyboardInterrupt``, ``stopped by SIGTERM: ...``,
#: Airflow's ``stopped: the task was killed (on_kill)``): see :func:`is_stop`.
STOP_PREFIX = "stopped"


#: What stops work on purpose rather than failing it. Any other ``BaseException`` is a failure: an
#: Airflow task timeout (``AirflowTaskTimeout`` derives from ``BaseException`` so that user code does
#: not catch it) is work that took too long, and must count towards ``max_failures``.
STOPS: tuple[type[BaseException], ...] = (
    KeyboardInterrupt,
    SystemExit,
    asyncio.CancelledError,
    GeneratorExit,
)


def failure_text(exc: BaseException) -> str:
    """How a failure is recorded: ``Type: message``; a stop (Ctrl-C, a cancellation, ``SystemExit``:
    :data:`STOPS`) as ``stopped: Type``."""
    if not isinstance(exc, STOPS):
        return f"{type(exc).__name__}: {exc}"
    detail = str(exc)
    return f"{STOP_PREFIX}: {type(exc).__name__}" + (f": {detail}" if detail else "")


def is_stop(recorded: str) -> bool:
    """Whether a recorded release is a stop: recorded, so waiters can say why the key is free, but
    not a failure, so it never counts towards ``max_failures`` (nothing failed: someone stopped it)."""
    return recorded == STOP_PREFIX or recorded.startswith((f"{STOP_PREFIX}:", f"{STOP_PREFIX} by "))

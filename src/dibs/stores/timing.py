"""How long each store operation takes, told to the process's observers (``dibs.store.operation.duration``).

Every store class gets this once, from :meth:`dibs.stores.base.Store.__init_subclass__`: the key
operations a class defines itself are wrapped, so no store (nor a test's or a benchmark's proxy store)
has to remember to time itself. Unobserved, a wrapped operation costs one check (are there process
observers that asked for store operations: a tuple's truth) on top of the call; observed, it reads the
clock twice and the front end of the call it serves (:data:`dibs.events.FRONTEND`), and builds one
:class:`~dibs.events.StoreOperation`. Stores that call another operation
inside one (Azure's complete reads first; a proxy around a store) report only the outermost.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from dibs import events
from dibs.keys import Key

__all__ = ["TIMED", "timed"]

#: The operations on one key that are timed, under the names the metric's ``dibs.store.operation`` uses.
TIMED = ("read", "acquire", "heartbeat", "complete", "release", "force_release", "forget", "discard")

F = TypeVar("F", bound=Callable[..., Any])

_INSIDE = threading.local()


def timed(operation: str, method: F) -> F:
    """``method`` (a store's ``operation``), reporting its duration to the process's observers."""
    observers = events.PROCESS

    @functools.wraps(method)
    def operate(self: Any, key: Key, /, *args: Any, **kwargs: Any) -> Any:
        if not observers.operations or getattr(_INSIDE, "busy", False):  # unobserved, or inside another
            return method(self, key, *args, **kwargs)
        _INSIDE.busy = True
        error: str | None = None
        started = time.perf_counter()
        try:
            return method(self, key, *args, **kwargs)
        except BaseException as exc:
            error = type(exc).__name__
            raise
        finally:
            seconds = time.perf_counter() - started
            _INSIDE.busy = False
            _tell(self, operation, key, seconds, error)

    return operate  # type: ignore[return-value]


def _tell(store: Any, operation: str, key: Key, seconds: float, error: str | None) -> None:
    if not isinstance(key, Key):
        return  # a caller's mistake that the operation itself reports
    fields = {
        "key": key,
        "owner": "",
        "frontend": events.FRONTEND.get(),  # the call's, if it runs for one (set by dibs.flow, dibs.lease)
        "call": 0,
        "store": store.__dict__.get("_dibs_kind") or kind_of(store),
        "operation": operation,
        "seconds": seconds,
        "error_type": error,
    }
    event = events.build(events.StoreOperation, fields)
    for observer in events.PROCESS.operations:
        try:
            observer(event)
        except Exception:  # an observer never changes a result (events._deliver, inlined: every operation)
            events._complain_once(observer, event)


def kind_of(store: Any) -> str:
    """The store's kind as metrics name it: its URL's scheme without a driver (``postgresql``)."""
    kind: str | None = store.__dict__.get("_dibs_kind")
    if kind is None:
        try:
            kind = str(store.url).split("://", 1)[0].split("+", 1)[0].lower()
        except Exception:
            kind = type(store).scheme or type(store).__name__
        store.__dict__["_dibs_kind"] = kind
    return kind

"""One worker of ``dibs demo``, in its own process: ``main([URL, NAME, SECONDS])``.

It opens the store, says it is ready, then gets the value of each key it reads on stdin (one per
act) through the public API, as a pipeline task would, until stdin closes. Each step is reported as
one JSON line on its stdout, a pipe only this worker writes to: the demo can kill it at any moment
without leaving behind a lock or a half-sent message that another process depends on. (The
multiprocessing queue shared by all workers, which this replaced, could: a worker killed while
holding the queue's lock hung the survivors for ever.)
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import dibs
from dibs.client import Reservations
from dibs.seam import StoreIO

__all__ = ["STEPS", "TTL", "main"]

NAMESPACE = "demo"
TTL = 2.0  # short, so that the takeover in act 2 comes quickly
STEPS = 10  # progress reports per computation; the demo kills the holder at the fifth


def report(kind: str, detail: str = "", value: Any = None) -> None:
    """One event for the demo: a whole line, written and flushed at once (well under PIPE_BUF)."""
    line = json.dumps({"at": time.time(), "kind": kind, "detail": detail, "value": value})
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _train(name: str, seconds: float) -> dict[str, Any]:
    """The slow computation: sleeps in steps, reporting progress (the flow heartbeats meanwhile)."""
    for step in range(STEPS):
        time.sleep(seconds / STEPS)
        report("progress", f"{(step + 1) * 100 // STEPS}%")
    return {"model": "churn-v3", "auc": 0.91, "trained_by": name}


def _narrate(event: dibs.Event) -> None:
    """The flow's events as the demo's reports (what a pipeline's own observer would do)."""
    if isinstance(event, dibs.Asked):
        report("asking")
    elif isinstance(event, dibs.KeyBusy):
        report("waiting", f"on {event.holder}, whose lease has {event.expires_in:.1f}s left")
    elif isinstance(event, dibs.LeaseAcquired):
        took = f", took over from {event.took_over_from}" if event.took_over_from else ""
        report(
            "computing",
            f"token {event.token}{took}",
            {"token": event.token, "took_over_from": event.took_over_from},
        )


def get_value(client: Reservations, key: str, name: str, seconds: float) -> None:
    """Hit, compute, or wait and take over: one ``compute`` call, whose events say what happened."""
    # Driven as any front end does (dibs.flow, dibs.seam): the demo says it in its own reports, not in
    # log lines.
    call = client.call(key, owner=name, frontend="demo", observer=_narrate)
    work = functools.partial(_train, name, seconds)
    got = call.drive(StoreIO(client, work, emit=call.emitter))
    if got.role == "computed":
        report("done", f"stored with token {got.token}", got.value)
    else:
        report("hit", f"artifact by {got.producer}", got.value)


def main(argv: Sequence[str]) -> int:
    url, name, seconds = argv
    try:
        with Reservations(url, namespace=NAMESPACE, ttl=TTL) as client:
            report("ready")
            for line in sys.stdin:  # one key per act; the demo closes stdin at the end
                get_value(client, line.strip(), name, float(seconds))
    except BrokenPipeError:
        # The demo has gone (interrupted, or killed itself): nobody reads the reports any more. Point
        # stdout at /dev/null so that the interpreter's final flush does not complain a second time.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0

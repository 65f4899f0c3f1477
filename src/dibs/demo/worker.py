"""One worker of ``dibs demo``, in its own process: ``main([URL, NAME, SECONDS])``.

It opens the store, says it is ready, then gets the value of each key it reads on stdin (one per
act) through the public API, as a pipeline task would, until stdin closes. Each step is reported as
one JSON line on its stdout, a pipe only this worker writes to: the demo can kill it at any moment
without leaving behind a lock or a half-sent message that another process depends on. (The
multiprocessing queue shared by all workers, which this replaced, could: a worker killed while
holding the queue's lock hung the survivors for ever.)
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from dibs.client import Reservations
from dibs.errors import ReservationError
from dibs.lease import Lease
from dibs.outcomes import Acquired, Hit

__all__ = ["STEPS", "TTL", "main"]

NAMESPACE = "demo"
TTL = 2.0  # short, so that the takeover in act 2 comes quickly
STEPS = 10  # progress reports per computation; the demo kills the holder at the fifth


def report(kind: str, detail: str = "", value: Any = None) -> None:
    """One event for the demo: a whole line, written and flushed at once (well under PIPE_BUF)."""
    line = json.dumps({"at": time.time(), "kind": kind, "detail": detail, "value": value})
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _train(lease: Lease, name: str, seconds: float) -> dict[str, Any]:
    """The slow computation: sleeps in steps, heartbeating in the background, reporting progress."""
    with lease.keep_alive() as heartbeats:
        for step in range(STEPS):
            time.sleep(seconds / STEPS)
            heartbeats.check()  # a lost lease must not go on to store a result
            report("progress", f"{(step + 1) * 100 // STEPS}%")
    return {"model": "churn-v3", "auc": 0.91, "trained_by": name}


def get_value(client: Reservations, key: str, name: str, seconds: float) -> None:
    """Hit, compute, or wait and try again: the loop every caller of ``get_or_reserve`` writes."""
    report("asking")
    while True:
        outcome = client.get_or_reserve(key, owner=name)
        if isinstance(outcome, Hit):
            report("hit", f"artifact by {outcome.producer}", outcome.value)
            return
        if isinstance(outcome, Acquired):
            lease = outcome.lease
            took = f", took over from {outcome.took_over_from}" if outcome.took_over_from else ""
            report(
                "computing",
                f"token {lease.token}{took}",
                {"token": lease.token, "took_over_from": outcome.took_over_from},
            )
            try:
                value = _train(lease, name, seconds)
            except BaseException as exc:
                # A waiter takes over now instead of after the ttl; if even that fails (the lease
                # was lost, the store is down), the ttl frees the key anyway.
                with contextlib.suppress(ReservationError):
                    lease.release(exc)
                raise
            lease.complete(value)
            report("done", f"stored with token {lease.token}", value)
            return
        report("waiting", f"on {outcome.holder}, whose lease has {outcome.remaining:.1f}s left")
        hit = client.wait(key)  # returns on completion, or once the lease is released or expires
        if hit is not None:
            report("hit", f"artifact by {hit.producer}", hit.value)
            return


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

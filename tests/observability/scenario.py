"""One small scenario that makes dibs emit every metric it has (for the dashboard and docs checks)."""

from __future__ import annotations

import contextlib
import threading

import dibs
import dibs.events


def emit_every_metric(client: dibs.Reservations) -> None:
    """A computation with two waiters and heartbeats, a hit, a failure, and a lease lost mid-work."""
    busy = threading.Semaphore(0)
    beat, lost = threading.Event(), threading.Event()

    def heard(event: dibs.Event) -> None:
        if isinstance(event, dibs.KeyBusy):
            busy.release()
        elif isinstance(event, dibs.events.HeartbeatSent):
            beat.set()
        elif isinstance(event, dibs.events.LostLease):
            lost.set()

    def work() -> str:
        for _ in range(2):
            assert busy.acquire(timeout=30), "a waiter never found the key busy"
        assert beat.wait(timeout=30), "the holder sent no heartbeat"  # the client's ttl is short
        return "value"

    threads = [
        threading.Thread(target=lambda i=i: client.compute("shared", work, owner=f"w{i}", observer=heard))
        for i in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    client.compute("shared", lambda: "never", owner="late")  # a hit

    def fail() -> None:
        raise KeyError("no rows")

    with contextlib.suppress(KeyError):
        client.compute("broken", fail, owner="w0")

    def released_under_it() -> str:  # an operator force-releases the key: the next heartbeat finds out
        client.force_release("lost")
        assert lost.wait(timeout=30), "the next heartbeat did not find the lease lost"
        return "late value"

    client.compute("lost", released_under_it, owner="w0", observer=heard)

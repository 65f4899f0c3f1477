"""One small scenario that makes dibs emit every metric it has (for the dashboard and docs checks)."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
from pathlib import Path

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
    ride_out_an_outage(client)


def ride_out_an_outage(client: dibs.Reservations) -> None:
    """A waiter whose file store goes away (its folder replaced by a file, as an unmounted share
    would be: every read fails) rides the outage out, and gets the artifact once the folder is back."""
    root = Path(tempfile.mkdtemp(prefix="dibs-outage-")) / "store"
    unreachable = threading.Event()
    results: list[object] = []
    with dibs.Reservations(f"file://{root}", ttl=30) as store:
        got = store.get_or_reserve("outage", owner="holder")
        assert isinstance(got, dibs.Acquired)
        away = root.with_name("away")
        root.rename(away)
        root.write_text("not a folder")  # the store is unreachable
        thread = threading.Thread(
            target=lambda: results.append(store.wait("outage", timeout=30, resumed=True))
        )
        with store.observe(lambda event: isinstance(event, dibs.StoreUnreachable) and unreachable.set()):
            thread.start()
            assert unreachable.wait(timeout=30), "the waiter never found its store unreachable"
            root.unlink()
            away.rename(root)  # the outage is over
            got.lease.complete("after the outage")
            thread.join(timeout=30)
    shutil.rmtree(root.parent, ignore_errors=True)
    assert results and isinstance(results[0], dibs.Hit) and results[0].value == "after the outage"

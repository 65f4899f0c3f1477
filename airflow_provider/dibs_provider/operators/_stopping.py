"""Stopping a reserved task that holds its key: Airflow's ``on_kill`` frees the key at once.

Airflow stops a running task (mark failed, mark success, a cleared or deleted run, a Kubernetes pod
shutdown) by sending its process SIGTERM; the task runner's handler calls the operator's ``on_kill`` on
the main thread, *while* ``execute`` still runs there, and the supervisor sends SIGKILL a few seconds
later. A SIGKILLed holder never releases: without ``on_kill`` its waiters would wait out the ttl.

So the running task keeps its lease as a :class:`dibs.integration.HeldLease` the operator can reach, and
``on_kill`` ends it from outside the work (:meth:`~dibs.integration.HeldLease.let_go`): the heartbeats stop
and the lease is released with the failure recorded (:data:`KILLED_FAILURE`), so a waiting run takes
the key over at once and its log says why. The core's hold loop (:meth:`dibs.Reservations.hold`)
still runs the work and reacts to how it ends; a held lease ends once, so it stays quiet: its own
release is skipped, and a value the work still returns is refused by the store (fencing) like any
stale write.

``on_kill`` can interrupt the main thread anywhere, even inside a store call holding a lock, so the
release runs in a helper thread that ``on_kill`` waits for only :data:`RELEASE_WAIT` seconds: if the
store is slow to answer, the task still stops, and the lease expires after its ttl at worst.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from dibs.errors import LeaseLost, ReservationError

if TYPE_CHECKING:
    from dibs.integration import HeldLease, Logger

__all__ = ["KILLED_FAILURE", "RELEASE_WAIT", "release_killed"]

#: What a key's failure record says when Airflow killed the task holding it.
KILLED_FAILURE = "stopped: the task was killed (on_kill)"

#: Seconds ``on_kill`` waits for the store to record the release (Airflow's supervisor escalates from
#: SIGTERM to SIGKILL after 5 seconds, and the wrapped operator's own ``on_kill`` runs after this).
RELEASE_WAIT = 3.0


def release_killed(held: HeldLease, logger: Logger, *, wait: float = RELEASE_WAIT) -> None:
    """``on_kill``'s part: let ``held`` go in a helper thread, wait up to ``wait`` seconds, log what happened.

    Never raises: ``on_kill`` must go on to stop the wrapped operator's own work.
    """
    outcome: list[BaseException | None] = []
    lease = held.lease

    def kill() -> None:
        try:
            held.let_go(KILLED_FAILURE)
        except BaseException as exc:  # reported by the caller, in its own thread
            outcome.append(exc)
        else:
            outcome.append(None)

    helper = threading.Thread(target=kill, name=f"dibs-on-kill-{lease.key.name[:40]}", daemon=True)
    helper.start()
    helper.join(wait)
    ttl = lease.record.ttl
    if not outcome:
        logger.warning(
            "dibs: the task was killed, but the store did not confirm the release of %s within %.0fs; if "
            "it never does, the lease expires %.0fs after its last heartbeat and a waiting run takes over",
            lease.key,
            wait,
            ttl,
        )
        return
    error: Any = outcome[0]
    if error is None:
        logger.warning(
            "dibs: the task was killed: released %s (token %s) with the failure recorded, so a waiting run "
            "takes it over now",
            lease.key,
            lease.token,
        )
    elif isinstance(error, LeaseLost):
        logger.info("dibs: the task was killed; %s was no longer held by it (%s)", lease.key, error)
    elif isinstance(error, ReservationError):
        logger.warning(
            "dibs: the task was killed, but releasing %s failed (%s); the lease expires %.0fs after its last "
            "heartbeat and a waiting run takes over",
            lease.key,
            error,
            ttl,
        )
    else:
        logger.error(
            "dibs: the task was killed, but releasing %s failed unexpectedly (%s: %s); the lease expires "
            "%.0fs after its last heartbeat",
            lease.key,
            type(error).__name__,
            error,
            ttl,
        )

"""``dibs demo``: several processes need the same slow computation; watch one compute and the rest wait.

Act 1: N worker processes ask for the same key at once. One takes the lease and computes; the others
wait on it and pick up the stored artifact the moment it is completed.
Act 2: the same on a new key, but the demo kills the computing process with SIGKILL halfway. Its
lease expires after the ttl and one waiter takes over; the others wait for that one.

Everything runs on the embedded SQLite store in a temporary folder, in about 11 seconds. The demo
cannot hang: each worker has its own pipes to and from the demo (:mod:`dibs.demo.crew`), a deadline
ends it with a message saying where it was, and every exit path, Ctrl-C included, stops the workers
and removes the folder (:mod:`dibs.demo.show`). The workers use only the public API
(:mod:`dibs.demo.worker`).
"""

from __future__ import annotations

from dibs.demo.show import run_demo

__all__ = ["run_demo"]

"""The guard of ``dibs run``: COMMAND never outlives the ``dibs run`` that holds its lease.

If ``dibs run`` is killed outright (SIGKILL, the OOM killer), nothing in it runs again: its lease
expires after the ttl and a successor runs COMMAND once more. Were the first COMMAND still running,
two copies would run at once. So ``dibs run`` starts this guard, a separate tiny process in a session
of its own (out of reach of the terminal's Ctrl-C and of signals sent to the caller's process group),
and keeps the write end of a pipe to it that nothing else holds:

* ``dibs run`` writes COMMAND's process group id as the first line;
* when COMMAND is over, it writes ``done`` and closes the pipe: the guard exits;
* if ``dibs run`` dies, the kernel closes the pipe with no ``done``: the guard sends SIGTERM to the
  whole process group (COMMAND and everything it started), then SIGKILL after the grace period.

This works wherever there are process groups (Linux, macOS, the BSDs), unlike Linux's parent-death
signal, and it reaches COMMAND's children too, not only COMMAND itself. The guard is run as a plain
script (``python -I -S guard.py GRACE``) and imports nothing but the standard library, so it starts in
a few milliseconds and never imports dibs.
"""

from __future__ import annotations

import os
import signal
import sys
import time

GOODBYE = b"done"
_POLL_SECONDS = 0.05


def main(argv: list[str]) -> int:
    grace = float(argv[1]) if len(argv) > 1 else 10.0
    first = sys.stdin.buffer.readline().strip()
    if not first.isdigit():
        return 0  # dibs ended (or died) before it started COMMAND: nothing to guard
    group = int(first)
    rest = sys.stdin.buffer.read()  # returns when dibs closes the pipe: by saying goodbye, or by dying
    if rest.strip() == GOODBYE:
        return 0
    stop_group(group, grace)
    return 0


def stop_group(group: int, grace: float) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left of it after ``grace`` seconds."""
    if not _signal(group, signal.SIGTERM):
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not _signal(group, 0):
            return
        time.sleep(_POLL_SECONDS)
    _signal(group, signal.SIGKILL)


def _signal(group: int, sig: int) -> bool:
    """``False`` once the group is gone (its id cannot be reused while any member lives)."""
    try:
        os.killpg(group, sig)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member changed its user id: nothing more this guard can do
        return False
    return True


if __name__ == "__main__":
    sys.exit(main(sys.argv))

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
signal, and it reaches COMMAND's children too, not only COMMAND itself. A descendant that left the
group (``setsid``, ``start_new_session=True``) would escape a signal to the group; on Linux the guard
therefore also reads ``/proc`` before signalling, and stops every process that descends from a
member of the group, whatever its group or session (issue 16, item 11: such a child of a SIGKILLed
``dibs run`` finished after the next holder had started). What still escapes is what has left the
process tree before ``dibs run`` died: a daemon that double-forked, so that init adopted it.

Such a stray is signalled by a pidfd taken when it was found (Linux 5.3+), never by its number: it may
exit during the grace period and its number go to an unrelated process, which a plain ``kill(pid)``
would then stop. The group is signalled by its id, which the kernel does not reuse while any member
lives.

The guard is run as a plain script (``python -I -S guard.py GRACE``) and imports nothing but the
standard library, so it starts in a few milliseconds and never imports dibs.
"""

from __future__ import annotations

import contextlib
import os
import select
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
    """SIGTERM the process group and the descendants that left it, then SIGKILL whatever is left of
    them after ``grace`` seconds."""
    found = descendants_outside(group)  # before any signal: while the tree still leads to them
    strays = everyone = [Stray.of(pid, started) for pid, started in found.items()]
    try:
        for stray in strays:
            stray.kill(signal.SIGTERM)
        if not _signal(group, signal.SIGTERM) and not strays:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            strays = [stray for stray in strays if stray.runs()]
            if not _signal(group, 0) and not strays:
                return
            time.sleep(_POLL_SECONDS)
        _signal(group, signal.SIGKILL)
        for stray in strays:
            stray.kill(signal.SIGKILL)
    finally:
        for stray in everyone:
            stray.close()


class Stray:
    """A process found outside the group, held by a pidfd where the system has them (Linux 5.3+), so
    that a signal can only reach that very process, not whoever gets its number after it exits."""

    def __init__(self, pid: int, fd: int | None) -> None:
        self.pid, self.fd = pid, fd

    @classmethod
    def of(cls, pid: int, started: int) -> Stray:
        """The process ``pid`` that started at ``started`` (clock ticks after boot, as the scan read it)."""
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:  # already gone: nothing to signal
            return cls(pid, -1)
        except (AttributeError, OSError):  # no pidfds on this system: signal the number, as before
            return cls(pid, None)
        now = _stat(str(pid))
        if now is None or now[3] != started:
            # Its number changed hands since the scan (its start time differs): the fd is somebody
            # else's. Parent and group are no proof either way: a stray may be reparented meanwhile.
            os.close(fd)
            return cls(pid, -1)
        return cls(pid, fd)

    def kill(self, sig: int) -> None:
        if self.fd == -1:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):  # gone, or no longer ours
            if self.fd is None:
                os.kill(self.pid, sig)
            else:
                signal.pidfd_send_signal(self.fd, sig)

    def runs(self) -> bool:
        """Whether it still runs code (a zombie nobody reaped yet does not)."""
        if self.fd == -1:
            return False
        if self.fd is not None and select.select([self.fd], [], [], 0)[0]:
            return False  # a pidfd is readable once its process has exited
        return _runs(self.pid)

    def close(self) -> None:
        if self.fd is not None and self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def descendants_outside(group: int) -> dict[int, int]:
    """The processes that descend from a member of process group ``group`` but are not in it, with
    their start times (Linux: from ``/proc``; elsewhere, and when ``/proc`` cannot be read, none)."""
    parents: dict[int, int] = {}
    starts: dict[int, int] = {}
    members: set[int] = set()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return {}
    for entry in entries:
        stat = _stat(entry) if entry.isdigit() else None
        if stat is not None:
            pid, (_, ppid, pgrp, started) = int(entry), stat
            parents[pid], starts[pid] = ppid, started
            if pgrp == group:
                members.add(pid)
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    pending = list(members)
    while pending:
        for child in children.get(pending.pop(), ()):
            if child not in members and child not in found:
                found.add(child)
                pending.append(child)
    found.discard(os.getpid())
    return {pid: starts[pid] for pid in found}


def _stat(pid: str) -> tuple[str, int, int, int] | None:
    """State, parent pid, process group and start time (clock ticks after boot) of ``pid`` from
    ``/proc/PID/stat``; ``None`` if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            data = file.read()
        # The command name may hold spaces and parentheses: the fields follow the last ')'.
        fields = data[data.rfind(b")") + 2 :].split()
        return fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[19])
    except (OSError, ValueError):
        return None


def _runs(pid: int) -> bool:
    """Whether ``pid`` still runs code (a zombie nobody reaped yet does not)."""
    stat = _stat(str(pid))
    return stat is not None and stat[0] != "Z"


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

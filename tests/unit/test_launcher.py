"""The process's heartbeat launcher: it starts a block's heartbeat thread only once its first beat is
due, and is woken only by a block due before its own next wake-up (waking it for every short block
was a thread switch per reserve-and-complete)."""

from __future__ import annotations

import threading
import time

from dibs.lease import _Launcher


class _Block:
    """Stands in for a KeepAlive: the launcher only calls ``_launch`` when the block is due."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.launched = threading.Event()

    def _launch(self) -> None:
        self.launched.set()


def _counting_notifies(launcher: _Launcher) -> list[int]:
    count = [0]
    notify = launcher._condition.notify

    def counted(n: int = 1) -> None:
        count[0] += 1
        notify(n)

    launcher._condition.notify = counted  # type: ignore[method-assign]
    return count


def _sleeping(launcher: _Launcher) -> None:
    deadline = time.monotonic() + 30
    while not launcher._condition._waiters:  # type: ignore[attr-defined]  # the thread is in its wait
        assert time.monotonic() < deadline, "the launcher thread never went to sleep"
        time.sleep(0.01)


def test_blocks_that_follow_each_other_do_not_wake_the_launcher_and_are_still_launched_when_due() -> None:
    launcher = _Launcher()
    first, second = _Block("first"), _Block("second")
    launcher.add(first, time.monotonic() + 0.3)  # type: ignore[arg-type]
    _sleeping(launcher)
    notifies = _counting_notifies(launcher)
    launcher.remove(first)  # type: ignore[arg-type]
    launcher.add(second, time.monotonic() + 0.4)  # type: ignore[arg-type]  # due after the wake-up
    assert notifies[0] == 0
    assert second.launched.wait(30), "a block added without a notify was never launched"
    assert not first.launched.is_set()


def test_a_block_due_before_the_launchers_next_wake_up_wakes_it() -> None:
    launcher = _Launcher()
    distant, soon = _Block("distant"), _Block("soon")
    launcher.add(distant, time.monotonic() + 3600)  # type: ignore[arg-type]
    _sleeping(launcher)
    notifies = _counting_notifies(launcher)
    launcher.add(soon, time.monotonic() + 0.05)  # type: ignore[arg-type]
    assert notifies[0] == 1
    assert soon.launched.wait(30), "the launcher slept past a block due before its wake-up"
    assert not distant.launched.is_set()
    launcher.remove(distant)  # type: ignore[arg-type]

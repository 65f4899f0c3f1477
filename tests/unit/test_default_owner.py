"""The default owner (``host:pid:random``): its host and process part is read once per process."""

from __future__ import annotations

import os
import socket
import sys

import pytest

from dibs.config import default_owner


def test_each_default_owner_is_this_host_and_process_with_its_own_random_part() -> None:
    first, second = default_owner(), default_owner()
    assert first.rsplit(":", 1)[0] == f"{socket.gethostname()}:{os.getpid()}"
    assert first != second


@pytest.mark.skipif(sys.platform == "win32", reason="fork is POSIX")
def test_a_forked_child_names_its_own_process() -> None:
    default_owner()  # the parent's part is read before the fork
    reading, writing = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(writing, default_owner().encode())
        finally:
            os._exit(0)
    os.close(writing)
    owner = os.read(reading, 4096).decode()
    os.close(reading)
    os.waitpid(pid, 0)
    assert owner.rsplit(":", 2)[1] == str(pid)

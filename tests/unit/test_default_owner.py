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


def test_owners_stay_distinct_across_batches_of_random_bytes() -> None:
    owners = [default_owner() for _ in range(1000)]  # several batches of random suffixes
    assert len(set(owners)) == len(owners)
    assert all(len(owner.rsplit(":", 1)[1]) == 12 for owner in owners)  # 48 bits, as hex


@pytest.mark.skipif(sys.platform == "win32", reason="fork is POSIX")
def test_a_forked_child_never_repeats_the_random_part_its_parent_hands_out_next() -> None:
    default_owner()  # the parent holds unused random suffixes when it forks
    reading, writing = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(writing, default_owner().encode())
        finally:
            os._exit(0)
    os.close(writing)
    child = os.read(reading, 4096).decode()
    os.close(reading)
    os.waitpid(pid, 0)
    assert child.rsplit(":", 1)[1] != default_owner().rsplit(":", 1)[1]

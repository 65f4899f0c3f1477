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


def test_an_empty_owner_is_refused_not_replaced_by_the_default() -> None:
    # The contract: an owner is a non-empty logical identity. "" (an unset variable, say) silently
    # becoming this process's default owner would make a retry wait for its own lease.
    import dibs
    from dibs import ConfigurationError

    # memory:// is one store per process: a namespace of its own, so "k" starts free whatever ran before
    with dibs.Reservations("memory://", namespace="owner.empty") as client:
        for call in (
            lambda: client.compute("k", lambda: 1, owner=""),
            lambda: client.get_or_reserve("k", owner=""),
            lambda: client.call("k", owner=""),
        ):
            with pytest.raises(ConfigurationError, match="owner must not be empty"):
                call()
        assert client.status("k").lease is None  # nothing was taken
        assert client.compute("k", lambda: 1).role == "computed"  # no owner at all: the default

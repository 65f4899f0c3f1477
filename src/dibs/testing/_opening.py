"""What the contract suites' fixtures yield: an opener that closes everything it opened.

A contract test opens several stores on one location (a holder's, a waiter's, a collector's), as
several processes would; the fixture closes them all when the test ends, whichever test it was.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Protocol, TypeVar


class Closeable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=Closeable)


@contextlib.contextmanager
def opened(open_one: Callable[[], C]) -> Iterator[Callable[[], C]]:
    """A callable that opens one with ``open_one`` each time it is called; all are closed at the end."""
    opened: list[C] = []

    def opener() -> C:
        one = open_one()
        opened.append(one)
        return one

    try:
        yield opener
    finally:
        for one in opened:
            one.close()

"""``with thing:`` closes ``thing`` at the end of the block: :class:`Closing`, written once for every
dibs object that holds something to give back (clients, stores)."""

from __future__ import annotations

import abc
from types import TracebackType
from typing import Self

__all__ = ["Closing"]


class Closing(abc.ABC):
    """A base for objects used as ``with obj: ...`` that :meth:`close` at the end of the block (as
    ``contextlib.closing`` does, but the object itself is what the ``with`` gives)."""

    # No instance dict of its own: a subclass with ``__slots__`` (a hub's subscription, a thousand per
    # triggerer, issue 20) stays without one; subclasses without ``__slots__`` get theirs as before.
    __slots__ = ()

    @abc.abstractmethod
    def close(self) -> None:
        """Give back what this object holds; it must not be used afterwards."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

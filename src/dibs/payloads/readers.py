"""A remote payload as a readable binary stream: the one ``io.RawIOBase`` shape the payload stores
that read through an SDK share (Azure's downloader, an fsspec file), so that ``readinto`` and the
``read(None)`` convention are written once and each store writes only its own read, with its own
errors translated."""

from __future__ import annotations

import io
from typing import Any

__all__ = ["SdkReader"]


class SdkReader(io.RawIOBase):
    """A readable raw stream over a store's own ``_read(size)`` (``-1`` for the rest), which returns
    the SDK's bytes as they are and raises the errors the verifying reader expects."""

    def readable(self) -> bool:
        return True

    def _read(self, size: int) -> bytes:
        raise NotImplementedError

    def read(self, size: int | None = -1) -> bytes:
        return self._read(-1 if size is None else size)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self._read(len(view))
        view[: len(data)] = data
        return len(data)

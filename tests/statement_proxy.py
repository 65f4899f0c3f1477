"""A TCP proxy that holds back one client statement until the test lets it through.

It is the reliability suite's :class:`~reliability.faults.FaultProxy` (faithful forwarding, run in a
thread of its own) with one more fault: the first chunk a client sends that matches ``pattern`` is
held, :attr:`HoldingProxy.held` is set, and the chunk is forwarded only after :meth:`release`. So a
test can stop one client *between* deciding and writing (its read is done, its write is on the
wire) while other clients, connected directly, change the same row: the schedule of a delayed
statement in a slow network, made exact instead of hoped for with sleeps.
"""

from __future__ import annotations

import asyncio
import re
import threading
from typing import Any

from reliability.faults import FaultProxy

__all__ = ["HoldingProxy"]


class _HoldingReader:
    """Reads from the client; holds the first chunk that matches the proxy's pattern."""

    def __init__(self, reader: asyncio.StreamReader, proxy: HoldingProxy) -> None:
        self._reader = reader
        self._proxy = proxy

    async def read(self, n: int = -1) -> bytes:
        data = await self._reader.read(n)
        await self._proxy._maybe_hold(data)
        return data


class HoldingProxy(FaultProxy):
    """Forwards faithfully, except that it holds the first client chunk matching ``pattern``."""

    def __init__(self, upstream_host: str, upstream_port: int, pattern: bytes) -> None:
        super().__init__(upstream_host, upstream_port)
        self._pattern = re.compile(pattern)
        self._armed = True
        self.held = threading.Event()
        self.statement = b""
        self._released: asyncio.Event | None = None

    async def _listen(self) -> int:
        self._released = asyncio.Event()
        return await super()._listen()

    def release(self) -> None:
        """Let the held statement (and everything after it) through."""
        assert self._released is not None
        self._loop.call_soon_threadsafe(self._released.set)

    def proxied(self, url: str, host: str, port: int) -> str:
        """``url`` with its server replaced by this proxy."""
        return url.replace(f"{host}:{port}", f"127.0.0.1:{self.port}", 1)

    async def _maybe_hold(self, data: bytes) -> None:
        if self._armed and self._pattern.search(data):
            self._armed = False
            self.statement = data
            self.held.set()
            assert self._released is not None
            await self._released.wait()

    async def _pump(self, pipe: Any, source: Any, target: asyncio.StreamWriter, way: str) -> None:
        if way == "up":
            source = _HoldingReader(source, self)
        await super()._pump(pipe, source, target, way)

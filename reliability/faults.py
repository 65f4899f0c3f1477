"""The faults the scenarios inject: a TCP proxy that breaks connections, process signals, and clock skew.

:class:`FaultProxy`
    An asyncio TCP proxy on loopback, run in a daemon thread of the harness, placed between the
    clients and PostgreSQL, MySQL, Redis or Azurite. It forwards bytes faithfully until told to
    misbehave: cut every open connection (RST), reset connections mid-message (a prefix of a chunk
    is forwarded, then RST: a request half-sent, or a reply half-received after the server already
    acted on the request, which is the ambiguous case), add latency, stall all traffic for a while
    (a partition that heals), or refuse new connections (the store is down). Every fault it applies
    is counted in :attr:`FaultProxy.stats` for the report.

Signals
    :func:`signal_child` sends SIGKILL, SIGSTOP or SIGCONT and returns the monotonic time at which it
    did, the reference point for measured takeover latencies.

Clock skew
    :func:`faketime_library` finds libfaketime (``scripts/install-faketime.sh`` installs it),
    :func:`skew_environment` builds the environment that shifts a child's wall clock (``LD_PRELOAD``
    plus ``FAKETIME``) while leaving its monotonic clock alone, and :func:`verify_skew` proves the
    shift really applies before any result depends on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

__all__ = [
    "FAKETIME_ENV",
    "FaultProxy",
    "faketime_library",
    "signal_child",
    "skew_environment",
    "verify_skew",
]

#: Where to look for libfaketime (Debian/Ubuntu multiarch, other distributions, a local build).
_FAKETIME_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib64/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
)
FAKETIME_ENV = "DIBS_LIBFAKETIME"


class _Pipe:
    """One proxied connection: the client side and the upstream side."""

    def __init__(self, client: asyncio.StreamWriter, upstream: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream = upstream
        self.closed = False

    def abort(self) -> None:
        """Close both sides with a TCP RST (``SO_LINGER`` 0), as a crashed middlebox or server would."""
        if self.closed:
            return
        self.closed = True
        for writer in (self.client, self.upstream):
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()


class FaultProxy:
    """A fault-injecting TCP proxy from ``127.0.0.1:port`` to ``upstream``. See the module docstring."""

    def __init__(self, upstream_host: str, upstream_port: int, *, seed: int = 0) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self.stats: Counter[str] = Counter()
        self.stalled_seconds = 0.0
        self._rng = random.Random(seed)
        self._latency = 0.0
        self._reset_probability = 0.0
        self._reset_directions: tuple[str, ...] = ("down",)
        self._refusing = False
        self._pipes: set[_Pipe] = set()
        self._loop = asyncio.new_event_loop()
        self._flowing: asyncio.Event | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)

    # -- life ---------------------------------------------------------------------------------------
    def start(self) -> int:
        self._thread.start()
        self.port = self._call(self._listen())
        return self.port

    async def _listen(self) -> int:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self._call(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for pipe in list(self._pipes):
            pipe.abort()

    def __enter__(self) -> FaultProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=30)

    # -- faults (callable from any thread) -----------------------------------------------------------
    def heal(self) -> None:
        """Back to a faithful proxy: no latency, no resets, flowing, accepting."""
        self._latency = 0.0
        self._reset_probability = 0.0
        self._refusing = False
        self._loop.call_soon_threadsafe(self._resume)

    def cut_all(self) -> int:
        """RST every open connection now (a server or middlebox restart, from the client's view)."""
        count: int = self._call(self._cut())
        self.stats["connections cut"] += count
        return count

    async def _cut(self) -> int:
        pipes = [pipe for pipe in self._pipes if not pipe.closed]
        for pipe in pipes:
            pipe.abort()
        return len(pipes)

    def set_latency(self, seconds: float) -> None:
        """Delay every forwarded chunk by ``seconds`` (a slow network or an overloaded server)."""
        self._latency = seconds
        if seconds:
            self.stats["latency windows"] += 1

    def set_resets(self, probability: float, directions: tuple[str, ...] = ("down",)) -> None:
        """Reset a connection mid-chunk with ``probability`` per chunk: ``down`` cuts replies (the
        server already acted: an ambiguous outcome), ``up`` cuts requests (the server never acts)."""
        self._reset_probability = probability
        self._reset_directions = directions

    def stall(self, seconds: float) -> None:
        """Forward nothing for ``seconds``, then resume (a partition that heals; data is not lost)."""
        self.stats["stalls"] += 1
        self.stalled_seconds += seconds
        self._loop.call_soon_threadsafe(self._pause, seconds)

    def _pause(self, seconds: float) -> None:
        assert self._flowing is not None
        self._flowing.clear()
        self._loop.call_later(seconds, self._resume)

    def _resume(self) -> None:
        assert self._flowing is not None
        self._flowing.set()

    def refuse(self, refusing: bool) -> None:
        """While ``True``, every new connection is reset at once (the store is down)."""
        self._refusing = refusing

    # -- forwarding ---------------------------------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._refusing:
            self.stats["connections refused"] += 1
            _Pipe(writer, writer).abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            self.stats["upstream unreachable"] += 1
            _Pipe(writer, writer).abort()
            return
        pipe = _Pipe(writer, up_writer)
        self._pipes.add(pipe)
        try:
            await asyncio.gather(
                self._pump(pipe, reader, up_writer, "up"),
                self._pump(pipe, up_reader, writer, "down"),
                return_exceptions=True,
            )
        finally:
            self._pipes.discard(pipe)
            pipe.abort()

    async def _pump(
        self, pipe: _Pipe, source: asyncio.StreamReader, target: asyncio.StreamWriter, way: str
    ) -> None:
        assert self._flowing is not None
        while not pipe.closed:
            data = await source.read(65536)
            if not data:
                with contextlib.suppress(OSError, RuntimeError):
                    if target.can_write_eof():
                        target.write_eof()
                return
            await self._flowing.wait()
            if self._latency:
                await asyncio.sleep(self._latency)
            if pipe.closed:
                return
            if (
                self._reset_probability
                and way in self._reset_directions
                and self._rng.random() < self._reset_probability
            ):
                cut = self._rng.randrange(0, len(data))
                target.write(data[:cut])
                with contextlib.suppress(OSError, ConnectionError):
                    await target.drain()
                self.stats[f"resets mid-{'reply' if way == 'down' else 'request'}"] += 1
                pipe.abort()
                return
            target.write(data)
            await target.drain()


# -- signals ---------------------------------------------------------------------------------------


def signal_child(pid: int, sig: signal.Signals) -> float:
    """Send ``sig`` to ``pid``; returns the monotonic time right after it was delivered."""
    os.kill(pid, sig)
    return time.monotonic()


# -- clock skew ------------------------------------------------------------------------------------


def faketime_library() -> Path | None:
    """libfaketime's shared object, or ``None`` when it is not installed (``DIBS_LIBFAKETIME`` wins)."""
    override = os.environ.get(FAKETIME_ENV)
    candidates = (override,) if override else _FAKETIME_CANDIDATES
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def skew_environment(library: Path, seconds: int, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a child whose wall clock runs ``seconds`` off (its monotonic clock does not:
    waiting, heartbeat intervals and the recorded history stay on the machine's real time)."""
    env = dict(os.environ if base is None else base)
    if seconds:
        preload = env.get("LD_PRELOAD", "")
        env["LD_PRELOAD"] = f"{library}:{preload}" if preload else str(library)
        env["FAKETIME"] = f"{seconds:+d}s"
        env["FAKETIME_DONT_FAKE_MONOTONIC"] = "1"
    return env


def verify_skew(library: Path, seconds: int) -> float:
    """Run a child with the skew and return how far its ``time.time()`` really was off (seconds)."""
    env = skew_environment(library, seconds)
    before = time.time()
    out = subprocess.run(
        [sys.executable, "-c", "import time; print(repr(time.time()))"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    after = time.time()
    return float(out.stdout.strip()) - (before + after) / 2

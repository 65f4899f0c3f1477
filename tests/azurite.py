"""Azurite, Microsoft's Azure Storage emulator, for the Azure store's tests.

One emulator serves a whole pytest session: :func:`session_azurite` starts it on first use, on a
free loopback port with a throw-away workspace, and stops it when the process exits. Its connection
string is exported as ``DIBS_AZURITE_CONNECTION_STRING``, so child processes (multiprocessing
``spawn`` workers) that ask for it attach to the parent's emulator instead of starting their own;
setting that variable by hand points the tests at an emulator you already run (Docker, say).

The binary comes from ``scripts/install-azurite.sh`` (``.cache/azurite/node_modules/.bin/azurite-blob``)
or from ``DIBS_AZURITE_BIN``. :class:`Azurite` is also usable on its own, e.g. for a test that stops
and restarts an emulator without disturbing the shared one.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

__all__ = [
    "BIN_ENV",
    "CONNECTION_STRING_ENV",
    "DEV_ACCOUNT",
    "DEV_KEY",
    "Azurite",
    "AzuriteUnavailable",
    "connection_string",
    "find_binary",
    "free_port",
    "session_azurite",
]

#: The emulator's well-known development account and key (published by Microsoft; not a secret).
DEV_ACCOUNT = "devstoreaccount1"
DEV_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="

BIN_ENV = "DIBS_AZURITE_BIN"
CONNECTION_STRING_ENV = "DIBS_AZURITE_CONNECTION_STRING"
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BIN = ROOT / ".cache" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
INSTALL_HINT = "run scripts/install-azurite.sh (needs Node.js and npm) or set DIBS_AZURITE_BIN"

_LISTENING = re.compile(r"listens on https?://[^\s:]+:(\d+)")


class AzuriteUnavailable(RuntimeError):
    """Azurite cannot be run here; the message says why and how to fix it."""


def connection_string(endpoint: str) -> str:
    """The dev account's connection string for an endpoint like ``http://127.0.0.1:10000/devstoreaccount1``."""
    return (
        f"DefaultEndpointsProtocol=http;AccountName={DEV_ACCOUNT};AccountKey={DEV_KEY};"
        f"BlobEndpoint={endpoint};"
    )


def find_binary() -> Path:
    """The ``azurite-blob`` executable, or :class:`AzuriteUnavailable` saying how to get it."""
    override = os.environ.get(BIN_ENV)
    candidate = Path(override) if override else DEFAULT_BIN
    if not candidate.is_file() or not os.access(candidate, os.X_OK):
        where = f"{BIN_ENV}={override}" if override else str(DEFAULT_BIN)
        raise AzuriteUnavailable(f"Azurite is not installed ({where} is not an executable); {INSTALL_HINT}")
    if shutil.which("node") is None:
        raise AzuriteUnavailable(f"Azurite needs Node.js, and 'node' is not on PATH; {INSTALL_HINT}")
    return candidate


def _dying_with_this_process(command: list[str]) -> list[str]:
    """``command`` run so that Linux sends it SIGTERM when the test process dies, if ``setpriv`` is there.

    ``atexit`` stops the emulator on any normal exit; this also covers a SIGKILLed or crashed pytest,
    which would otherwise leave an orphaned emulator behind. ``setpriv`` (util-linux) sets the signal
    and then execs the emulator, so no Python code runs between fork and exec. (The signal follows the
    *thread* that started the emulator; pytest fixtures run on the main thread.)
    """
    setpriv = shutil.which("setpriv")
    if setpriv is None or not sys.platform.startswith("linux"):
        return command
    return [setpriv, "--pdeathsig", "TERM", "--", *command]


class Azurite:
    """One ``azurite-blob`` process on 127.0.0.1 with its own workspace directory.

    The first :meth:`start` lets the OS pick a free port (``--blobPort 0``) and reads the port from
    Azurite's startup line, so there is no window in which another process can take it; later starts
    reuse that port and workspace, so a restart keeps both the address and the stored blobs.
    """

    def __init__(self, workspace: Path, binary: Path | None = None) -> None:
        self.workspace = workspace
        self.binary = binary if binary is not None else find_binary()
        self.port = 0
        self._process: subprocess.Popen[str] | None = None
        self._output: list[str] = []

    @property
    def endpoint(self) -> str:
        if not self.port:
            raise RuntimeError("Azurite has not been started yet")
        return f"http://127.0.0.1:{self.port}/{DEV_ACCOUNT}"

    @property
    def connection_string(self) -> str:
        return connection_string(self.endpoint)

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout: float = 60.0) -> None:
        """Start the emulator and return once it answers HTTP requests."""
        if self.running:
            return
        self.workspace.mkdir(parents=True, exist_ok=True)
        command = [
            str(self.binary),
            "--blobHost", "127.0.0.1",
            "--blobPort", str(self.port),
            "--location", str(self.workspace),
            "--silent",
            "--skipApiVersionCheck",  # the Python SDK may be newer than the emulator
            "--loose",  # ignore headers the emulator does not implement instead of failing
            "--disableTelemetry",  # this machine talks to nothing but loopback and package registries
        ]  # fmt: skip
        self._output = []
        listening = threading.Event()
        process = subprocess.Popen(
            _dying_with_this_process(command),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # a Ctrl-C meant for pytest must not kill it mid-test
        )
        self._process = process

        def pump() -> None:
            # Keep draining the pipe for the process's whole life, so it can never block on a full pipe.
            assert process.stdout is not None
            for line in process.stdout:
                self._output.append(line.rstrip())
                match = _LISTENING.search(line)
                if match:
                    self.port = int(match.group(1))
                    listening.set()
            listening.set()

        threading.Thread(target=pump, name="azurite-output", daemon=True).start()
        deadline = time.monotonic() + timeout
        if not listening.wait(timeout) or not self.port or process.poll() is not None:
            self.stop()
            raise AzuriteUnavailable(f"Azurite did not start: {self._tail()}")
        while not self._answers():
            if time.monotonic() > deadline or process.poll() is not None:
                self.stop()
                raise AzuriteUnavailable(
                    f"Azurite started but does not answer on port {self.port}: {self._tail()}"
                )
            time.sleep(0.05)

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.endpoint}?comp=properties&restype=service", timeout=2):
                return True
        except urllib.error.HTTPError:
            return True  # 403 without credentials: it is up and answering
        except OSError:
            return False

    def _tail(self) -> str:
        return " | ".join(self._output[-10:]) or "(no output)"

    def stop(self) -> None:
        """Stop the emulator (gracefully, then by force); port and workspace are kept for :meth:`start`."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=15)
        if process.stdout is not None:
            process.stdout.close()

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> Azurite:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Attached:
    """An emulator started by someone else (the parent test process, or by hand)."""

    def __init__(self, connection_string: str) -> None:
        self.connection_string = connection_string


class _Session:
    """The process's one emulator (or the reason there is none), created under a lock on first use."""

    lock = threading.Lock()
    emulator: Azurite | _Attached | None = None
    error: AzuriteUnavailable | None = None


def session_azurite() -> Azurite | _Attached:
    """The session's emulator, started on first call; :class:`AzuriteUnavailable` if it cannot run.

    A failure is remembered, so a session without Node does not retry the start for every test.
    """
    with _Session.lock:
        if _Session.emulator is not None:
            return _Session.emulator
        if _Session.error is not None:
            raise _Session.error
        attached = os.environ.get(CONNECTION_STRING_ENV)
        if attached:
            _Session.emulator = _Attached(attached)
            return _Session.emulator
        workspace = Path(tempfile.mkdtemp(prefix="dibs-azurite-"))
        try:
            emulator = Azurite(workspace)
            emulator.start()
        except AzuriteUnavailable as exc:
            shutil.rmtree(workspace, ignore_errors=True)
            _Session.error = exc
            raise

        def shutdown() -> None:
            emulator.stop()
            shutil.rmtree(workspace, ignore_errors=True)

        atexit.register(shutdown)
        # Children started with multiprocessing 'spawn' inherit this and attach instead of starting.
        os.environ[CONNECTION_STRING_ENV] = emulator.connection_string
        _Session.emulator = emulator
        return emulator


def free_port() -> int:
    """A loopback port nobody listens on right now (for tests that need a refused connection)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port

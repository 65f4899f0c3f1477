"""PostgreSQL servers a test may stop, restart or put a pooler in front of (issue 29).

* :class:`ThrowawayPostgres`: a cluster of its own (``initdb`` into a fresh temporary folder, trust
  authentication), served on a free loopback port; :meth:`~ThrowawayPostgres.stop`,
  :meth:`~ThrowawayPostgres.start` and :meth:`~ThrowawayPostgres.restart` with N seconds down (also
  in the background: :meth:`~ThrowawayPostgres.outage`), as a routine restart or a managed failover
  does to its clients. The shared server (``DIBS_TEST_POSTGRES_URL``) is never stopped.
* :class:`PgBouncer`: Debian's ``pgbouncer`` (``scripts/install-pgbouncer.sh``) in ``session`` or
  ``transaction`` mode with **stock settings**: only where the server is, where to listen, and an
  ``auth_file`` with the one user's password (PgBouncer's default ``auth_type = md5`` asks the
  client for it; the server behind trusts PgBouncer). :func:`session_pgbouncer` is one per mode and
  pytest process, in front of the shared server, for the backends of the contract suite.

The postmaster and PgBouncer run in the foreground as children of the test process (not daemonized
by ``pg_ctl start``), started through ``setpriv --pdeathsig`` where it exists, so that a test process
that dies takes them with it instead of leaving them on a shared machine; ``initdb`` creates the
cluster and ``pg_ctl stop -m fast`` stops it (its clients' connections cut, as a restart does). Both
refuse to run as root, so under root they run as the ``postgres`` user (or ``nobody``), in a folder
of their own that user owns. Every wait is for a condition (the server answering, the port
listening), with a generous bound; nothing sleeps a fixed time except an outage, whose length is
the scenario.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from tests.components import free_port
from tests.services import unavailable

__all__ = [
    "BIN_ENV",
    "PGBOUNCER_ENV",
    "Outage",
    "PgBouncer",
    "ThrowawayPostgres",
    "find_pgbouncer",
    "find_postgres_bin",
    "process_connections",
    "session_pgbouncer",
    "throwaway_postgres",
]

#: The folder of PostgreSQL's server programs (``initdb``, ``postgres``, ``pg_ctl``), if not found.
BIN_ENV = "DIBS_PG_BIN"
#: The ``pgbouncer`` executable, if not on PATH or in /usr/sbin.
PGBOUNCER_ENV = "DIBS_PGBOUNCER"
#: Seconds: an upper bound that a working server never reaches; only a broken one hits it.
BOUND = 60.0
INSTALL_HINT = "run scripts/install-pgbouncer.sh (Debian/Ubuntu) or set DIBS_PGBOUNCER"


def find_postgres_bin() -> Path:
    """PostgreSQL's server programs, or a skip (a failure under ``DIBS_REQUIRE_SERVICES=1``)."""
    override = os.environ.get(BIN_ENV)
    candidates = [Path(override)] if override else []
    initdb = shutil.which("initdb")
    if initdb is not None:
        candidates.append(Path(os.path.realpath(initdb)).parent)
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    for folder in candidates:
        if all((folder / name).is_file() for name in ("initdb", "postgres", "pg_ctl")):
            return folder
    unavailable(
        "a throwaway PostgreSQL needs initdb, postgres and pg_ctl (Debian: postgresql); none found on "
        f"PATH or in /usr/lib/postgresql/*/bin; set {BIN_ENV}=/path/to/postgresql/bin"
    )


def find_pgbouncer() -> Path:
    """The ``pgbouncer`` executable, or a skip (a failure under ``DIBS_REQUIRE_SERVICES=1``)."""
    override = os.environ.get(PGBOUNCER_ENV)
    found = override or shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not (os.path.isfile(found) and os.access(found, os.X_OK)):
        unavailable(f"PgBouncer is not installed ({found} is not an executable); {INSTALL_HINT}")
    return Path(found)


def _unprivileged() -> pwd.struct_passwd | None:
    """The user the servers run as when the tests run as root (both refuse root); ``None`` otherwise."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    unavailable("running as root, and there is no 'postgres' or 'nobody' user to run PostgreSQL as")


def _own_folder(prefix: str) -> Path:
    """A fresh temporary folder the servers' user owns (pytest's tmp_path is private to root)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    user = _unprivileged()
    if user is not None:
        os.chown(folder, user.pw_uid, user.pw_gid)
    return folder


def _as_server_user() -> dict[str, Any]:
    """``subprocess`` arguments that run a server program as :func:`_unprivileged`'s user."""
    user = _unprivileged()
    if user is None:
        return {}
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


def _dying_with_this_process(command: list[str]) -> list[str]:
    """``command`` run so that Linux sends it SIGTERM when the test process dies (``setpriv``,
    util-linux; the same as tests/azurite.py), after the switch to the server's user (which would
    clear the signal). Started from :data:`_SPAWNER`'s thread, which lives as long as the process."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or not sys.platform.startswith("linux"):
        return command
    return [setpriv, "--pdeathsig", "TERM", "--", *command]


#: The one thread that starts the servers: Linux's parent-death signal follows the *thread* that
#: started a process, and a server restarted by a background thread (:meth:`ThrowawayPostgres.outage`)
#: would get SIGTERM as soon as that thread ended. This one lives as long as the test process.
_SPAWNER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="server-spawner")


def _spawn(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    """``command`` started by :data:`_SPAWNER` as the servers' user, its output appended to ``log``."""

    def start() -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            return subprocess.Popen(
                _dying_with_this_process(command),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C meant for pytest must not stop it mid-test
                **_as_server_user(),
            )

    return _SPAWNER.submit(start).result()


def _answers(libpq_url: str) -> bool:
    import psycopg

    try:
        psycopg.connect(libpq_url, connect_timeout=2).close()
    except psycopg.OperationalError:
        return False
    return True


def _wait_until_answers(libpq_url: str, process: subprocess.Popen[bytes], log: Path, what: str) -> None:
    deadline = time.monotonic() + BOUND
    while not _answers(libpq_url):
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}:\n{_tail(log)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} does not answer after {BOUND:g}s:\n{_tail(log)}")
        time.sleep(0.05)


def _tail(log: Path, chars: int = 3000) -> str:
    return log.read_text(errors="replace")[-chars:] if log.exists() else "(no log)"


def _end(process: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM) -> None:
    if process is None or process.poll() is not None:
        return
    process.send_signal(sig)
    try:
        process.wait(timeout=BOUND)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=BOUND)


@dataclass
class Outage:
    """A restart in the background (:meth:`ThrowawayPostgres.outage`): ``down`` is set once the
    server is stopped, ``up`` once it answers again; :meth:`join` waits for the end and re-raises."""

    seconds: float
    down: threading.Event = field(default_factory=threading.Event)
    up: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    thread: threading.Thread | None = None

    def join(self) -> None:
        assert self.thread is not None
        self.thread.join(timeout=self.seconds + 2 * BOUND)
        if self.error is not None:
            raise self.error
        assert self.up.is_set(), f"the server did not come back after {self.seconds:g}s down"


class ThrowawayPostgres:
    """A PostgreSQL cluster of its own on 127.0.0.1 (see the module docstring)."""

    def __init__(self, *, settings: dict[str, str] | None = None) -> None:
        self.bin = find_postgres_bin()
        self.folder = _own_folder("dibs-pg-")
        self.data = self.folder / "data"
        self.log = self.folder / "postgres.log"
        self.port = free_port()
        #: Server settings beyond initdb's (``-c name=value``): fsync off, it is thrown away anyway.
        self.settings = {"fsync": "off", "listen_addresses": "127.0.0.1", **(settings or {})}
        self._process: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        initdb = [str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust"]
        result = subprocess.run(
            [*initdb, "-E", "UTF8", "--no-sync", "--no-instructions"],
            check=False,
            capture_output=True,
            text=True,
            timeout=BOUND,
            **_as_server_user(),
        )
        if result.returncode != 0:
            shutil.rmtree(self.folder, ignore_errors=True)
            raise RuntimeError(f"initdb failed ({result.returncode}):\n{result.stdout}{result.stderr}")

    def url(self, database: str = "postgres", **query: str) -> str:
        """The store URL of ``database`` on this server (``query``: URL options, e.g. schema=...)."""
        options = "&".join(f"{name}={value}" for name, value in query.items())
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}" + (
            f"?{options}" if options else ""
        )

    def libpq_url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start the postmaster on its port and return once it accepts connections."""
        if self.running:
            return
        command = [str(self.bin / "postgres"), "-D", str(self.data), "-p", str(self.port)]
        command += ["-k", str(self.folder)]  # its Unix socket in its own folder, not /var/run/postgresql
        for name, value in self.settings.items():
            command += ["-c", f"{name}={value}"]
        self._process = _spawn(command, self.log)
        _wait_until_answers(self.libpq_url(), self._process, self.log, "the throwaway PostgreSQL")

    def stop(self) -> None:
        """Stop the server as a restart does (``pg_ctl stop -m fast``: every client's connection is
        cut, nothing is lost); the data and the port are kept for :meth:`start`."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        subprocess.run(
            [
                str(self.bin / "pg_ctl"),
                "stop",
                "-D",
                str(self.data),
                "-m",
                "fast",
                "-w",
                "-t",
                str(int(BOUND)),
            ],
            check=False,
            capture_output=True,
            timeout=BOUND + 10,
            **_as_server_user(),
        )
        _end(process)

    def restart(self, down: float) -> None:
        """Stop the server, keep it down ``down`` seconds (the outage's length), start it again."""
        self.stop()
        time.sleep(down)
        self.start()
        self.restarts += 1

    def outage(self, down: float) -> Outage:
        """:meth:`restart` in a background thread, so that the test watches its clients meanwhile."""
        outage = Outage(down)

        def run() -> None:
            try:
                self.stop()
                outage.down.set()
                time.sleep(down)
                self.start()
                self.restarts += 1
                outage.up.set()
            except BaseException as exc:  # reported by join()
                outage.error = exc
                outage.down.set()

        outage.thread = threading.Thread(target=run, name=f"outage-{down:g}s", daemon=True)
        outage.thread.start()
        return outage

    def close(self) -> None:
        """Stop the server and remove its folder."""
        with contextlib.suppress(Exception):
            self.stop()
        _end(self._process, signal.SIGKILL)
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> ThrowawayPostgres:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PgBouncer:
    """Debian's PgBouncer in one pool mode, in front of a server, with stock settings (see the module
    docstring). ``server_url`` is the server's store URL: its host and port, and its user (and
    password, if it has one) become the one user of the ``auth_file``."""

    def __init__(self, server_url: str, mode: str, *, settings: dict[str, str] | None = None) -> None:
        assert mode in ("session", "transaction"), mode
        self.binary = find_pgbouncer()
        self.mode = mode
        server = make_url(server_url)
        self.user = server.username or "postgres"
        # The client's password (md5 auth): the server's own if it has one (PgBouncer logs in with it),
        # else one of our own, which the trusting server never asks for.
        self.password = str(server.password) if server.password else f"bouncer-{os.getpid()}-pw"
        self.folder = _own_folder(f"dibs-pgbouncer-{mode}-")
        self.log = self.folder / "pgbouncer.log"
        self.port = free_port()
        (self.folder / "userlist.txt").write_text(f'"{self.user}" "{self.password}"\n')
        lines = [
            "[databases]",
            f"* = host={server.host or '127.0.0.1'} port={server.port or 5432}",
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {self.port}",
            "unix_socket_dir =",
            f"auth_file = {self.folder / 'userlist.txt'}",
            f"pool_mode = {mode}",
            *(f"{name} = {value}" for name, value in (settings or {}).items()),
        ]
        self.ini = self.folder / "pgbouncer.ini"
        self.ini.write_text("\n".join(lines) + "\n")
        user = _unprivileged()
        if user is not None:
            for path in (self.folder / "userlist.txt", self.ini):
                os.chown(path, user.pw_uid, user.pw_gid)
        self._process: subprocess.Popen[bytes] | None = None
        self._database = server.database or "postgres"

    def url(self, database: str | None = None, **query: str) -> str:
        """A store URL through this PgBouncer (``query``: URL options)."""
        options = "&".join(f"{name}={value}" for name, value in query.items())
        base = (
            f"postgresql+psycopg://{self.user}:{self.password}@127.0.0.1:{self.port}/"
            f"{database or self._database}"
        )
        return base + (f"?{options}" if options else "")

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start PgBouncer and return once a client can log in through it (the server must be up)."""
        if self.running:
            return
        self._process = _spawn([str(self.binary), str(self.ini)], self.log)
        libpq = self.url().replace("postgresql+psycopg://", "postgresql://", 1)
        _wait_until_answers(libpq, self._process, self.log, f"PgBouncer ({self.mode} mode)")

    def stop(self) -> None:
        """Stop PgBouncer at once (SIGTERM: its immediate shutdown)."""
        process, self._process = self._process, None
        _end(process)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> PgBouncer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Session:
    lock = threading.Lock()
    bouncers: dict[str, PgBouncer] = {}


def session_pgbouncer(mode: str, server_url: str) -> PgBouncer:
    """The process's PgBouncer in ``mode`` in front of the shared server, started on first use and
    stopped when the process exits (like tests/azurite.py's emulator)."""
    with _Session.lock:
        bouncer = _Session.bouncers.get(mode)
        if bouncer is not None and bouncer.running:
            return bouncer
        bouncer = PgBouncer(server_url, mode)
        bouncer.start()
        atexit.register(bouncer.close)
        _Session.bouncers[mode] = bouncer
        return bouncer


def process_connections(pid: int, ports: dict[str, int]) -> dict[str, int]:
    """How many TCP connections process ``pid`` has open to each of ``ports`` (by name), counted by
    the operating system: what the process really holds, whatever dibs believes it opened."""
    import psutil

    counts = dict.fromkeys(ports, 0)
    by_port = {port: name for name, port in ports.items()}
    for connection in psutil.Process(pid).net_connections(kind="tcp"):
        remote = connection.raddr
        if remote and remote.port in by_port and connection.status == psutil.CONN_ESTABLISHED:
            counts[by_port[remote.port]] += 1
    return counts


@contextlib.contextmanager
def throwaway_postgres(**settings: str) -> Iterator[ThrowawayPostgres]:
    """A started :class:`ThrowawayPostgres`, closed (stopped, its folder removed) afterwards."""
    server = ThrowawayPostgres(settings=settings or None)
    try:
        server.start()
        yield server
    finally:
        server.close()

"""A MariaDB server of a test's own, for settings the shared one (``DIBS_TEST_MYSQL_URL``) must keep.

The shared server keeps MariaDB's stock ``max_allowed_packet`` (16 MB): a value of 8 MB or more is
refused there before it is sent (its hex literal is twice its size), as dibs promises. A test of a
large inline value needs a server that takes it: :func:`throwaway_mariadb` installs a data folder
(``mariadb-install-db``) in a fresh temporary folder and serves it on a free loopback port, with the
settings asked for, started through ``setpriv --pdeathsig`` so that it dies with the test process;
it is stopped and removed afterwards. It needs the server's programs (Debian: ``mariadb-server``,
the package that serves the shared one), and skips with the reason without them (a failure under
``DIBS_REQUIRE_SERVICES=1``).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.components import free_port
from tests.postgres_servers import _dying_with_this_process
from tests.services import unavailable

__all__ = ["throwaway_mariadb"]

#: Seconds: an upper bound that a working server never reaches; only a broken one hits it.
BOUND = 120.0


def _program(*names: str) -> str:
    for name in names:
        found = shutil.which(name) or (f"/usr/sbin/{name}" if Path(f"/usr/sbin/{name}").is_file() else None)
        if found:
            return found
    unavailable(f"a throwaway MariaDB needs {' or '.join(names)} (Debian: mariadb-server)")


@contextlib.contextmanager
def throwaway_mariadb(**settings: str) -> Iterator[str]:
    """A MariaDB server with ``settings`` (``max_allowed_packet="1G"``: option names with ``_``), as the
    store URL of its database ``test``; the server and its folder are gone afterwards."""
    install, server = _program("mariadb-install-db", "mysql_install_db"), _program("mariadbd", "mysqld")
    folder = Path(tempfile.mkdtemp(prefix="dibs-mariadb-"))
    data, socket, log = folder / "data", folder / "mariadb.sock", folder / "mariadb.log"
    port = free_port()
    options = [f"--{name.replace('_', '-')}={value}" for name, value in settings.items()]
    common = ["--no-defaults", f"--datadir={data}", "--user=root"]
    process: subprocess.Popen[bytes] | None = None
    try:
        done = subprocess.run(
            [install, *common, "--auth-root-authentication-method=normal", "--skip-test-db"],
            capture_output=True,
            text=True,
            timeout=BOUND,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed ({done.returncode}):\n{done.stdout}{done.stderr}")
        command = [server, *common, f"--socket={socket}", f"--port={port}", "--bind-address=127.0.0.1"]
        command += ["--skip-grant-tables", "--skip-log-bin", f"--log-error={log}", *options]
        process = subprocess.Popen(
            _dying_with_this_process(command), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )
        import pymysql

        deadline = time.monotonic() + BOUND
        while True:
            try:
                connection = pymysql.connect(host="127.0.0.1", port=port, user="root", connect_timeout=2)
            except pymysql.err.OperationalError:
                if process.poll() is not None or time.monotonic() > deadline:
                    tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
                    raise RuntimeError(f"the throwaway MariaDB did not start:\n{tail}") from None
                time.sleep(0.1)  # polled until it answers, within BOUND
                continue
            with connection, connection.cursor() as cursor:
                cursor.execute("CREATE DATABASE test")
            break
        yield f"mysql+pymysql://root@127.0.0.1:{port}/test"
    finally:
        if process is not None:
            process.terminate()
            try:
                process.wait(timeout=BOUND)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(folder, ignore_errors=True)

"""The PostgreSQL store through PgBouncer with stock settings (issue 29): the isolated schema of
``tests/backends/postgres`` on the shared server, reached through the process's PgBouncer in one pool
mode (:func:`tests.postgres_servers.session_pgbouncer`). The URL names no ``?pooler=``: the store finds
out what it reaches, as it would for a user who wrote none. In transaction mode it has a
``?listen_url=`` to the server itself, as docs/deploy.md says to deploy it (without one its waiters
poll: tests/test_pgbouncer.py tests that too). Not in ``BACKENDS``: the contract suite and
the process races run through it in files of their own (tests/contract/test_pooled_contract.py,
tests/test_pgbouncer.py), so that the rest of the suite does not run three times on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy.engine import make_url

from tests.backends import postgres
from tests.postgres_servers import PgBouncer, session_pgbouncer

#: The pool modes, as backend names (``pgbouncer_transaction``, ``pgbouncer_session``).
MODES = ("transaction", "session")
POOLED_BACKENDS = [f"pgbouncer_{mode}" for mode in MODES]


def through(bouncer: PgBouncer, direct: str, *, listen: bool = False) -> str:
    """``direct`` (a store URL on the server behind ``bouncer``) as it reads through ``bouncer``;
    ``listen``: with a ``?listen_url=`` to the server itself for the hub's ``LISTEN``."""
    pooled = make_url(bouncer.url())
    url = make_url(direct).set(host=pooled.host, port=pooled.port, password=pooled.password)
    if listen:
        server = make_url(direct).set(drivername="postgresql").set(query={})
        url = url.update_query_dict({"listen_url": server.render_as_string(hide_password=False)})
    return url.render_as_string(hide_password=False)


@contextmanager
def isolated_url(tmp_path: Path, mode: str) -> Iterator[str]:
    """A fresh schema on the shared server, through the process's PgBouncer in ``mode``."""
    with postgres.isolated_url(tmp_path) as direct:
        bouncer = session_pgbouncer(mode, postgres.server_url())
        yield through(bouncer, direct, listen=mode == "transaction")

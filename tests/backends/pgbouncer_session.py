"""The PostgreSQL store through PgBouncer in session mode, stock settings.

See tests/backends/pgbouncer.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.backends import pgbouncer


@contextmanager
def isolated_url(tmp_path: Path) -> Iterator[str]:
    with pgbouncer.isolated_url(tmp_path, "session") as url:
        yield url

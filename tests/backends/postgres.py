from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.services import unavailable

URL_ENV = "DIBS_TEST_POSTGRES_URL"


def server_url() -> str:
    url = os.environ.get(URL_ENV)
    if not url:
        unavailable(
            f"PostgreSQL tests need {URL_ENV}, e.g. postgresql+psycopg://postgres@127.0.0.1:5432/test"
        )
    try:
        import psycopg
    except ImportError:
        unavailable("PostgreSQL tests need psycopg: pip install 'dibs[postgres]'")
    try:
        psycopg.connect(_libpq(url), connect_timeout=3).close()
    except psycopg.OperationalError as exc:
        unavailable(f"PostgreSQL at {URL_ENV} does not answer: {str(exc).splitlines()[0]}")
    return url


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


@contextmanager
def isolated_url(tmp_path: Path) -> Iterator[str]:
    """A fresh schema per test, dropped afterwards: reruns never see leftovers."""
    import psycopg

    base = server_url()
    schema = f"dibs_test_{uuid.uuid4().hex[:12]}"
    separator = "&" if "?" in base else "?"
    try:
        yield f"{base}{separator}schema={schema}"
    finally:
        with psycopg.connect(_libpq(base), autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

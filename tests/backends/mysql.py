from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.services import unavailable

URL_ENV = "DIBS_TEST_MYSQL_URL"


@contextmanager
def isolated_url(tmp_path: Path) -> Iterator[str]:
    """A fresh table per test in the given database (MySQL/MariaDB), dropped afterwards."""
    url = os.environ.get(URL_ENV)
    if not url:
        unavailable(f"MySQL/MariaDB tests need {URL_ENV}, e.g. mysql+pymysql://root@127.0.0.1:3306/test")
    try:
        import sqlalchemy as sa
    except ImportError:  # pragma: no cover - SQLAlchemy is a core dependency
        raise
    table = f"dibs_test_{uuid.uuid4().hex[:12]}"
    try:
        engine = sa.create_engine(url)
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except ImportError:
        unavailable("MySQL tests need pymysql: pip install 'dibs[mysql]'")
    except sa.exc.OperationalError as exc:
        unavailable(f"MySQL/MariaDB at {URL_ENV} does not answer: {str(exc.orig).splitlines()[0]}")
    separator = "&" if "?" in url else "?"
    try:
        yield f"{url}{separator}table={table}"
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP TABLE IF EXISTS `{table}`"))
            conn.execute(sa.text(f"DROP TABLE IF EXISTS `{table}_meta`"))
        engine.dispose()

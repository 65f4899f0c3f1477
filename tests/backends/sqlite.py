from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def isolated_url(tmp_path: Path) -> Iterator[str]:
    yield f"sqlite:///{tmp_path / 'dibs.db'}"

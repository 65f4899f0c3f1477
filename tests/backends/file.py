from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def isolated_url(tmp_path: Path) -> Iterator[str]:
    # A directory that does not exist yet: the store creates it (its parent, tmp_path, exists).
    yield f"file://{urllib.parse.quote(str(tmp_path))}/store"

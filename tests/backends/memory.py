from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def isolated_url(tmp_path: Path) -> Iterator[str]:
    yield f"memory://test-{uuid.uuid4().hex}"

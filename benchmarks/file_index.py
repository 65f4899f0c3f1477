"""What the file store's index costs a new key (issue 30): ``acquire`` + ``complete`` of a fresh key on
a store that keeps its index, interleaved call by call with the same on a store that writes none
(:class:`Unindexed`, the write path as it was), both in one folder of the same disk.

``python -m benchmarks.file_index [--ops 400] [--folder /tmp] [--out benchmarks/results/issue30]``

What the index buys the reads is measured by ``python -m benchmarks.history --stores file``. Nothing
here is a threshold: compare the ratio of one run, not runs.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

from benchmarks.history import _interleaved, _new_key
from dibs.records import KeyState
from dibs.stores.file_index import FileIndex, IndexWrite
from dibs.stores.filesystem import FileStore


class _NoIndex(FileIndex):
    """An index no write adds to or removes from."""

    def plan(self, old: KeyState, new: KeyState) -> IndexWrite:
        return IndexWrite()


class Unindexed(FileStore):
    """The file store's write path before the index."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self._index = _NoIndex(self.root)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.file_index", description=__doc__)
    parser.add_argument("--ops", type=int, default=400, help="calls per side")
    parser.add_argument(
        "--folder", type=Path, default=None, help="where the two stores go (a temporary folder)"
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/issue30"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.folder, prefix="dibs-file-index-") as folder:
        indexed, unindexed = FileStore(Path(folder) / "indexed"), Unindexed(Path(folder) / "unindexed")
        with_index, without = _interleaved(_new_key(indexed), _new_key(unindexed), args.ops)
    result = {
        "ops": args.ops,
        "new_key_p50_ms": round(with_index * 1000, 3),
        "new_key_unindexed_p50_ms": round(without * 1000, 3),
        "ratio": round(with_index / without, 2),
        "machine": platform.machine(),
        "when": time.strftime("%Y-%m-%d %H:%M"),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "file-index.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``python -m benchmarks``: see :mod:`benchmarks.main`."""

from __future__ import annotations

if __name__ == "__main__":  # not when multiprocessing's spawn re-imports this module as __mp_main__
    from benchmarks.main import main

    raise SystemExit(main())

"""The fan-in benchmark's event-loop lag (benchmarks/fanin.py): a stall is the lag of every window it
spans, and a window without any tick is unmeasured, never "0 ms"."""

from __future__ import annotations

import pytest

fanin = pytest.importorskip("benchmarks.fanin")
from benchmarks.stats import lag_text  # noqa: E402


def _ticker(*ticks: tuple[float, float]) -> object:
    ticker = fanin._Ticker()
    ticker.samples = [(due, woke, max(0.0, woke - due)) for due, woke in ticks]
    return ticker


def test_a_stall_longer_than_the_window_is_that_windows_lag() -> None:
    # Due at 0.005, woke 0.8 s later: the whole first 0.5 s was that stall.
    ticker = _ticker((0.005, 0.805), (0.81, 0.8101))
    start = ticker.stats(until=0.5)  # type: ignore[attr-defined]
    assert start["ticks"] == 1 and start["worst_ms"] == pytest.approx(800.0)
    assert ticker.stats(since=0.806)["worst_ms"] == pytest.approx(0.1)  # type: ignore[attr-defined]


def test_a_window_without_ticks_is_not_measured_rather_than_no_lag() -> None:
    ticker = _ticker((0.005, 0.006))
    empty = ticker.stats(since=1.0)  # type: ignore[attr-defined]
    assert empty["ticks"] == 0 and empty["worst_ms"] is None and empty["p99_ms"] is None
    assert lag_text(empty["worst_ms"]) == "n/a" and lag_text(12.4) == "12"
    assert fanin._worst([None, 3.0, None]) == 3.0 and fanin._worst([None, None]) is None


def test_full_collections_are_counted_in_their_window() -> None:
    import gc
    import time

    with fanin._FullCollections() as collections:
        before = time.monotonic()
        gc.collect(1)  # a young collection is not a full one
        gc.collect()
    assert collections.count() == 1 and collections.count(since=before) == 1
    assert collections.count(until=before) == 0
    assert collections._seen not in gc.callbacks

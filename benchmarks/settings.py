"""How big each benchmark is in the full run and in the smoke run (CI's, under a minute)."""

from __future__ import annotations

import dataclasses

__all__ = ["FULL", "SMOKE", "Settings"]


@dataclasses.dataclass(frozen=True)
class Settings:
    name: str
    #: 1. uncontended overhead: rounds x keys per (kind, store), kinds interleaved round by round
    overhead_rounds: int
    overhead_batch: int
    overhead_warmup: int
    #: 2. hand-off: waiter process counts, and rounds per count (each round: one key, N waiters)
    handoff_waiters: tuple[int, ...]
    handoff_rounds: dict[int, int]
    handoff_hold: tuple[float, float]
    #: waiter counts for the Prefect anchors (Prefect takes seconds to import in each worker)
    prefect_waiters: tuple[int, ...]
    #: Prefect's lock managers (and DibsLockManager) after their holder's SIGKILL: repetitions per
    #: manager (0: not run; each starts a process that imports Prefect) and how long a waiter asks
    lock_kill_repeats: int
    lock_kill_window: float
    #: 3. contention: P processes x K keys, repeated (dibs and raw interleaved)
    contention_processes: int
    contention_keys: int
    #: fewer keys for stores too slow for K in reasonable time (Azurite: one Node process, ~10 keys/s)
    contention_keys_by_store: dict[str, int]
    contention_repeats: int
    contention_lockstep: bool
    #: 4. takeover after SIGKILL: ttl and repetitions
    takeover_ttl: float
    takeover_repeats: int
    #: 5. waiter load: how long each waiter waits, and the waiters of a "many waiters" process
    waiter_seconds: float
    waiter_threads: int
    #: 6. start-up: subprocess runs per command; a fresh process's first reservation on PostgreSQL:
    #: what the orchestrator imported before ("prefect", "airflow", "none"), processes per kind, and
    #: repetitions of four processes starting at once (and whether also on existing tables)
    startup_runs: int
    startup_pre: tuple[str, ...]
    startup_first_runs: int
    startup_together_runs: int
    startup_together_existing: bool
    #: 7. fan-in: waiter counts (async waiters in one event loop), rounds per count, the stores
    #: measured (fewer counts for slow ones), the idle-loop baseline and a case's time limit (s)
    fanin_counts: tuple[int, ...]
    fanin_rounds: dict[int, int]
    fanin_stores: tuple[str, ...]
    fanin_counts_by_store: dict[str, tuple[int, ...]]
    fanin_idle: float
    fanin_timeout: float
    #: and once more for the largest count on one key, the holder completing this long after the
    #: waiters wait (their backstop questions then come at their cap, not at their start); 0: not run
    fanin_late_hold: float
    #: 9. large-artifact hand-off through a payload store: (bytes, rounds) per case
    payload_sizes: tuple[tuple[int, int], ...]
    #: 10. Redis topologies: hand-off waiter counts and rounds per count (each round: one key on each
    #: topology, interleaved), and reserve + complete keys per topology
    topology_waiters: tuple[int, ...]
    topology_rounds: dict[int, int]
    topology_ops: int


FULL = Settings(
    name="full",
    overhead_rounds=12,
    overhead_batch=100,
    overhead_warmup=10,
    handoff_waiters=(1, 4, 16),
    handoff_rounds={1: 40, 4: 16, 16: 8},
    handoff_hold=(0.05, 0.25),
    prefect_waiters=(1, 4, 16),
    lock_kill_repeats=3,
    lock_kill_window=5.0,
    contention_processes=8,
    contention_keys=1000,
    contention_keys_by_store={"azure": 200},
    contention_repeats=3,
    contention_lockstep=True,
    takeover_ttl=1.0,
    takeover_repeats=8,
    waiter_seconds=40.0,
    waiter_threads=50,
    startup_runs=30,
    startup_pre=("prefect", "airflow", "none"),
    startup_first_runs=5,
    startup_together_runs=3,
    startup_together_existing=True,
    fanin_counts=(1, 10, 100, 1000),
    fanin_rounds={1: 20, 10: 5, 100: 2, 1000: 1},
    fanin_stores=("sqlite", "postgres", "mysql", "redis", "azure", "file"),
    fanin_counts_by_store={"azure": (1, 10, 100)},
    fanin_idle=0.3,
    fanin_timeout=300.0,
    fanin_late_hold=20.0,
    payload_sizes=((1 << 20, 7), (100 << 20, 5), (1 << 30, 3)),
    topology_waiters=(1, 4, 16),
    topology_rounds={1: 40, 4: 16, 16: 8},
    topology_ops=400,
)

SMOKE = Settings(
    name="smoke",
    overhead_rounds=1,
    overhead_batch=10,
    overhead_warmup=2,
    handoff_waiters=(1, 2),
    handoff_rounds={1: 2, 2: 1},
    handoff_hold=(0.03, 0.06),
    prefect_waiters=(1,),
    lock_kill_repeats=0,
    lock_kill_window=1.0,
    contention_processes=2,
    contention_keys=20,
    contention_keys_by_store={},
    contention_repeats=1,
    contention_lockstep=False,
    takeover_ttl=0.5,
    takeover_repeats=1,
    waiter_seconds=2.0,
    waiter_threads=5,
    startup_runs=1,
    startup_pre=("none",),
    startup_first_runs=1,
    startup_together_runs=1,
    startup_together_existing=False,
    fanin_counts=(1, 100),
    fanin_rounds={1: 2, 100: 1},
    fanin_stores=("sqlite", "postgres", "redis"),
    fanin_counts_by_store={},
    fanin_idle=0.05,
    fanin_timeout=120.0,
    fanin_late_hold=0.0,
    payload_sizes=((1 << 20, 2),),
    topology_waiters=(1, 2),
    topology_rounds={1: 3, 2: 2},
    topology_ops=20,
)

"""The hypothesis model test (``tests/unit/test_stateful.py``) on every store of ``tests/backends``.

Random sequences of acquire, heartbeat, complete, release, force-release and forget, each answer
compared with a naive model of the contract. Every run (one hypothesis example) uses a namespace of
its own on one isolated store, so runs cannot see each other's keys. Expiry is not exercised here
(real clocks, a ttl no test outlives): the in-memory run with a fake clock covers it. Slow stores run
fewer examples to keep the suite's time modest; ``DIBS_FULL=1`` runs every store at the full size.
"""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test
from tests.services import full_size
from tests.unit.test_stateful import StoreModel

from dibs.stores import Store, open_store

#: Examples (runs of up to STEPS operations) per store: the network stores are the slow ones.
EXAMPLES = {
    "memory": 60,
    "sqlite": 50,
    "postgres": 40,
    "mysql": 40,
    "redis": 40,
    "file": 40,
    "azure": 20,
    # The same store and scripts as "redis", routed through a cluster client or a Sentinel's master.
    "redis_cluster": 20,
    "redis_cluster_tagged": 20,
    "redis_sentinel": 20,
}
FULL_EXAMPLES = 100
STEPS = 25


def test_every_store_matches_the_model(request: pytest.FixtureRequest, store_url: str) -> None:
    backend = request.node.callspec.params["store_url"]
    shared = open_store(store_url)

    class OnThisStore(StoreModel):
        ttl = 3600.0
        controls_time = False

        def make_store(self) -> Store:
            return shared

        def namespace(self) -> str:
            return f"model.run-{uuid.uuid4().hex[:12]}"

        def teardown(self) -> None:  # the store is shared by every run of this test
            pass

    try:
        run_state_machine_as_test(
            OnThisStore,
            settings=settings(
                max_examples=FULL_EXAMPLES if full_size() else EXAMPLES[backend],
                stateful_step_count=STEPS,
                deadline=None,
                database=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
    finally:
        shared.close()

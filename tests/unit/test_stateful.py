"""Hypothesis drives random sequences of store operations and compares every answer with a model.

The model below is deliberately naive (a dict per key, written from the contract's words, not from
``dibs.stores.transitions``), so a shared mistake in the state machine and its tests cannot hide.
It runs here against the in-memory store with a fake clock (so expiry is exercised) and against
SQLite's native SQL statements (with a ttl no test outlives); ``tests/contract/test_store_model.py``
runs the same machine on every store of ``tests/backends``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dibs.errors import LeaseLost
from dibs.keys import Key
from dibs.records import Granted, Held, LeaseToken, Present, checksum
from dibs.stores import AcquireRequest, NewArtifact, Store
from dibs.stores.memory import MemoryStore
from dibs.stores.sql import SQLStore

NAMES = ["a", "b"]
OWNERS = ["alice", "bob", "carol"]


@dataclasses.dataclass
class ModelKey:
    fence: int = 0
    owner: str | None = None
    token: LeaseToken | None = None
    expires_at: float = 0.0
    artifact: bytes | None = None
    failures: int = 0


class StoreModel(RuleBasedStateMachine):
    ttl = 10.0
    controls_time = True

    def __init__(self) -> None:
        super().__init__()
        self.now = 1_800_000_000.0
        self.store = self.make_store()
        self.keys = {name: Key(self.namespace(), name) for name in NAMES}
        self.model = {key: ModelKey() for key in self.keys.values()}
        self.tokens: list[tuple[Key, LeaseToken]] = []

    def make_store(self) -> Store:
        return MemoryStore(clock=lambda: self.now)

    def namespace(self) -> str:
        """The namespace of this run's keys (a store shared between runs needs a fresh one each)."""
        return "model"

    def teardown(self) -> None:
        self.store.close()

    def _live(self, m: ModelKey) -> bool:
        return m.token is not None and (not self.controls_time or self.now < m.expires_at)

    @rule(name=st.sampled_from(NAMES), owner=st.sampled_from(OWNERS))
    def acquire(self, name: str, owner: str) -> None:
        key = self.keys[name]
        m = self.model[key]
        outcome = self.store.acquire(key, AcquireRequest(owner, self.ttl))
        if m.artifact is not None:
            assert isinstance(outcome, Present) and outcome.artifact.verified_payload(key) == m.artifact
        elif m.token is not None and m.owner == owner:
            assert isinstance(outcome, Granted) and outcome.lease.token == m.token
            m.expires_at = self.now + self.ttl
        elif self._live(m):
            assert isinstance(outcome, Held) and outcome.lease.owner == m.owner
        else:
            assert isinstance(outcome, Granted), outcome
            m.fence += 1
            assert outcome.lease.token.fence == m.fence
            m.owner, m.token, m.expires_at = owner, outcome.lease.token, self.now + self.ttl
            self.tokens.append((key, outcome.lease.token))

    def _current(self, key: Key, token: LeaseToken) -> bool:
        m = self.model[key]
        return m.artifact is None and m.token == token

    @precondition(lambda self: self.tokens)
    @rule(pick=st.integers(min_value=0), action=st.sampled_from(["heartbeat", "complete", "release", "fail"]))
    def use_a_token(self, pick: int, action: str) -> None:
        key, token = self.tokens[pick % len(self.tokens)]
        m = self.model[key]
        accepted = self._current(key, token)
        payload = f"{key.name}:{token.fence}".encode()
        try:
            if action == "heartbeat":
                self.store.heartbeat(key, token, self.ttl)
            elif action == "complete":
                self.store.complete(key, token, NewArtifact("bytes", payload, checksum(payload)))
            else:
                self.store.release(key, token, "boom" if action == "fail" else None)
        except LeaseLost:
            assert not accepted, f"{action} with the current token was refused"
            return
        assert accepted, f"{action} with a stale token was accepted"
        if action == "heartbeat":
            m.expires_at = self.now + self.ttl
            return
        m.owner = m.token = None
        if action == "complete":
            m.artifact = payload
        elif action == "fail":
            m.failures += 1

    @rule(name=st.sampled_from(NAMES))
    def force_release(self, name: str) -> None:
        key = self.keys[name]
        m = self.model[key]
        assert self.store.force_release(key) is (m.token is not None)
        m.owner = m.token = None

    @rule(name=st.sampled_from(NAMES))
    def forget(self, name: str) -> None:
        key = self.keys[name]
        m = self.model[key]
        assert self.store.forget(key) is (m.artifact is not None or m.failures > 0)
        m.artifact, m.failures = None, 0

    @precondition(lambda self: self.controls_time)
    @rule(seconds=st.sampled_from([0.5, 4.0, 9.9, 10.0, 30.0]))
    def advance_time(self, seconds: float) -> None:
        self.now += seconds

    @invariant()
    def store_matches_model(self) -> None:
        for key, m in self.model.items():
            state = self.store.read(key)
            assert state.fence == m.fence
            assert (state.lease.token if state.lease else None) == m.token
            assert (state.lease.owner if state.lease else None) == m.owner
            stored: Any = state.artifact.verified_payload(key) if state.artifact else None
            assert stored == m.artifact
            assert (state.failure.count if state.failure else 0) == m.failures


class SQLiteStoreModel(StoreModel):
    ttl = 3600.0
    controls_time = False

    def make_store(self) -> Store:
        self._folder = TemporaryDirectory()
        return SQLStore(f"sqlite:///{Path(self._folder.name) / 'model.db'}")

    def teardown(self) -> None:
        super().teardown()
        self._folder.cleanup()


TestMemoryStoreAgainstModel = StoreModel.TestCase
TestMemoryStoreAgainstModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestSQLiteStoreAgainstModel = SQLiteStoreModel.TestCase
TestSQLiteStoreAgainstModel.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)

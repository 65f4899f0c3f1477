"""A read that left a large artifact's bytes out is made whole in one place for every store
(:mod:`dibs.stores.large`): the store brings its own read of the bytes; these tests count those
reads with a fake one."""

from __future__ import annotations

import dataclasses

import pytest

from dibs.errors import StoreUnavailable
from dibs.keys import Key
from dibs.records import ArtifactRecord, KeyState
from dibs.stores.large import READ_AGAIN, READ_INLINE, LargeReads, read_settled

KEY = Key("large-reads", "k")
BIG = READ_INLINE + 1


def _artifact(size: int, payload: bytes = b"", fence: int = 1) -> ArtifactRecord:
    return ArtifactRecord(
        serializer="bytes", payload=payload, size=size, checksum="c", producer="p", fence=fence, created_at=0
    )


class _Reads:
    """The store's own read: counted; ``None`` (another artifact by now) while ``moved`` says so."""

    def __init__(self, moved: bool = False) -> None:
        self.calls: list[tuple[Key, int]] = []
        self.moved = moved

    def __call__(self, key: Key, artifact: ArtifactRecord) -> bytes | None:
        self.calls.append((key, artifact.fence))
        return None if self.moved else b"x" * artifact.size


def test_a_small_or_carried_artifact_is_handed_back_as_it_is_without_a_read() -> None:
    reads = _Reads()
    large = LargeReads(reads)
    small = KeyState(KEY, now=0.0, artifact=_artifact(READ_INLINE))
    carried = KeyState(KEY, now=0.0, artifact=_artifact(BIG, payload=b"y" * BIG))
    empty = KeyState(KEY, now=0.0)
    assert large.state(small) is small
    assert large.state(carried) is carried
    assert large.state(empty) is empty
    assert reads.calls == []


def test_a_large_artifact_left_out_is_read_apart_and_put_in_its_state() -> None:
    reads = _Reads()
    state = KeyState(KEY, now=0.0, fence=1, artifact=_artifact(BIG))
    whole = LargeReads(reads).state(state)
    assert whole is not None and whole.artifact is not None
    assert whole.artifact.payload == b"x" * BIG
    assert dataclasses.replace(whole, artifact=state.artifact) == state  # nothing else changed
    assert reads.calls == [(KEY, 1)]


def test_a_large_artifact_replaced_meanwhile_is_none_so_the_caller_reads_again() -> None:
    large = LargeReads(_Reads(moved=True))
    assert large.artifact(KEY, _artifact(BIG)) is None
    assert large.state(KeyState(KEY, now=0.0, artifact=_artifact(BIG))) is None


def test_read_settled_reads_again_while_the_artifact_moves_then_says_the_store_is_unavailable() -> None:
    answers: list[str | None] = [None, None, "found"]
    assert read_settled(KEY, lambda: answers.pop(0)) == "found"
    assert answers == []
    calls: list[None] = []
    with pytest.raises(StoreUnavailable, match="kept changing while reading its artifact"):
        read_settled(KEY, lambda: calls.append(None))
    assert len(calls) == READ_AGAIN

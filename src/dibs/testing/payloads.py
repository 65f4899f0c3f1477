"""The payload store contract as tests: what a payload store (dibs's folder, fsspec and Azure ones, or
one written outside dibs for S3, GCS or a company's blob service) must pass, shipped as
:mod:`dibs.testing.contract` is for record stores.

It needs pytest (a test-time dependency: dibs itself never imports it, nor this module). Subclass
:class:`PayloadStoreContract` in a test module of your own and give it one fixture,
``open_payload_store``: a callable that opens a new client of your payload store on one isolated
space (every call the same space, empty at the start of the test), so that a test can play a writer
and a collector. Close what it opened when the test ends::

    import pytest
    from dibs.payloads.files import FilePayloadStore
    from dibs.testing.payloads import PayloadStoreContract, opened_payload_stores

    class TestMyPayloadStore(PayloadStoreContract):
        @pytest.fixture
        def open_payload_store(self, tmp_path):
            with opened_payload_stores(lambda: FilePayloadStore(tmp_path / "payloads")) as opener:
                yield opener

Two more fixtures are optional, and the tests that need them skip without them: ``tamper(sha256,
data)`` replaces the bytes of every copy of a payload behind the store's back (a failing disk, an
edit), and ``plant(sha256, kind)`` puts something that is no payload (``"fifo"``, ``"directory"``,
``"symlink"``) where the store would look for a copy (stores on a file system). ``grace`` (a class
attribute, seconds) covers how coarse the store's times are (Azure's are whole seconds).

What it checks (see :mod:`dibs.payloads.base` and :mod:`dibs.payloads.collect`):

* a put reads back whole by its digest, identical puts are one payload, names are digests only;
* **the bargain that makes collection safe**: a put never gives back a copy that a removal decided
  before it may take, whether the removal runs after the put returned or at any moment during it;
* collection, end to end through :func:`dibs.payloads.collect.collect` with a record store, never
  loses a payload a record refers to or a writer is about to publish, with the collector paused
  after listing the records and before removing a copy while another key publishes the same bytes;
  it removes what nothing refers to, and the older copies of what something does;
* damage is found and never served: other bytes at the recorded size, fewer, more; a damaged copy
  is removed as it is found, so the next put makes a good one; nothing that is not a regular
  file or object is ever opened in a way that blocks;
* a payload that is not there is :class:`~dibs.payloads.PayloadUnavailable`, never another error.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

import dibs
from dibs.payloads import (
    Freed,
    Payload,
    PayloadDamaged,
    PayloadStore,
    PayloadUnavailable,
    ReferencingStore,
    StoredPayload,
)
from dibs.payloads.collect import collect
from dibs.payloads.verify import read_verified, spool_verified
from dibs.stores.memory import MemoryStore
from dibs.testing._opening import opened

__all__ = ["PayloadStoreContract", "opened_payload_stores"]

P = TypeVar("P", bound=PayloadStore)

SIZE = 300_000  # several chunks of a writer's, over any inline limit
#: How long a test waits for something that normally takes a second (a blocked call, a clock).
PATIENCE = 60.0


@contextlib.contextmanager
def opened_payload_stores(open_one: Callable[[], P]) -> Iterator[Callable[[], P]]:
    """A callable that opens a payload store with ``open_one`` each time it is called; every store it
    opened is closed when the block ends. What an ``open_payload_store`` fixture yields."""
    with opened(open_one) as opener:
        yield opener


def _bytes(seed: str, size: int = SIZE) -> bytes:
    """``size`` bytes that only ``seed`` makes (identical across writers, different across seeds)."""
    block = uuid.uuid5(uuid.NAMESPACE_OID, seed).bytes * 64
    return (block * (size // len(block) + 1))[:size]


def _read(store: PayloadStore, payload: Payload) -> bytes:
    return read_verified(store, payload, store.uri(payload.sha256))


def _older_than_grace(store: PayloadStore, sha256: str, grace: float) -> None:
    """Wait until every copy of the payload is older than ``grace`` by this machine's clock (the one a
    collection starts by), so that a collection may take it."""
    deadline = time.monotonic() + PATIENCE
    newest = max(found.modified for found in store.copies(sha256))
    while time.time() - grace <= newest + 0.001:
        assert time.monotonic() < deadline, "the clock never passed the payload's time"
        time.sleep(0.02)


class _Paused:
    """Runs ``meanwhile`` at one step of a collection, once, before the step goes on: the collector
    paused there (a SIGSTOP, a slow disk) while another process acts."""

    def __init__(self, meanwhile: Callable[[], object]) -> None:
        self.meanwhile = meanwhile
        self.times = 0

    def around(self, step: Callable[..., Any], *, before: bool) -> Callable[..., Any]:
        def paused(*args: Any, **kwargs: Any) -> Any:
            if before and not self.times:
                self.times += 1
                self.meanwhile()
            answer = step(*args, **kwargs)
            if not before and not self.times:
                self.times += 1
                answer = list(answer)  # a lazy listing: paused once it really ran
                self.meanwhile()
            return answer

        return paused


class PayloadStoreContract:
    """Every test of the payload store contract. Subclass it (named ``Test...``, so pytest collects
    it) and provide ``open_payload_store``: see the module's docstring."""

    #: Seconds by which a collection's rule judges times (see :mod:`dibs.payloads.collect`): enough
    #: for the store's own time resolution (whole seconds for Azure's Last-Modified).
    grace: float = 0.05
    #: Rounds of the racing test (each a put racing removals decided before it).
    race_rounds: int = 20

    @pytest.fixture
    def open_payload_store(self) -> Iterator[Callable[[], PayloadStore]]:
        """Opens payload stores on one isolated space, empty at the start; override it."""
        raise NotImplementedError(
            "give the contract an open_payload_store fixture (see dibs.testing.payloads)"
        )
        yield  # pragma: no cover

    @pytest.fixture
    def payloads(self, open_payload_store: Callable[[], PayloadStore]) -> PayloadStore:
        return open_payload_store()

    @pytest.fixture
    def tamper(self) -> Callable[[PayloadStore, str, bytes], None]:
        """Replaces the bytes of every copy of a payload behind the store's back; optional."""
        pytest.skip("the store's tests give no tamper fixture (replace a payload's bytes behind its back)")

    @pytest.fixture
    def plant(self) -> Callable[[PayloadStore, str, str], None]:
        """Puts a FIFO, a directory or a symlink where a copy of a payload would be; optional."""
        pytest.skip("the store's tests give no plant fixture (a FIFO, a directory, a symlink at a copy)")

    # -- putting and reading ------------------------------------------------------------------------
    def test_a_put_reads_back_whole_by_its_digest(self, payloads: PayloadStore) -> None:
        import hashlib
        import io

        data = _bytes("round trip")
        put = payloads.put(data, "json")
        assert (put.sha256, put.size, put.serializer) == (hashlib.sha256(data).hexdigest(), SIZE, "json")
        assert payloads.put_stream(io.BytesIO(data), "json") == put
        assert _read(payloads, put) == data
        with spool_verified(payloads, put, payloads.uri(put.sha256)) as spooled:
            assert spooled.read() == data
        found = payloads.stat(put.sha256)
        assert found is not None and (found.sha256, found.size) == (put.sha256, SIZE)
        copies = payloads.copies(put.sha256)
        assert copies and all(copy.sha256 == put.sha256 and copy.size == SIZE for copy in copies)
        assert {copy.copy for copy in copies} <= {listed.copy for listed in payloads.list()}
        assert payloads.uri(put.sha256) and "://" in payloads.url

    def test_identical_puts_are_one_payload(self, open_payload_store: Callable[[], PayloadStore]) -> None:
        one, other = open_payload_store(), open_payload_store()
        data = _bytes("identical")
        first, second = one.put(data), other.put(data)
        assert first == second
        assert {found.sha256 for found in one.list()} == {first.sha256}
        assert _read(other, first) == data

    def test_a_payload_that_is_not_there_is_unavailable_and_nothing_else(
        self, payloads: PayloadStore
    ) -> None:
        missing = "0" * 64
        with pytest.raises(PayloadUnavailable):
            payloads.open(missing)
        with pytest.raises(PayloadUnavailable):
            _read(payloads, Payload(missing, 10))
        assert payloads.stat(missing) is None and payloads.copies(missing) == []
        assert payloads.delete(missing, unchanged_since=float("inf")) == 0
        put = payloads.put(_bytes("gone"))
        copies = payloads.copies(put.sha256)
        removed = [payloads.remove(copy) for copy in copies]
        assert sum(r.copies for r in removed) == len(copies) and sum(r.bytes for r in removed) == SIZE
        assert payloads.copies(put.sha256) == []
        assert [payloads.remove(copy) for copy in copies] == [Freed()] * len(copies)  # gone: nothing
        with pytest.raises(PayloadUnavailable):
            payloads.open(put.sha256)

    @pytest.mark.parametrize("name", ["../../etc/passwd", "A" * 64, "a" * 63, "a" * 64 + "\n", ""])
    def test_a_payload_is_named_only_by_a_sha256(self, payloads: PayloadStore, name: str) -> None:
        for call in (payloads.uri, payloads.open, payloads.copies):
            with pytest.raises(ValueError, match="not a SHA-256"):
                call(name)

    def test_delete_keeps_what_was_written_since(self, payloads: PayloadStore) -> None:
        put = payloads.put(_bytes("delete"))
        written = max(found.modified for found in payloads.copies(put.sha256))
        assert payloads.delete(put.sha256, unchanged_since=written) == 0  # written at that time: kept
        assert _read(payloads, put) == _bytes("delete")
        assert payloads.delete(put.sha256, unchanged_since=float("inf")) > 0
        assert payloads.copies(put.sha256) == []

    # -- the bargain: a put is never taken by a removal decided before it ----------------------------
    def test_a_put_is_never_taken_by_a_removal_decided_before_it(
        self, open_payload_store: Callable[[], PayloadStore]
    ) -> None:
        collector, writer = open_payload_store(), open_payload_store()
        data = _bytes("decided before")
        first = writer.put(data)
        decided = collector.copies(first.sha256)  # the collector's listing: these copies may go...
        again = writer.put(data)  # ... a writer puts the same bytes meanwhile ...
        for copy in decided:  # ... and the collector, resumed, removes what it listed
            collector.remove(copy)
        assert _read(writer, again) == data  # the writer's payload is there

    def test_removals_decided_before_a_put_never_take_it_whatever_the_interleaving(
        self, open_payload_store: Callable[[], PayloadStore]
    ) -> None:
        """The same, with the removals running at random moments during the put, in another thread:
        whatever steps the put has, none may hand its payload to a removal decided before it."""
        collector, writer = open_payload_store(), open_payload_store()
        data = _bytes("interleaved")
        rng = random.Random(31)
        for _ in range(self.race_rounds):
            decided = collector.copies(writer.put(data).sha256)
            jitter = [rng.uniform(0, 0.02) for _ in decided]  # only spreads the removals over the put
            remover = threading.Thread(target=_remove_after, args=(collector, decided, jitter))
            remover.start()
            again = writer.put(data)
            remover.join(PATIENCE)
            assert not remover.is_alive()
            assert _read(writer, again) == data

    # -- collection, end to end ----------------------------------------------------------------------
    @contextlib.contextmanager
    def _collecting(
        self, open_payload_store: Callable[[], PayloadStore]
    ) -> Iterator[tuple[dibs.Reservations, ReferencingStore, PayloadStore, PayloadStore]]:
        """A client whose artifacts all go to a payload store (``inline_limit=0``), its referencing
        store, the payload store it writes through, and a second one opened on the same payloads for
        the collector, as another process would open it."""
        writer_side, collector_side = open_payload_store(), open_payload_store()
        records = MemoryStore(f"payload-contract-{uuid.uuid4().hex}")
        store = ReferencingStore(records, writer_side, inline_limit=0, grace=self.grace)
        with dibs.Reservations(store, serializer="bytes", ttl=60) as client:
            yield client, store, writer_side, collector_side

    def _unreferenced(self, client: dibs.Reservations, seed: str) -> Payload:
        """A payload of ``seed``'s bytes that no record refers to any more, older than the grace."""
        store = client.store
        assert isinstance(store, ReferencingStore)
        client.run(f"first/{seed}", lambda: _bytes(seed))
        client.compute(f"first/{seed}", lambda: _bytes(f"{seed} replaced"), refresh=True)
        put = store.payloads.put(_bytes(seed))  # its digest, as the first key stored it
        _older_than_grace(store.payloads, put.sha256, self.grace)
        return put

    @pytest.mark.parametrize("step", ["after listing the records", "before removing a copy"])
    def test_a_paused_collection_never_loses_a_payload_published_meanwhile(
        self, open_payload_store: Callable[[], PayloadStore], step: str
    ) -> None:
        with self._collecting(open_payload_store) as (client, store, writer_side, collector_side):
            put = self._unreferenced(client, "paused")
            published: list[dibs.RunReport] = []
            # Another key publishes the same bytes while the collector is paused at ``step``.
            paused = _Paused(lambda: published.append(client.compute("second", lambda: _bytes("paused"))))
            if step == "after listing the records":
                records: Any = _Listing(store.records, paused)
            else:
                records = store.records
                collector_side.remove = paused.around(collector_side.remove, before=True)  # type: ignore[method-assign]
            collect(records, collector_side, grace=self.grace)
            assert paused.times == 1, f"the collection never came to {step}"
            assert [(report.role, report.stored) for report in published] == [("computed", True)]
            again = client.compute("second", lambda: b"never")
            assert (again.role, again.value) == ("hit", _bytes("paused"))  # not a miss: it is there
            assert _read(writer_side, put) == _bytes("paused")

    def test_a_payload_written_under_a_lease_is_kept_until_it_is_published(
        self, open_payload_store: Callable[[], PayloadStore]
    ) -> None:
        with self._collecting(open_payload_store) as (client, store, writer_side, collector_side):
            got = client.acquire("held", timeout=0)
            assert isinstance(got, dibs.Acquired)
            put = writer_side.put(_bytes("held"))  # put, not yet published: nothing refers to it
            _older_than_grace(writer_side, put.sha256, self.grace)
            collect(store.records, collector_side, grace=self.grace)  # the live lease keeps it
            got.lease.complete(put)
            assert client.run("held", lambda: b"never") == _bytes("held")

    def test_a_collection_removes_what_nothing_refers_to_and_the_older_copies(
        self, open_payload_store: Callable[[], PayloadStore]
    ) -> None:
        with self._collecting(open_payload_store) as (client, store, writer_side, collector_side):
            gone = self._unreferenced(client, "gone")
            for key in ("kept", "kept again", "kept once more"):  # one payload, written three times
                client.run(key, lambda: _bytes("kept"))
            kept = writer_side.put(_bytes("kept"))
            _older_than_grace(writer_side, kept.sha256, self.grace)
            collect(store.records, collector_side, grace=self.grace)
            assert writer_side.copies(gone.sha256) == []
            assert len(writer_side.copies(kept.sha256)) == 1  # the latest copy, of any
            for key in ("kept", "kept again", "kept once more"):
                assert client.run(key, lambda: b"never") == _bytes("kept")

    # -- damage ----------------------------------------------------------------------------------------
    @pytest.mark.parametrize("damage", ["other bytes at its size", "fewer bytes", "more bytes"])
    def test_damage_is_found_never_served_and_the_next_put_makes_it_good(
        self, payloads: PayloadStore, tamper: Callable[[PayloadStore, str, bytes], None], damage: str
    ) -> None:
        data = _bytes("damaged")
        put = payloads.put(data)
        bad = {
            "other bytes at its size": _bytes("another value"),
            "fewer bytes": data[: SIZE // 2],
            "more bytes": data + b"!",
        }[damage]
        tamper(payloads, put.sha256, bad)
        with pytest.raises(PayloadUnavailable) as found:
            _read(payloads, put)
        if damage != "fewer bytes":  # fewer may be a stream that ended early: not known bad
            assert isinstance(found.value, PayloadDamaged)
        with pytest.raises(PayloadUnavailable):
            spool_verified(payloads, put, payloads.uri(put.sha256))
        # Found bad, so the next writer's copy is good: the damaged one went as it was found (or, of
        # another size, was never taken for this payload).
        assert _read(payloads, payloads.put(data)) == data

    @pytest.mark.parametrize("kind", ["fifo", "directory", "symlink"])
    def test_nothing_but_a_regular_file_is_a_copy_and_nothing_blocks(
        self, payloads: PayloadStore, plant: Callable[[PayloadStore, str, str], None], kind: str
    ) -> None:
        data = _bytes("planted")
        put = payloads.put(data)
        plant(payloads, put.sha256, kind)
        outcome: list[object] = []
        reader = threading.Thread(target=lambda: outcome.append(_read_or_miss(payloads, put)), daemon=True)
        reader.start()
        reader.join(PATIENCE)
        assert not reader.is_alive(), f"a read blocked on the {kind} where a copy was"
        assert outcome == ["missing"]
        again = payloads.put(data)  # the next writer makes its copy beside it
        assert _read(payloads, again) == data


def _remove_after(store: PayloadStore, decided: list[StoredPayload], pauses: list[float]) -> None:
    for copy, pause in zip(decided, pauses, strict=True):
        time.sleep(pause)
        store.remove(copy)


def _read_or_miss(store: PayloadStore, payload: Payload) -> bytes | str:
    try:
        return _read(store, payload)
    except PayloadUnavailable:
        return "missing"


class _Listing:
    """A record store whose ``list`` pauses (runs ``paused.meanwhile``) once it has listed: a
    collector paused between listing the records and listing the payloads' copies."""

    def __init__(self, records: Any, paused: _Paused) -> None:
        self._records = records
        self.url = records.url
        self.list = paused.around(records.list, before=False)

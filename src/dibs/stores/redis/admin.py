"""The Redis store's reads a person makes and its removals, found through the indexes (:mod:`.index`).

Each read walks the sorted sets of the namespaces it covers as far as its answer needs, then reads
the records they name with pipelined read scripts (one pipeline per node, as ``read_many`` does):

* a page walks the class ranges of ``cls`` its status can be in (every class without one), merged in
  key order from the cursor, and keeps the records whose status is asked for; what it skips is bounded
  by live work (an expired lease on a ``held`` page, a live one on a ``done`` page), not history;
* the held leases walk the expiry sets up from the server's clock, the expired ones down from it;
* the latest artifacts and failures walk ``art`` and ``fail`` from the newest;
* the counts are ``ZCOUNT`` and ``ZLEXCOUNT`` of those sets: a few commands, whatever the size;
* prune and reap take their candidates from the same sets (the oldest first) and run the
  ``drop_many`` script on them, one call per :data:`REMOVAL_BATCH` (every key of the namespace is in
  one slot wherever there are indexes): the script judges each record again on the server's clock (a
  holder may have renewed, another remover been first), by the same rules as the drop script of one
  key, and leaves a tombstone with its fence.

An index entry whose record no longer matches it (a record written by an older dibs, or changed by
hand) is skipped: every answer is judged on the records read, never on the index alone (but the
counts). Such an entry is repaired on the way (the ``reindex`` script).
"""

from __future__ import annotations

import builtins
import logging
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, cast

from dibs.display import printable
from dibs.errors import CorruptRecord, InvalidKey
from dibs.keys import Key
from dibs.records import KeyState
from dibs.stores import pages, transitions
from dibs.stores.base import Progress, Skipped, skip
from dibs.stores.redis.index import (
    CHUNK,
    CLASSES,
    VERSION,
    Entry,
    chunks,
    class_of,
    merged,
    paged,
)
from dibs.stores.redis.scripts import Reply

if TYPE_CHECKING:
    from dibs.stores.redis.store import RedisStore

__all__ = ["REMOVAL_BATCH", "IndexedReads"]

logger = logging.getLogger(__name__)

#: Records one ``drop_many`` call of prune or reap judges and changes (candidates read at a time). The
#: call is one atomic step, ~30 µs of server time a record, so the server answers nobody else for
#: ~6 ms; measured on 20,000 keys, 100 to 1,000 a call made no difference to the rate beyond the
#: noise of a busy machine (the per-call cost, ~20 µs, is spread over the batch either way).
REMOVAL_BATCH = 200
_INF = float("inf")


def _text(value: bytes | str) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _key(namespace: str, name: str) -> Key | None:
    """The key an index entry names; ``None`` (logged) for one no dibs key has, written by hand."""
    try:
        return Key(namespace, name)
    except InvalidKey as exc:
        logger.warning("skipping an index entry that names no key (%s): %s", namespace, exc)
        return None


def _why(reply: Reply) -> str:
    """Why a script called a record corrupt, printable (it may quote the foreign value)."""
    return printable(bytes(reply[1]).decode("utf-8", "replace"))


def _stale(order: Any, state: KeyState) -> bool:
    """Whether the index entry that ordered ``state`` (see :meth:`IndexedReads._by_name` and
    :meth:`~IndexedReads._by_score`) says what its record does not: a record of another class, an
    artifact, failure or lease it does not hold (or at another time)."""
    at, part = order
    if len(part) == 1:
        return bool(class_of(state) != part)
    if part == "art":
        return state.artifact is None or bool(state.artifact.created_at != at)
    if part == "fail":
        return state.failure is None or bool(state.failure.at != at)
    return state.lease is None or bool(state.lease.expires_at != at)


class IndexedReads:
    """The admin reads and removals of one :class:`RedisStore` whose indexes are complete."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self.indexes = store._indexes

    # -- plumbing --------------------------------------------------------------------------------------
    def client(self) -> Any:
        """The client of the node that holds the indexes (all of them: one server, or one slot)."""
        return self.store._reach.node_of(self.indexes.marker)

    def now(self) -> float:
        """The server's clock, as the scripts read it (``TIME``)."""
        seconds, micro = self.client().time()
        return float(seconds) + float(micro) / 1_000_000

    def namespaces(self, namespace: str | None) -> builtins.list[str]:
        if namespace is not None:
            return [namespace]
        return sorted(_text(found) for found in self.client().smembers(self.indexes.registry))

    def ready(self) -> bool:
        marker: object = self.client().get(self.indexes.marker)
        return bool(marker == VERSION.encode())

    def read(self, keys: Sequence[Key], skipped: builtins.list[Skipped]) -> builtins.list[KeyState | None]:
        """The records of ``keys`` (no payloads), in order; ``None`` for one that cannot be read (skipped,
        logged and counted in ``skipped``, as a listing does)."""
        store = self.store
        record_keys = [store.record_key(key) for key in keys]
        replies: builtins.list[object] = [None] * len(keys)
        for node, indexes in store._reach.group(record_keys):
            pipe = node.pipeline(transaction=False)
            for index in indexes:
                key = keys[index]
                store._read.queue(pipe, record_keys[index], key.namespace, key.name, "0")
            for index, answer in zip(indexes, pipe.execute(raise_on_error=False), strict=True):
                key = keys[index]
                replies[index] = store._moved(record_keys[index], answer, (key.namespace, key.name, "0"))
        states: builtins.list[KeyState | None] = []
        for key, record_key, answer in zip(keys, record_keys, replies, strict=True):
            if isinstance(answer, Exception):
                raise answer
            reply = cast(Reply, answer)
            try:
                if reply[0] == b"corrupt":  # the reason may quote the foreign value: never raw
                    raise store._corrupt(key, record_key, _why(reply))
                states.append(store._state(key, reply))
            except CorruptRecord as exc:
                skip(skipped, store._where(record_key), exc)
                states.append(None)
        return states

    def reindex(self, keys: Sequence[Key], *, strict: bool = True) -> None:
        """Place each of ``keys`` again from its record (the ``reindex`` script, pipelined per node).

        An error reply (a server over ``maxmemory`` refuses the script's writes) raises, unless not
        ``strict``: a read that repairs the stale entries it met is answered all the same (logged)."""
        store = self.store
        record_keys = [store.record_key(key) for key in keys]
        for node, indexes in store._reach.group(record_keys):
            pipe = node.pipeline(transaction=False)
            for index in indexes:
                key = keys[index]
                store._reindex.queue(
                    pipe, record_keys[index], key.namespace, key.name, more=self.indexes.more(key.namespace)
                )
            for answer in pipe.execute(raise_on_error=False):
                if isinstance(answer, Exception):
                    if strict:
                        raise answer
                    logger.warning("could not place a stale index entry again: %s", answer)
                    return

    def _judged(
        self,
        items: Iterator[Entry],
        wanted: Callable[[KeyState], bool],
        limit: int,
        skipped: builtins.list[Skipped],
        size: int,
    ) -> Iterator[KeyState]:
        """The records ``items`` name, read ``size`` at a time, that ``wanted`` keeps; stops once
        ``limit`` are found. A name met twice in a row (a stale entry in a second class) is read once;
        an entry its record contradicts (:func:`_stale`) is placed again."""
        found = 0
        previous: tuple[str, str] | None = None
        for batch in chunks(items, size):
            entries, keys = [], []
            for order, namespace, name in batch:
                if (namespace, name) == previous:
                    continue
                previous = (namespace, name)
                key = _key(namespace, name)
                if key is not None:
                    entries.append(order)
                    keys.append(key)
            stale: builtins.list[Key] = []
            for order, key, state in zip(entries, keys, self.read(keys, skipped), strict=True):
                if state is None:
                    continue
                if _stale(order, state):
                    stale.append(key)
                if transitions.is_tombstone(state) or not wanted(state):
                    continue
                yield state
                found += 1
                if found >= limit:
                    break
            if stale:
                logger.info("placing %d stale index entries again (written by an older dibs?)", len(stale))
                self.reindex(stale, strict=False)
            if found >= limit:
                return

    # -- streams of index entries ---------------------------------------------------------------------
    def _by_name(self, namespace: str, classes: str, after: str | None, size: int) -> Iterator[Entry]:
        """The names of ``namespace`` in ``classes``, in key order after ``after``: one ``ZRANGEBYLEX``
        stream per class, merged. Each item's order is ``(name, class)``."""
        key = self.indexes.of(namespace).cls

        def stream(letter: str) -> Iterator[Entry]:
            start = f"({letter}{after}" if after is not None else f"[{letter}"
            end = f"({chr(ord(letter) + 1)}"
            while True:
                got = self.client().zrangebylex(key, start, end, start=0, num=size)
                for member in got:
                    name = _text(member)[1:]
                    yield (name, letter), namespace, name
                if len(got) < size:
                    return
                start = b"(" + got[-1]

        return merged(stream(letter) for letter in classes)

    def _by_score(
        self,
        keys: Sequence[tuple[str, str, str]],
        low: float,
        high: float,
        *,
        reverse: bool,
        size: int,
        low_open: bool,
    ) -> Iterator[Entry]:
        """The members of the sorted sets ``keys`` (``(namespace, key, kind)``: ``lease``, ``art`` or
        ``fail``) scored from ``low`` to ``high`` (``low`` left out when ``low_open``), lowest first
        (``reverse``: highest first), merged. Each item's order is ``(score, kind)``."""
        lo = f"({low!r}" if low_open else ("-inf" if low == -_INF else repr(low))
        hi = "+inf" if high == _INF else repr(high)

        def stream(namespace: str, key: str, kind: str) -> Iterator[Entry]:
            def fetch(offset: int) -> builtins.list[Entry]:
                client = self.client()
                if reverse:
                    got = client.zrevrangebyscore(key, hi, lo, start=offset, num=size, withscores=True)
                else:
                    got = client.zrangebyscore(key, lo, hi, start=offset, num=size, withscores=True)
                return [((float(score), kind), namespace, _text(member)) for member, score in got]

            return paged(fetch, size)

        return merged((stream(*source) for source in keys), reverse=reverse)

    # -- the reads ------------------------------------------------------------------------------------
    def list(self, namespace: str) -> tuple[builtins.list[KeyState], builtins.list[Skipped]]:
        """Every listed record of ``namespace``, in key order."""
        skipped: builtins.list[Skipped] = []
        items = self._by_name(namespace, CLASSES[None], None, CHUNK)
        states = builtins.list(self._judged(items, lambda _: True, 1 << 62, skipped, CHUNK))
        return states, skipped

    def page(self, query: pages.Query) -> pages.Page:
        """A page of :meth:`Store.list_page <dibs.stores.base.Store.list_page>` (a status or all, no
        ``older_than``), walked through the status's classes from the cursor."""
        namespace, state, limit, start = query.namespace, query.state, query.limit, query.start
        skipped: builtins.list[Skipped] = []
        found: builtins.list[KeyState] = []
        size = min(limit + 1, CHUNK)
        for ns in self.namespaces(namespace):
            if start is not None and ns < start[0]:
                continue
            from_name = start[1] if start is not None and ns == start[0] else None
            items = self._by_name(ns, CLASSES[state], from_name, size)
            found.extend(self._judged(items, query.keeps, limit + 1 - len(found), skipped, size))
            if len(found) > limit:
                page = found[:limit]
                return pages.Page(tuple(page), pages.cursor_of(page[-1].key), len(skipped))
        return pages.Page(tuple(found), None, len(skipped))

    def latest(self, namespace: str | None, kind: pages.Kind, limit: int) -> builtins.list[KeyState]:
        part = "art" if kind == "artifact" else "fail"
        keys = [(ns, getattr(self.indexes.of(ns), part), part) for ns in self.namespaces(namespace)]
        items = self._by_score(keys, -_INF, _INF, reverse=True, size=limit, low_open=False)
        if kind == "artifact":
            wanted: Callable[[KeyState], bool] = lambda s: s.artifact is not None  # noqa: E731
        else:
            wanted = lambda s: s.failure is not None  # noqa: E731
        return builtins.list(self._judged(items, wanted, limit, [], limit))

    def leases(self, namespace: str | None, expired: bool, limit: int) -> builtins.list[KeyState]:
        now = self.now()
        names = [(ns, self.indexes.of(ns)) for ns in self.namespaces(namespace)]
        if expired:  # a lease beside an artifact is done once it expires: class h alone
            keys = [(ns, found.lease_h, "lease") for ns, found in names]
            items = self._by_score(keys, -_INF, now, reverse=True, size=limit, low_open=False)
        else:
            keys = [(ns, key, "lease") for ns, found in names for key in (found.lease_h, found.lease_r)]
            items = self._by_score(keys, now, _INF, reverse=False, size=limit, low_open=True)
        status = "expired" if expired else "held"
        return builtins.list(self._judged(items, lambda s: s.status == status, limit, [], limit))

    def counts(self, namespace: str | None, up_to: int) -> dict[str, int]:
        """Each status counted from the indexes: six commands a namespace, whatever its size."""
        now = repr(self.now())
        counts = dict.fromkeys(pages.COUNTED, 0)
        names = self.namespaces(namespace)
        pipe = self.client().pipeline(transaction=False)
        for ns in names:
            found = self.indexes.of(ns)
            pipe.zcount(found.lease_h, f"({now}", "+inf")
            pipe.zcount(found.lease_r, f"({now}", "+inf")
            pipe.zcount(found.lease_h, "-inf", now)
            pipe.zlexcount(found.cls, "[d", "(e")
            pipe.zcount(found.lease_r, "-inf", now)
            pipe.zlexcount(found.cls, "[f", "(g")
        answers = pipe.execute()
        for i in range(len(names)):
            held_h, held_r, expired, done, done_r, failed = answers[6 * i : 6 * i + 6]
            counts["held"] += held_h + held_r
            counts["expired"] += expired
            counts["done"] += done + done_r
            counts["failed"] += failed
        return {state: min(count, up_to) for state, count in counts.items()}

    # -- removal ---------------------------------------------------------------------------------------
    def remove(self, namespace: str | None, part: str, older_than: float, progress: Progress | None) -> int:
        """Prune (``part="old"``) or reap (``"reap"``) from the indexes' candidates, a ``drop_many``
        call per :data:`REMOVAL_BATCH`; returns how many records changed.

        Each set is walked from its oldest entry with a cursor (a score, and the names already met at
        that score): a changed record leaves every index, one the script left as it was (a renewed
        lease, an artifact newer than the cutoff) is passed, never judged again in this run."""
        changed = 0
        now = self.now()
        limit = now - older_than if part == "old" else now
        for ns in self.namespaces(namespace):
            found = self.indexes.of(ns)
            scored = (
                (found.art, found.lease_h, found.lease_r, found.fail)
                if part == "old"
                else (
                    found.lease_h,
                    found.lease_r,
                )
            )
            sources = [self._below(key, limit, strict=part == "old") for key in scored]
            sources.append(self._class(found.cls, "n"))
            with ThreadPoolExecutor(2, thread_name_prefix="dibs-remove") as pool:
                # Two batches in flight: the server runs one while this process reads and packs the
                # next. The next candidates never depend on what a batch changed.
                flight: deque[Future[int]] = deque()
                for source in sources:
                    for names in source:
                        if len(flight) == 2:
                            changed += flight.popleft().result()
                            if progress is not None:
                                progress(changed)
                        flight.append(pool.submit(self._drop_batch, ns, names, part, older_than))
                while flight:
                    changed += flight.popleft().result()
                    if progress is not None:
                        progress(changed)
        return changed

    def _below(self, key: str, limit: float, *, strict: bool) -> Iterator[builtins.list[str]]:
        """The members of ``key`` scored below ``limit`` (or at it, unless ``strict``), lowest first, in
        batches; each batch is fetched after the previous one was dealt with."""
        high = f"({limit!r}" if strict else repr(limit)
        low, low_score, met = "-inf", -_INF, set[bytes]()
        while True:
            asked = REMOVAL_BATCH + len(met)
            got = self.client().zrangebyscore(key, low, high, start=0, num=asked, withscores=True)
            fresh = [(member, score) for member, score in got if member not in met][:REMOVAL_BATCH]
            if not fresh:
                return
            yield [_text(member) for member, _ in fresh]
            if len(got) < asked:
                return
            last = fresh[-1][1]
            met = (met if last == low_score else set()) | {m for m, score in fresh if score == last}
            low, low_score = repr(last), last

    def _class(self, key: str, letter: str) -> Iterator[builtins.list[str]]:
        """The names of class ``letter`` in ``cls``, in key order, in batches."""
        low = f"[{letter}"
        while True:
            got = self.client().zrangebylex(key, low, f"({chr(ord(letter) + 1)}", start=0, num=REMOVAL_BATCH)
            if not got:
                return
            yield [_text(member)[1:] for member in got]
            if len(got) < REMOVAL_BATCH:
                return
            low = b"(" + got[-1]

    def _drop_batch(self, namespace: str, names: Sequence[str], part: str, older_than: float) -> int:
        """One ``drop_many`` script (``part``: ``old`` or ``reap``) on ``names``; how many changed. A
        record that cannot be read is skipped and logged, and left as it is.

        One call judges the whole batch: every key of the namespace, records and indexes, is in one
        slot wherever the indexes are kept, and one script per record cost ~45 µs of server time and
        ~21 µs of this process's CPU a key (its call set up, sent, parsed), most of it per call. The
        script runs through :class:`~dibs.stores.redis.scripts.Script` (loaded on ``NOSCRIPT``; a
        cluster's client follows a moved slot)."""
        store = self.store
        keys = [key for name in names if (key := _key(namespace, name)) is not None]
        if not keys:
            return 0
        record_keys = [store.record_key(key) for key in keys]
        more = (*self.indexes.more(namespace), *record_keys[1:])
        seconds = repr(float(older_than)) if part == "old" else "0"
        reply = store._drop_many(
            store._reach.client(),
            record_keys[0],
            namespace,
            part,
            seconds,
            store._record_start,
            store._channel_start,
            *(key.name for key in keys),
            more=more,
        )
        changed = 0
        for key, record_key, answer in zip(keys, record_keys, reply, strict=True):
            if isinstance(answer, bytes):  # why the value at the key is not a dibs record
                why = printable(answer.decode("utf-8", "replace"))
                skip([], store._where(record_key), store._corrupt(key, record_key, why))
                continue
            changed += answer
        return changed

    # -- backfill --------------------------------------------------------------------------------------
    def backfill(self) -> int:
        """Place every record under the prefix (a SCAN, then the ``reindex`` script on each, pipelined),
        then set the marker; returns how many records were placed."""
        store = self.store
        placed = 0
        for node, batch in store._scan_batches():
            keys: builtins.list[Key] = []
            for raw_key, reply in store._scan_read(node, batch):
                try:
                    state = store._listed_state(raw_key, reply)
                except CorruptRecord:
                    continue  # a foreign value: never placed (a listing skips it too)
                if state is not None:
                    keys.append(state.key)
            if keys:
                self.reindex(keys)
                placed += len(keys)
        self.client().set(self.indexes.marker, VERSION)
        return placed

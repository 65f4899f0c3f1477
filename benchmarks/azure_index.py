"""What the Azure store's index buys the reads a person makes, and what it costs a new key (issue 30).

``python -m benchmarks.azure_index [--sizes 100,10000] [--ops 20] [--out benchmarks/results/issue30]``
(``--sizes 100,10000,100000`` is the full run: about an hour on Azurite, most of it growing.)

One namespace on Azurite is grown to each size in turn (finished keys, each written by the store's own
swap, so each gets its record and its index blob as a user's completion does; 20 held keys and a
failure beside them), and at each size:

* ``top``: one ``dibs top --once`` snapshot through the index, median of 5, against the same snapshot
  read as before the index (one listing of every record blob: :class:`Listed`), median of 5, or of 1
  when one takes over 5 s; the ratio is listing / index;
* ``held page``: ``dibs ls --state held`` (a page of 100) the same two ways;
* ``airflow page``: what the Reservations page reads with no task waiting (each status a page at a
  time until 500 rows: the held and expired ones through the ``live`` blobs, the done ones newest
  first from the ``made`` blobs and the record copies they carry, :mod:`dibs.stores.azure.copies`),
  median of 3, against the same page with every record it shows downloaded (:class:`Uncopied`, the
  reads as they were before the copies), and the records each downloads (counted);
* ``new key``: ``acquire`` + ``complete`` of a fresh key with the index kept, interleaved call by call
  with the same on a store that writes no index (:class:`Unindexed`, the write path as it was): the
  index's cost on the hot path, p50 and the ratio;
* ``rebuild``: the once-only indexing of a store written before the index (``rebuild_index``), at the
  sizes up to 10,000;
* ``feed look``: one look of the change feed at 20 watched held keys (what a triggerer with 20
  deferred tasks pays every 50 ms to 1 s), through the namespace's ``live`` blobs, against the same
  look by the listing of every record blob (as before the index), median of 5;
* ``GET``: what one request for one record blob costs the emulator at this size (the SDK's download of
  a record, median of :data:`GETS` taken one after the other, and the same GETs :data:`CONCURRENT` at a
  time, per GET), beside how many records the page downloads (counted): the page is that many GETs
  and a few listings, so its time is their product. On Azurite a GET costs more the more blobs it
  holds and, one Node process doing that work, GETs at once cost about what they cost one after the
  other. On Azure a GET is a round trip whatever the container holds.

Azurite keeps its blobs' metadata in memory (LokiJS) unless told otherwise, and there each request
costs more the more blobs it holds (a GET 4 ms at 100 keys, 30 ms at 10,000), so growing it to 100,000
keys would take hours (2,000 to 10,000 keys took 275 s, and every request keeps slowing).
``--azurite-db mysql://root@127.0.0.1:3306/azurite_blob`` has the emulator keep its metadata in that
MySQL/MariaDB database instead (Azurite's ``AZURITE_DB``), where it finds a blob by an index on the
names: a GET cost 5 to 8 ms from 100 to 100,000 keys. The database is created, or emptied when it
exists, so name one that only the emulator uses. The full run (``--sizes 100,10000,100000
--azurite-db ...``) took 33 minutes on a 2-core machine, 24 of them growing.

Nothing here is a threshold: the machine may be busy, so compare ratios of one run, not runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import re
import statistics
import time
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from azure.storage.blob import BlobProperties

import dibs
from benchmarks.history import _airflow_page, _interleaved, _median, _name, _new_key
from benchmarks.targets import open_targets
from dibs._cli.top import snapshot
from dibs.keys import Key
from dibs.records import ArtifactRecord, Granted, KeyState, checksum
from dibs.stores import AcquireRequest, redact_url, transitions
from dibs.stores.azure import AzureBlobStore, index
from dibs.stores.azure.copies import Echo
from dibs.stores.azure.feed import EtagFeed
from dibs.stores.azure.indexed import IndexedReads
from dibs.stores.base import Loaded

NAMESPACE = "history"  # the name _airflow_page reads
#: The largest size the rebuild is timed at (it writes an index blob per finished key).
REBUILD_UP_TO = 10_000
#: Keys held while the reads are timed, and watched by the change feed's look.
WATCHED = 20
#: Where the emulator keeps its blobs' metadata unless told otherwise.
MEMORY = "in memory (LokiJS)"
#: Record GETs timed at each size, one after the other and then this many at a time.
GETS, CONCURRENT = 50, 8


class Listed(AzureBlobStore):
    """The reads as they were before the index: one listing of every record blob."""

    def _through_index(self, namespace: str | None) -> bool:
        return False


class _NoCopies(IndexedReads):
    def _copied(self, blob: BlobProperties, made: index.Made, now: float | None) -> KeyState | None:
        return None


class Uncopied(AzureBlobStore):
    """The reads through the index as they were before the record copies: each record shown downloaded."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._indexed_reads = _NoCopies(self)


class Unindexed(AzureBlobStore):
    """The record write as it was before the index: the swap alone (and the stale payload's delete)."""

    def _swap(self, key: Key, version: object, new: KeyState, old: KeyState) -> bool | Loaded:
        swapped = self._write(key, version, new)
        if swapped is Echo.SAME:
            swapped = True
        if swapped is True and old.artifact is not None and new.artifact != old.artifact:
            self._delete_quietly(key, self.artifact_name(key, old.artifact))
        return swapped


def _grow(store: AzureBlobStore, start: int, stop: int, threads: int = 8) -> None:
    """Finished keys, a minute apart back in time, each written by the store's swap (record + index)."""
    now = time.time()

    def one(i: int) -> None:
        key = Key(NAMESPACE, _name(i))
        made = now - 60.0 * (i + 1)
        artifact = ArtifactRecord("json", b"", 1, checksum(b"1"), "history", 1, made)
        state = KeyState(key, made, fence=1, attempts=1, artifact=artifact)
        assert store._swap(key, None, state, transitions.empty(key, made)) is True

    with ThreadPoolExecutor(threads) as pool:
        for _ in pool.map(one, range(start, stop), chunksize=64):
            pass


def _live_work(store: AzureBlobStore) -> None:
    for i in range(1, WATCHED + 1):
        store.acquire(Key(NAMESPACE, f"held-{i}"), AcquireRequest("worker", 3600))
    broken = store.acquire(Key(NAMESPACE, "broken"), AcquireRequest("flaky", 60))
    assert isinstance(broken, Granted)
    store.release(broken.lease.key, broken.lease.token, "ValueError: no rows")


def _rebuild(store: AzureBlobStore) -> float:
    """The once-only indexing of a store an older dibs wrote: its index blobs are deleted (in batches
    of 256, outside the timing), then the rebuild lists the records and writes them all again.
    It gives the newest done keys of the namespace their record copies again
    (:data:`~dibs.stores.azure.store.REBUILD_COPIES`, :mod:`dibs.stores.azure.copies`), so the next
    size's reads find them as the completions left them."""
    names = [blob.name for blob in store._container.list_blobs(name_starts_with=store._index.root)]
    for start in range(0, len(names), 256):
        store._container.delete_blobs(*names[start : start + 256], raise_on_any_failure=False)
    store._index_ready = False
    started = time.perf_counter()
    store.rebuild_index()
    return time.perf_counter() - started


def _feed_looks(store: AzureBlobStore) -> tuple[float, float]:
    """Seconds of one look at the held keys (20: :func:`_live_work`), through the index and by the
    listing of every record (the feed as it was before the index: told the index is incomplete)."""
    held = [Key(NAMESPACE, f"held-{i}") for i in range(1, WATCHED + 1)]
    indexed, listed = store.change_feed(), store.change_feed()
    assert isinstance(indexed, EtagFeed) and isinstance(listed, EtagFeed)
    listed._index_complete = lambda: False  # type: ignore[method-assign]
    for feed in (indexed, listed):
        assert len(feed.tokens(held)) == len(held)  # every one seen (and the marker read, untimed)
    return _median(lambda: indexed.tokens(held)), _median(lambda: listed.tokens(held))


def _record_get(store: AzureBlobStore, size: int) -> tuple[float, float]:
    """Seconds per GET of a grown key's record blob: the median of :data:`GETS` one after the other,
    and the mean per GET of the same :data:`CONCURRENT` at a time."""
    blobs = [
        store._container.get_blob_client(store.record_name(Key(NAMESPACE, _name(i))))
        for i in range(0, size, max(1, size // GETS))
    ][:GETS]
    times = []
    for blob in blobs:
        started = time.perf_counter()
        blob.download_blob().readall()
        times.append(time.perf_counter() - started)
    started = time.perf_counter()
    with ThreadPoolExecutor(CONCURRENT) as pool:
        list(pool.map(lambda blob: blob.download_blob().readall(), blobs))
    return statistics.median(times), (time.perf_counter() - started) / len(blobs)


def _downloads(store: AzureBlobStore, read: Callable[[], object]) -> int:
    """How many record blobs ``read`` downloads (the store's one download of a record, counted)."""
    counted = [0]
    download = store._list_entry

    def counting(name: str) -> KeyState | None:
        counted[0] += 1
        return download(name)

    store._list_entry = counting  # type: ignore[method-assign]
    try:
        read()
    finally:
        del store._list_entry
    return counted[0]


def measure(url: str, sizes: list[int], ops: int) -> list[dict[str, Any]]:
    results = []
    with (
        AzureBlobStore.from_url(url) as store,
        Listed.from_url(url) as listed,
        Unindexed.from_url(url) as unindexed,
        Uncopied.from_url(url) as uncopied,
    ):
        _live_work(store)
        indexed_client = dibs.Reservations(store, namespace=NAMESPACE)
        listed_client = dibs.Reservations(listed, namespace=NAMESPACE)
        airflow_page, downloading_page = _airflow_page(store), _airflow_page(uncopied)
        grown_to = 0
        for size in sizes:
            started = time.perf_counter()
            _grow(store, grown_to, size)
            grown_to = size
            grew = time.perf_counter() - started
            store.overview(NAMESPACE, leases=1, recent=1)  # the index marker, outside the timing
            top = _median(lambda: snapshot(indexed_client))
            top_listed = _median(lambda: snapshot(listed_client))
            doc = snapshot(indexed_client)
            held = _median(lambda: store.list_page(NAMESPACE, state="held", limit=100))
            held_listed = _median(lambda: listed.list_page(NAMESPACE, state="held", limit=100))
            uncopied.overview(NAMESPACE, leases=1, recent=1)
            shown = _median(airflow_page, repeats=3)
            shown_downloading = _median(downloading_page, repeats=3)
            page_gets = _downloads(store, airflow_page)
            page_gets_downloading = _downloads(uncopied, downloading_page)
            look, look_listed = _feed_looks(store)
            get, get_concurrent = _record_get(store, size)
            new_key, new_key_unindexed = _interleaved(_new_key(store), _new_key(unindexed), ops)
            rebuild = _rebuild(store) if size <= REBUILD_UP_TO else None
            results.append(
                {
                    "keys": size,
                    "grow_s": round(grew, 1),
                    "top_s": round(top, 4),
                    "top_listed_s": round(top_listed, 4),
                    "top_ratio": round(top_listed / top, 1),
                    "top_counts": doc["counts"],
                    "top_at_least": doc["at_least"],
                    "held_page_s": round(held, 4),
                    "held_page_listed_s": round(held_listed, 4),
                    "held_page_ratio": round(held_listed / held, 1),
                    "airflow_page_s": round(shown, 4),
                    "airflow_page_gets": page_gets,
                    "airflow_page_uncopied_s": round(shown_downloading, 4),
                    "airflow_page_uncopied_gets": page_gets_downloading,
                    "airflow_page_ratio": round(shown_downloading / shown, 1),
                    "feed_look_s": round(look, 4),
                    "feed_look_listed_s": round(look_listed, 4),
                    "feed_look_ratio": round(look_listed / look, 1),
                    "record_get_ms": round(get * 1000, 2),
                    "record_get_concurrent_ms": round(get_concurrent * 1000, 2),
                    "new_key_p50_ms": round(new_key * 1000, 1),
                    "new_key_unindexed_p50_ms": round(new_key_unindexed * 1000, 1),
                    "new_key_ratio": round(new_key / new_key_unindexed, 2),
                    "rebuild_s": None if rebuild is None else round(rebuild, 1),
                }
            )
            print(json.dumps(results[-1]), flush=True)
    return results


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1000:,.1f} ms" if seconds < 10 else f"{seconds:,.0f} s"


def _markdown(results: list[dict[str, Any]], argv: dict[str, Any]) -> str:
    lines = [
        "# Azure: the reads a person makes, through the index and by the listing (issue 30)",
        "",
        f"`python -m benchmarks.azure_index --sizes {argv['sizes']} --ops {argv['ops']}"
        f"{' --azurite-db mysql://…' if argv.get('metadata', MEMORY) != MEMORY else ''}`, on Azurite, "
        f"its blobs' metadata {argv.get('metadata', MEMORY)}, "
        f"{argv.get('measured', time.strftime('%Y-%m-%d %H:%M'))}, {platform.machine()}. "
        "Ratios: the listing against the index (how many times slower the read was before the index); "
        "`new key` with the index kept against the write path without it, interleaved. `Airflow page`: "
        "with the record copies, against every record it shows downloaded (`downloading`); `GETs`: the "
        "records each downloads (counted); "
        f"`one GET`: one record's GET at that size, median of {GETS} one after the other; `at once`: the "
        f"same GETs {CONCURRENT} at a time, per GET.",
        "",
        "| keys | top --once | by listing | x | held page (100) | by listing | x | Airflow page "
        "| GETs | downloading | GETs | x | one GET | at once | feed look (20 keys) | by listing | x "
        "| new key p50 | without index | x | rebuild | top's counts |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in results:
        counts = ", ".join(
            f"{status} {count}{'+' if status in r['top_at_least'] else ''}"
            for status, count in r["top_counts"].items()
        )
        lines.append(
            f"| {r['keys']:,} | {_ms(r['top_s'])} | {_ms(r['top_listed_s'])} | {r['top_ratio']} | "
            f"{_ms(r['held_page_s'])} | {_ms(r['held_page_listed_s'])} | {r['held_page_ratio']} | "
            f"{_ms(r['airflow_page_s'])} | {r.get('airflow_page_gets', '-')} | "
            f"{_ms(r.get('airflow_page_uncopied_s'))} | {r.get('airflow_page_uncopied_gets', '-')} | "
            f"{r.get('airflow_page_ratio', '-')} | "
            f"{r.get('record_get_ms', '-')} ms | {r.get('record_get_concurrent_ms', '-')} ms | "
            f"{_ms(r.get('feed_look_s'))} | {_ms(r.get('feed_look_listed_s'))} | "
            f"{r.get('feed_look_ratio', '-')} | "
            f"{r['new_key_p50_ms']} ms | {r['new_key_unindexed_p50_ms']} ms | "
            f"{r['new_key_ratio']} | {_ms(r['rebuild_s'])} | {counts} |"
        )
    return "\n".join(lines) + "\n"


#: What ``--azurite-db`` takes: every part named, so that this script and the emulator (which reads the
#: URL itself) reach the same server as the same user.
_AZURITE_DB = re.compile(
    r"mysql://(?P<user>[^:@/]+)(?::(?P<password>[^@/]*))?@(?P<host>[^:/]+):(?P<port>\d+)/(?P<db>\w+)"
)


def _empty_database(url: str) -> None:
    """Create the MySQL/MariaDB database ``url`` names for Azurite's metadata, dropping it first when it
    exists: the emulator's tables must start empty (each run's container is new, but its blobs' rows
    would stay), and Azurite creates its tables but not the database."""
    import pymysql
    from tests.azurite import CONNECTION_STRING_ENV  # as benchmarks/targets.py: only when it is needed

    if os.environ.get(CONNECTION_STRING_ENV):
        raise SystemExit(
            f"--azurite-db: {CONNECTION_STRING_ENV} is set, so the benchmark would use that running "
            "emulator and the database would not be its metadata; unset it to have one started"
        )
    found = _AZURITE_DB.fullmatch(url)
    if found is None or not found["db"].isascii():
        raise SystemExit(
            f"--azurite-db {redact_url(url)!r}: expected mysql://USER[:PASSWORD]@HOST:PORT/DATABASE, the "
            "database named by ASCII letters, digits and underscores "
            "(e.g. mysql://root@127.0.0.1:3306/azurite_blob)"
        )
    connection = pymysql.connect(
        host=found["host"],
        port=int(found["port"]),
        user=urllib.parse.unquote(found["user"]),
        password=urllib.parse.unquote(found["password"] or ""),
    )
    with connection, connection.cursor() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS `{found['db']}`")
        cursor.execute(f"CREATE DATABASE `{found['db']}`")


def _metadata_store(url: str | None) -> str:
    """Where the emulator kept its metadata, as the results say it (a database's name, no password)."""
    if not url:
        return MEMORY
    found = _AZURITE_DB.fullmatch(url)
    return f"in MySQL/MariaDB (database {found['db'] if found else '?'}, AZURITE_DB)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.azure_index", description=__doc__)
    parser.add_argument("--sizes", default="100,10000")
    parser.add_argument("--ops", type=int, default=20, help="calls per side for new key")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/issue30"))
    parser.add_argument("--name", default="azure-index", help="the result files' name (NAME.json, NAME.md)")
    parser.add_argument(
        "--azurite-db",
        metavar="URL",
        help="keep the emulator's metadata in this MySQL/MariaDB database (created, or emptied when it "
        "exists), e.g. mysql://root@127.0.0.1:3306/azurite_blob; default: in memory",
    )
    args = parser.parse_args(argv)
    logging.getLogger("azure").setLevel(logging.WARNING)  # the SDK logs every request and response
    sizes = [int(size) for size in args.sizes.split(",")]
    if args.azurite_db:
        _empty_database(args.azurite_db)
        os.environ["AZURITE_DB"] = args.azurite_db  # read by the emulator tests/azurite.py starts
    with open_targets(("azure",)) as (targets, skipped):
        if not targets:
            print(f"Azure is not available here: {skipped.get('azure')}")
            return 1
        results = measure(targets[0].url, sizes, args.ops)
    args.out.mkdir(parents=True, exist_ok=True)
    shown = {
        "sizes": args.sizes,
        "ops": args.ops,
        "metadata": _metadata_store(args.azurite_db),
        "measured": time.strftime("%Y-%m-%d %H:%M"),
    }
    (args.out / f"{args.name}.json").write_text(
        json.dumps({"argv": shown, "results": results}, indent=2) + "\n"
    )
    (args.out / f"{args.name}.md").write_text(_markdown(results, shown))
    print(_markdown(results, shown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

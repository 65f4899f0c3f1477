"""The stores' raw notification fan-out: one writer, N listener processes (issue 20).

A push hand-off to N waiter processes can grow with N for two reasons: dibs's own work in each
process, and what the store's notification itself costs when N processes wait on it (the server
writes N messages, N processes are woken and each reads, on a machine with fewer cores than
processes). This baseline measures the second alone, with nothing of dibs in it, in the same run
and the same worker processes as the hand-off (:mod:`benchmarks.handoff`, which interleaves them
round by round), so a reader sees how much of dibs's growth from N=1 to N=16 the primitive has too.

Per round, each of N listener processes waits for one key; the writer (the benchmark process)
stores the key's value and notifies in one round trip; each listener, once woken, reads the value
once and checks it. Latency: from just before the writer's call to the listener's read having
returned, on the machine's monotonic clock, which all processes share (as :mod:`benchmarks.handoff`):

* PostgreSQL: one statement in autocommit, ``INSERT`` of the row and ``pg_notify`` of its key (one
  round trip, committed, as dibs's ``complete`` whose trigger notifies); each listener ``LISTEN``\\ s
  on a psycopg connection of its own (as dibs's hub), is woken by ``notifies()``, then ``SELECT``\\ s
  the row on that connection;
* Redis: ``SET`` and ``PUBLISH`` in one ``MULTI``/``EXEC`` (one round trip, as dibs's script); each
  listener has a pattern subscription (as dibs's hub), reads the ``pmessage``, then ``GET``\\ s;
* SQLite (WAL, ``synchronous=NORMAL``, as the SQLite target): a committed ``INSERT``; each listener
  waits as dibs's hub does on Linux, on an inotify watch of the ``-wal`` file, then looks at
  ``PRAGMA data_version`` (every 0.5 ms after a write until it changes: the commit is published in
  shared memory just after the write), then ``SELECT``\\ s the row. Without inotify it looks every
  4 ms, as dibs's hub.

The writer's side runs in the benchmark process (:class:`Writer`), the listeners' in the worker
processes (:func:`listen`, called by :func:`benchmarks.tasks.raw_notify_wait`).
"""

from __future__ import annotations

import contextlib
import math
import sqlite3
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

from benchmarks.raw import _sql_parts

#: The stores with a notification primitive, by target family.
FAMILIES = ("postgres", "redis", "sqlite")
#: How long a listener waits for its notification before it gives up (the round fails).
TIMEOUT = 60.0
#: Looks at ``data_version`` after an inotify wake-up (for ``SQLITE_WINDOW`` after the last write
#: heard), and without inotify (seconds).
SQLITE_FOLLOW, SQLITE_WINDOW, SQLITE_POLL = 0.0005, 0.1, 0.004

_TABLE = "dibs_fanout_raw"

#: What the raw round trip is, per family, for the report.
HOW = {
    "postgres": "INSERT + pg_notify → LISTEN → SELECT",
    "redis": "SET + PUBLISH → pmessage → GET",
    "sqlite": "INSERT → inotify + data_version → SELECT",
}


class Writer:
    """The writer's side for one store; :attr:`spec` is what each listener process needs."""

    def __init__(self, family: str, url: str, scratch: Path) -> None:
        self.family = family
        tag = uuid.uuid4().hex[:8]
        self._conn: Any = None
        self._client: Any = None
        if family == "postgres":
            import psycopg

            sa_url, options = _sql_parts(url)
            conninfo = sa_url.set(drivername="postgresql").render_as_string(hide_password=False)
            schema = options.get("schema")
            table = f'"{schema}"."{_TABLE}"' if schema else f'"{_TABLE}_{tag}"'
            channel = f"dibs_fanout_{tag}"
            self._conn = psycopg.connect(conninfo, autocommit=True)
            if schema:
                self._conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
            self._conn.execute(f"CREATE TABLE IF NOT EXISTS {table} (key text PRIMARY KEY, value text)")
            self._table = table
            self._sql = (
                f"WITH written AS (INSERT INTO {table} (key, value) VALUES (%s, %s) RETURNING key) "
                f"SELECT pg_notify('{channel}', key) FROM written"
            )
            self.spec = {"family": family, "conninfo": conninfo, "table": table, "channel": channel}
        elif family == "redis":
            import redis

            parts = urllib.parse.urlsplit(url)
            query = dict(urllib.parse.parse_qsl(parts.query))
            plain = urllib.parse.urlunsplit(parts._replace(query=""))
            prefix = f"{query.get('prefix', 'dibs-bench:')}fanout-{tag}:"
            self._client = redis.Redis.from_url(plain)
            self._client.ping()  # connects now (redis-py connects lazily): no round times a connect
            self._prefix = prefix
            self.spec = {"family": family, "url": plain, "prefix": prefix}
        elif family == "sqlite":
            folder = scratch / f"fanout-{tag}"
            folder.mkdir(parents=True)
            path = folder / "fanout.db"
            self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self._conn.execute("PRAGMA journal_mode = WAL")
            self._conn.execute("PRAGMA synchronous = NORMAL")
            self._conn.execute(f"CREATE TABLE {_TABLE} (key TEXT PRIMARY KEY, value TEXT)")
            self.spec = {"family": family, "path": str(path)}
        else:
            raise ValueError(f"no raw notification for {family!r}")

    def send(self, key: str, value: str) -> None:
        """Store ``value`` under ``key`` and notify, in one round trip."""
        if self.family == "postgres":
            self._conn.execute(self._sql, (key, value)).fetchall()
        elif self.family == "redis":
            pipe = self._client.pipeline(transaction=True)
            pipe.set(self._prefix + key, value, ex=600)
            pipe.publish(f"{self._prefix}chan:{key}", key)
            pipe.execute()
        else:
            self._conn.execute(f"INSERT INTO {_TABLE} (key, value) VALUES (?, ?)", (key, value))

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                if self.family == "postgres":
                    self._conn.execute(f"DROP TABLE IF EXISTS {self._table}")
                self._conn.close()
        if self._client is not None:
            with contextlib.suppress(Exception):
                doomed = list(self._client.scan_iter(match=f"{self._prefix}*", count=1000))
                if doomed:
                    self._client.delete(*doomed)
                self._client.close()


class Listener:
    """A listener process's side for one store: listening from :meth:`__init__` on."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.family = spec["family"]
        self._conn: Any = None
        self._client: Any = None
        self._reader: Any = None
        self._pubsub: Any = None
        self._watch: Any = None
        if self.family == "postgres":
            import psycopg

            self._conn = psycopg.connect(spec["conninfo"], autocommit=True)
            self._conn.execute(f"LISTEN {spec['channel']}")
            self._select = f"SELECT value FROM {spec['table']} WHERE key = %s"
        elif self.family == "redis":
            import redis

            self._client = redis.Redis.from_url(spec["url"])
            self._client.ping()  # connects now (redis-py connects lazily): no round times a connect
            self._reader = redis.Redis.from_url(spec["url"])
            self._prefix = spec["prefix"]
            self._pubsub = self._reader.pubsub(ignore_subscribe_messages=False)
            self._pubsub.psubscribe(f"{self._prefix}chan:*")
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # confirmed: a message after this is never missed
                message = self._pubsub.get_message(timeout=1.0)
                if message is not None and message["type"] == "psubscribe":
                    break
        else:
            from dibs.stores import _inotify  # the ctypes binding of the kernel's inotify, nothing more

            self._conn = sqlite3.connect(spec["path"], isolation_level=None, check_same_thread=False)
            self._watch = _inotify.watch(f"{spec['path']}-wal")
            self._version = self._data_version()

    def _data_version(self) -> int:
        return int(self._conn.execute("PRAGMA data_version").fetchone()[0])

    def wait(self, key: str) -> str:
        """Block until ``key`` is notified, read its value once, and return it."""
        deadline = time.monotonic() + TIMEOUT
        if self.family == "postgres":
            while time.monotonic() < deadline:
                if any(n.payload == key for n in self._conn.notifies(timeout=1.0, stop_after=1)):
                    row = self._conn.execute(self._select, (key,)).fetchone()
                    return str(row[0])
        elif self.family == "redis":
            channel = f"{self._prefix}chan:{key}".encode()
            while time.monotonic() < deadline:
                message = self._pubsub.get_message(timeout=1.0)
                if message is not None and message["type"] == "pmessage" and message["channel"] == channel:
                    return str(self._client.get(self._prefix + key).decode())
        else:
            heard = -math.inf  # when the watch last heard the -wal file written
            while time.monotonic() < deadline:
                version = self._data_version()
                if version != self._version:
                    self._version = version
                    row = self._conn.execute(f"SELECT value FROM {_TABLE} WHERE key = ?", (key,)).fetchone()
                    if row is not None:
                        return str(row[0])
                if self._watch is None or self._watch.closed:
                    time.sleep(SQLITE_POLL)
                elif self._watch.wait(SQLITE_FOLLOW if time.monotonic() - heard < SQLITE_WINDOW else 1.0):
                    heard = time.monotonic()
        raise TimeoutError(f"no notification of {key!r} within {TIMEOUT:g} s")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self.family == "redis":
                self._pubsub.close()
                self._client.close()
                self._reader.close()
            else:
                if self.family == "sqlite" and self._watch is not None:
                    self._watch.close()
                self._conn.close()

"""The Redis store: every operation is one Lua script, so Redis itself decides each step atomically.

URL: ``redis://[user:password@]host[:port][/db][?prefix=dibs:&socket_timeout=10]`` (``rediss://`` for
TLS). ``prefix`` (default ``dibs:``) starts every Redis key dibs writes, so several applications or
test runs can share one database; ``max_artifact_size`` (bytes) sets a limit below the server's own;
any other query option is handed to redis-py's connection pool.

The largest artifact is known before it is sent: the server's ``proto-max-bulk-len`` (one value of a
command, 512 MB by default) and ``client-query-buffer-limit`` (the whole command), read once with
``CONFIG GET`` (512 MB when the server refuses ``CONFIG``, as managed services do), or the lower
``max_artifact_size``. A larger artifact is :class:`~dibs.errors.ArtifactTooLarge` at once; sent,
it made Redis drop the connection, which the client took for a network failure and re-sent for a
whole ttl.

Layout, per key (``digest`` is :attr:`dibs.keys.Key.digest`, never the key's own text):

* ``{prefix}rec:{digest}`` is a hash holding the whole record: format, namespace and name, the fence
  and attempt counters, the lease, the last failure and the artifact with its payload. The hash is
  never deleted (and never given an expiry): ``forget``, ``prune``, ``reap`` and ``discard`` clear it
  down to a tombstone that keeps the fence, so the fence keeps increasing for the life of the store.
* ``{prefix}chan:{digest}`` is the pub/sub channel that complete, release, force-release, forget and
  reap publish on. Each process's watch hub follows them all with one pattern subscription
  (:class:`~dibs.stores.redis.feed.PatternFeed`), so waiters wake at once instead of polling.

Modules: :mod:`.settings` (the URL's options and the client's defaults), :mod:`.scripts` (the Lua
scripts, package data under ``lua/`` sharing one prelude), :mod:`.store` (:class:`RedisStore`) and
:mod:`.feed` (the pub/sub change feed).

Each script runs by its SHA1 (``EVALSHA``), sent through the client's ``execute_command``
(:class:`~dibs.stores.redis.scripts.Script`); a server that does not know it (``NOSCRIPT``: after a
restart, a failover or ``SCRIPT FLUSH``; the script did not run) gets it loaded, and it is run again
once. Not Redis Functions (``FUNCTION LOAD``/``FCALL``, Redis 7), though a function skips the ~2 µs
each call spends building the scripts' constants and functions (measured: acquire 15.4 → 11.7 µs,
complete 21.2 → 18.2 µs of server time): a function without flags is refused outright while the
server is over ``maxmemory``, where a script is refused only at its first write, so reads and
acquires that find an artifact or a holder would fail there too; and the library, kept by the
server across restarts and versions, would need ``FUNCTION`` rights and cleaning up.

Why scripts rather than ``WATCH``/``MULTI`` compare-and-swap: a script runs to completion before any
other command, reads the Redis server's clock (``TIME``) in the same step, and costs one round trip
with no retry loop under contention. The scripts implement the rules of
:mod:`dibs.stores.transitions` (the contract suite holds both to the same behaviour); a rejected
write returns the record as it is, and :func:`~dibs.stores.transitions.explain_lost` words the error.

Times are the Redis server's ``TIME`` as Unix seconds, formatted with 17 significant digits so that
Python reads back exactly the double that Lua compared. Integers are stored and compared as decimal
strings (Lua numbers are doubles, exact only up to 2^53): a fence goes up by Lua arithmetic only below
10^15, with ``HINCRBY`` from there. The scripts check a record with the same rules as the shared
decoder (:mod:`dibs.stores.decoder`) before writing, so they never change a record Python would refuse;
``list`` and ``reap`` skip (and count) values under the prefix that are not dibs records. Redis 5 or
later is needed: it replicates a script by its effects, so a script may read ``TIME`` and then write.
Limits that come with Redis:

* Fencing is only as durable as the data: a server that restarts without persistence (or a replica
  promoted before it received the last write) forgets leases and fences. Use AOF persistence, and a
  ``maxmemory-policy`` that never evicts these keys (``noeviction`` or a ``volatile-*`` policy; dibs
  sets no expiry on its keys).
* Redis Cluster is not supported: records and channels are plain keys, not hash-tagged.
"""

from dibs.stores.redis.settings import DEFAULT_MAX_CONNECTIONS, DEFAULT_PREFIX
from dibs.stores.redis.store import DEFAULT_VALUE_LIMIT, RedisStore

__all__ = ["DEFAULT_MAX_CONNECTIONS", "DEFAULT_PREFIX", "DEFAULT_VALUE_LIMIT", "RedisStore"]

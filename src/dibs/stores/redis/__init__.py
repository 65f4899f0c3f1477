"""The Redis store: every operation is one Lua script, so Redis itself decides each step atomically.

URLs (:mod:`.settings`; ``rediss`` for TLS):

* ``redis://[user:password@]host[:port][/db][?prefix=dibs:&socket_timeout=10]``: one server;
* ``redis+cluster://[user:password@]host:port[,host:port...][?prefix=dibs:]``: a Redis Cluster;
* ``redis+sentinel://[user:password@]host:port[,host:port...][/db]?service_name=NAME``: the master a
  Sentinel set names, followed through failovers.

``prefix`` (default ``dibs:``) starts every Redis key dibs writes, so several applications or
test runs can share one database; ``max_artifact_size`` (bytes) sets a limit below the server's own;
``min_replicas`` makes every grant and complete wait for that many replicas (see the limits below);
redis-py's connection options pass on. docs/deploy-redis.md is the operator's page: the URLs, the
ACL, connections per process, and what a failover can lose.

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

and, per namespace ``NS``, the indexes that make ``dibs ls``, ``dibs top``, the Airflow Reservations
page, prune and reap cost what they show or remove rather than the namespace's history (issue 30;
:mod:`.index` says what each holds, :mod:`.admin` how they are read):

* ``{prefix}idx:NS:cls`` (every listed record, by class, in key order), ``{prefix}idx:NS:lease:h`` and
  ``lease:r`` (lease expiries), ``{prefix}idx:NS:art`` and ``fail`` (the artifacts' and failures'
  times): sorted sets the writing scripts keep in the same atomic step as the record (the prelude's
  ``sync_index``: only what changed, so a heartbeat is one ``ZADD``, a hit nothing);
* ``{prefix}idx:namespaces`` (a set: the namespaces, for reads of all of them without a SCAN) and
  ``{prefix}idx:ready`` (the marker that they hold every record; without it the first admin read
  places what is there, once).

On a Redis Cluster a script may touch only keys of its record's slot: the records and their
namespace's indexes share one only when the prefix has a hash tag (``prefix={dibs}:``, every key of
the store in one slot), and then the scripts keep the indexes; under an untagged prefix they keep none
and the admin reads and removals SCAN every node, as before (logged once). Each script otherwise
touches its record alone, so it runs on one slot; its channel is published with a classic
``PUBLISH``, which the cluster hands to every node (a script may not ``SPUBLISH`` outside its key's
slot), and the feed's one subscription, on any node, hears them all.

Prune and reap take their candidates from those indexes and clear them in batches: one
``drop_many`` script call judges :data:`~dibs.stores.redis.admin.REMOVAL_BATCH` records of a namespace
(all its keys are in one slot wherever the indexes are kept), each loaded and judged by the same Lua
as the one-key ``drop`` script (``lua/dropping.lua``), published on its channel and moved in the
indexes as that script does; a foreign value is reported, skipped and left alone. Per record that is
~30-48 µs of server CPU (more in a larger keyspace) and ~11 µs of the client's, where a drop script
per key cost ~47-65 and ~24: the call's own cost is gone, the Lua checks and commands of each record
remain (docs/deploy-redis.md). Without indexes (an untagged cluster) they scan and drop key by key.

Modules: :mod:`.settings` (the URL's options and the client's defaults), :mod:`.topology` (the client
for one server, a cluster or a Sentinel set, and what each says about its errors), :mod:`.scripts`
(the Lua scripts, package data under ``lua/`` sharing one prelude, a guard and the removal rules),
:mod:`.replicas` (``WAIT`` after a grant or a complete, for ``min_replicas``), :mod:`.store`
(:class:`RedisStore`), :mod:`.feed` (the pub/sub change feed), :mod:`.index` (the namespaces' index
keys) and :mod:`.admin` (the reads and removals through them).

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
``list``, the admin reads and ``reap`` skip (and count) values under the prefix that are not dibs
records. Redis 5 or later is needed: it replicates a script by its effects, so a script may read
``TIME`` and then write.
Limits that come with Redis:

* Fencing is only as durable as the data: a server that restarts without persistence forgets leases
  and fences. Use AOF persistence, and a ``maxmemory-policy`` that never evicts these keys
  (``noeviction`` or a ``volatile-*`` policy; dibs sets no expiry on its keys).
* Replication is asynchronous: a replica promoted by a failover may lack the last writes, and an old
  master keeps taking writes until it is demoted. Without ``min_replicas`` a lease granted then can
  be forgotten and its token granted again, an artifact lost and computed again (the holder is told
  ``LeaseLost``, reason ``rolled_back``). With ``min_replicas=N`` a grant or complete is answered only
  once N replicas have it (:mod:`.replicas`): an unconfirmed grant is released and refused, an
  unconfirmed complete is confirmed by the read that settles it. Heartbeats and releases are never
  waited for. docs/deploy-redis.md says exactly what holds.
"""

from dibs.stores.redis.settings import DEFAULT_MAX_CONNECTIONS, DEFAULT_PREFIX
from dibs.stores.redis.store import DEFAULT_VALUE_LIMIT, RedisStore

__all__ = ["DEFAULT_MAX_CONNECTIONS", "DEFAULT_PREFIX", "DEFAULT_VALUE_LIMIT", "RedisStore"]

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
  (:class:`_PatternFeed`), so waiters wake at once instead of polling.

Why scripts rather than ``WATCH``/``MULTI`` compare-and-swap: a script runs to completion before any
other command, reads the Redis server's clock (``TIME``) in the same step, and costs one round trip
with no retry loop under contention. The scripts implement the rules of
:mod:`dibs.stores.transitions` (the contract suite holds both to the same behaviour); a rejected
write returns the record as it is, and :func:`~dibs.stores.transitions.explain_lost` words the error.

Times are the Redis server's ``TIME`` as Unix seconds, formatted with 17 significant digits so that
Python reads back exactly the double that Lua compared. Integers are never Lua numbers (doubles, exact
only up to 2^53): the fence goes up with ``HINCRBY`` and is compared as a decimal string. The scripts
check a record with the same rules as the shared decoder (:mod:`dibs.stores.decoder`) before writing,
so they never change a record Python would refuse; ``list`` and ``reap`` skip (and count) values under
the prefix that are not dibs records. Redis 5 or later is needed: it replicates a
script by its effects, so a script may read ``TIME`` and then write. Limits that come with Redis:

* Fencing is only as durable as the data: a server that restarts without persistence (or a replica
  promoted before it received the last write) forgets leases and fences. Use AOF persistence, and a
  ``maxmemory-policy`` that never evicts these keys (``noeviction`` or a ``volatile-*`` policy; dibs
  sets no expiry on its keys).
* Redis Cluster is not supported: records and channels are plain keys, not hash-tagged.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import math
import re
import time
import urllib.parse
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any, cast

import redis
import redis.client
import redis.exceptions
from redis.backoff import NoBackoff
from redis.commands.core import Script
from redis.retry import Retry

from dibs.config import validate_seconds
from dibs.display import printable
from dibs.errors import ConfigurationError, CorruptRecord, StoreUnavailable
from dibs.keys import Key
from dibs.records import (
    MAX_COUNT,
    MAX_FENCE,
    MAX_TIMESTAMP,
    ArtifactRecord,
    Granted,
    Held,
    KeyState,
    LeaseRecord,
    LeaseToken,
    Present,
    StoreOutcome,
    new_lease_id,
)
from dibs.stores import decoder, redact_url, transitions, url_userinfo
from dibs.stores.base import Listing, Skipped, Store, refuse_too_large, skip
from dibs.stores.feeds import ChangeFeed
from dibs.stores.requests import AcquireRequest, NewArtifact
from dibs.stores.transitions import MAX_ERROR_LENGTH, explain_lost

__all__ = ["RedisStore"]

logger = logging.getLogger(__name__)

FORMAT = "dibs.redis/1"
DEFAULT_PREFIX = "dibs:"
# Only characters that mean nothing to SCAN's glob MATCH, so a prefix can never select foreign keys.
_PREFIX_RE = re.compile(r"[A-Za-z0-9_.:/|-]{1,100}")
# Connection defaults; the URL's query options override them (redis-py lets the URL win).
_DEFAULTS: dict[str, Any] = {
    "socket_connect_timeout": 5.0,
    "socket_timeout": 10.0,
    # A PING before reusing a connection idle this long finds dead sockets before a script is sent.
    "health_check_interval": 30,
    # No transparent retries: a script whose reply was lost may have run, and running complete or
    # release twice would turn a success into a LeaseLost. The caller's policy retries instead.
    "retry": Retry(NoBackoff(), 0),
}
_SCAN_BATCH = 500
#: Connections per store and process, the watch hub's subscription included (``?max_connections=``).
DEFAULT_MAX_CONNECTIONS = 4
#: Redis's default ``proto-max-bulk-len``: the limit assumed when the server refuses ``CONFIG GET``.
DEFAULT_VALUE_LIMIT = 512 * 1024 * 1024
#: Room in the command for what ``complete`` sends besides the payload (the key, token, checksum...).
_COMMAND_OVERHEAD = 4096

#: What a script returns: ``{status, now, extra, FIELDS...[, payload]}`` or ``{"corrupt", why}``.
_Reply = list[Any]

# The hash fields of a record are the shared decoder's names, in the order the scripts return them.
# The Lua side is generated from these tuples so the two cannot drift apart.
_LEASE_FIELDS = decoder.LEASE_FIELDS
_FAILURE_FIELDS = decoder.FAILURE_FIELDS
_ARTIFACT_FIELDS = decoder.ARTIFACT_FIELDS
_FIELDS = decoder.FIELDS
# Integers up to a signed 64-bit one (the most HINCRBY can hold), and counters up to a 32-bit one.
_WIDE_INTEGERS = ("fence", "lease_fence", "artifact_size", "artifact_fence")
_COUNTERS = ("attempts", "lease_attempt", "failure_count")
# Text that must not be empty when present (as the decoder requires).
_NONEMPTY = (
    "lease_owner",
    "lease_id",
    "failure_owner",
    "artifact_serializer",
    "artifact_checksum",
    "artifact_producer",
)
_SECONDS = (
    "lease_acquired_at",
    "lease_expires_at",
    "lease_ttl",
    "lease_max_expires_at",
    "failure_at",
    "artifact_created_at",
    "artifact_compute_seconds",
)


def _lua_list(names: Sequence[str]) -> str:
    return "{" + ", ".join(f"'{name}'" for name in names) + "}"


# Shared by every script. Nothing is written before ``load_record`` has accepted the record, so a
# foreign or damaged value at a dibs key is reported (as {'corrupt', why}) and never changed.
_LUA_PRELUDE = f"""
local FORMAT = '{FORMAT}'
local FIELDS = {_lua_list(_FIELDS)}
local GROUPS = {{
  lease = {_lua_list(_LEASE_FIELDS)},
  failure = {_lua_list(_FAILURE_FIELDS)},
  artifact = {_lua_list(_ARTIFACT_FIELDS)},
}}
-- Integers are compared and stored as decimal strings, never as Lua numbers: those are doubles, and
-- a fence above 2^53 would stop increasing and be written back as '1e+17'. MAX_FENCE is what HINCRBY
-- holds (a signed 64-bit integer), MAX_COUNT a signed 32-bit one; MAX_TIME the end of the year 9999.
local MAX_FENCE = '{MAX_FENCE}'
local MAX_COUNT = '{MAX_COUNT}'
local MAX_TIME = {MAX_TIMESTAMP!r}
local LIMITS = {{}}
for _, field in ipairs({_lua_list(_WIDE_INTEGERS)}) do LIMITS[field] = MAX_FENCE end
for _, field in ipairs({_lua_list(_COUNTERS)}) do LIMITS[field] = MAX_COUNT end
local SECONDS = {{}}
for _, field in ipairs({_lua_list(_SECONDS)}) do SECONDS[field] = true end
local NONEMPTY = {{}}
for _, field in ipairs({_lua_list(_NONEMPTY)}) do NONEMPTY[field] = true end

-- Whether a canonical decimal integer (no sign, no leading zero) is at most the decimal ``limit``.
local function at_most(value, limit)
  return #value < #limit or (#value == #limit and value <= limit)
end

-- Values exactly as these scripts and Python write them, in the ranges of dibs.stores.decoder, so
-- that a script never writes to a record that Python would refuse to read.
local function well_formed(field, value)
  local limit = LIMITS[field]
  if limit ~= nil then
    return (value == '0' or string.find(value, '^[1-9]%d*$') ~= nil) and at_most(value, limit)
  end
  if SECONDS[field] then
    if not (string.find(value, '^%d+%.?%d*$') or string.find(value, '^%d+%.?%d*e[-+]%d+$')) then
      return false
    end
    local seconds = tonumber(value)
    return seconds ~= nil and seconds >= 0 and seconds <= MAX_TIME
  end
  if NONEMPTY[field] then
    return value ~= ''
  end
  return true
end

-- 17 significant digits: Python parses back exactly the double compared here.
local function num(x)
  return string.format('%.17g', x)
end

-- The Redis server's clock, in Unix seconds: the only clock that judges expiry.
local function store_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

-- The record as a table of field -> string; nil when the key has no record; false and why when the
-- value at the key is not a dibs record. An empty namespace skips the identity check (listing).
local function load_record(key, namespace, name)
  local kind = redis.call('TYPE', key)['ok']
  if kind == 'none' then
    return nil
  end
  if kind ~= 'hash' then
    return false, 'it is a Redis ' .. kind .. ', not a hash'
  end
  local values = redis.call('HMGET', key, unpack(FIELDS))
  local rec = {{}}
  for i, field in ipairs(FIELDS) do
    local value = values[i]
    if value then
      if not well_formed(field, value) then
        return false, 'its ' .. field .. ' is ' .. string.format('%q', string.sub(value, 1, 40))
          .. ', not a value dibs writes there'
      end
      rec[field] = value
    end
  end
  if rec.format ~= FORMAT then
    return false, 'its format is ' .. tostring(rec.format or 'missing') .. ', expected ' .. FORMAT
  end
  if not (rec.namespace and rec.name and rec.fence and rec.attempts) then
    return false, 'its namespace, name, fence or attempts field is missing'
  end
  if namespace ~= '' and (rec.namespace ~= namespace or rec.name ~= name) then
    return false, 'it belongs to key ' .. rec.namespace .. '/' .. rec.name
  end
  for group, fields in pairs(GROUPS) do
    local present = 0
    for _, field in ipairs(fields) do
      if rec[field] then
        present = present + 1
      end
    end
    if present ~= 0 and present ~= #fields then
      return false, 'its ' .. group .. ' is incomplete'
    end
  end
  if rec.artifact_fence and redis.call('HEXISTS', key, 'artifact_payload') == 0 then
    return false, 'its artifact has no payload'
  end
  if rec.lease_id and rec.lease_fence ~= rec.fence then
    return false, 'its lease_fence ' .. rec.lease_fence .. ' is not its fence ' .. rec.fence
  end
  if rec.lease_max_expires_at and not rec.lease_id then
    return false, 'its lease_max_expires_at is set without a lease'
  end
  if rec.artifact_fence and not at_most(rec.artifact_fence, rec.fence) then
    return false, 'its artifact_fence ' .. rec.artifact_fence .. ' is above its fence ' .. rec.fence
  end
  return rec
end

-- Whether (fence, lease id) is the current token: a lease, not yet completed, with both parts equal.
-- Whether decimal a < decimal b, exactly (fences go beyond what a Lua number holds exactly).
local function fence_below(a, b)
  return #a < #b or (#a == #b and a < b)
end

local function is_current(rec, fence, lease_id)
  return rec ~= nil and rec.lease_id == lease_id and rec.lease_fence == fence
end

local function capped_expiry(now, ttl, max_expires)
  local expires = now + ttl
  if max_expires ~= nil and max_expires < expires then
    return max_expires
  end
  return expires
end

local function drop_lease(key)
  redis.call('HDEL', key, 'lease_max_expires_at', unpack(GROUPS.lease))
end

-- {{status, now, extra, FIELDS...[, payload]}}, read after this script's writes.
local function reply(status, now, key, extra, with_payload)
  local out = {{status, num(now), extra or false}}
  local values = redis.call('HMGET', key, unpack(FIELDS))
  for i = 1, #FIELDS do
    out[i + 3] = values[i]
  end
  if with_payload then
    out[#FIELDS + 4] = redis.call('HGET', key, 'artifact_payload')
  end
  return out
end
"""


def _seconds(value: float, what: str) -> str:
    """A finite number of seconds as the text Lua's ``tonumber`` reads back to the same double."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigurationError(
            f"{what} must be a finite number of seconds, got {value!r}", value=repr(value)
        )
    return repr(float(value))


class RedisStore(Store):
    """Reservation records in Redis, each operation one atomic Lua script judged on Redis's clock.

    See the module docstring for the URL, the layout and Redis's limits.
    """

    scheme = "redis"
    clock = "the Redis server's clock (TIME)"

    # KEYS[1]: the key's record hash
    # ARGV[1]: namespace, ARGV[2]: name, ARGV[3]: owner, ARGV[4]: ttl in seconds,
    # ARGV[5]: maximum lease age in seconds, or '' for none, ARGV[6]: lease id for a new lease,
    # ARGV[7]: the oldest artifact the caller takes, as a maximum age in seconds, or '' for any,
    # ARGV[8]: the lowest fencing token of an artifact the caller takes (decimal), or ''
    # Returns {'corrupt', why} or {'present'|'granted'|'reentered'|'held', now, took_over_from, FIELDS...}; a
    # 'present' reply ends with the artifact payload. A stale artifact is no hit: the lease can be
    # taken beside it, and complete replaces it.
    LUA_ACQUIRE_SCRIPT = (
        _LUA_PRELUDE
        + """
local now = store_now()
local rec, why = load_record(KEYS[1], ARGV[1], ARGV[2])
if rec == false then
  return {'corrupt', why}
end
if rec == nil then
  rec = {fence = '0', attempts = '0'}
  redis.call('HSET', KEYS[1], 'format', FORMAT, 'namespace', ARGV[1], 'name', ARGV[2],
    'fence', '0', 'attempts', '0')
end
if rec.artifact_fence then
  local created = tonumber(rec.artifact_created_at)
  local stale = (ARGV[7] ~= '' and (tonumber(ARGV[7]) <= 0 or now - created >= tonumber(ARGV[7])))
    or (ARGV[8] ~= '' and fence_below(rec.artifact_fence, ARGV[8]))
  if not stale then
    return reply('present', now, KEYS[1], false, true)
  end
end
local ttl = tonumber(ARGV[4])
local max_expires = tonumber(rec.lease_max_expires_at)
if rec.lease_id and rec.lease_owner == ARGV[3] and (max_expires == nil or now < max_expires) then
  -- The same owner again: its own lease, same token, expiry extended.
  redis.call('HSET', KEYS[1], 'lease_expires_at', num(capped_expiry(now, ttl, max_expires)),
    'lease_ttl', ARGV[4])
  return reply('reentered', now, KEYS[1], false, false)
end
if rec.lease_id and now < tonumber(rec.lease_expires_at) then
  return reply('held', now, KEYS[1], false, false)
end
-- Free, released or expired: the key changes hands and the fence goes up, exactly (HINCRBY on the
-- decimal string, read back as a string), unless it cannot go any higher.
if rec.fence == MAX_FENCE then
  return {'exhausted', rec.fence}
end
redis.call('HINCRBY', KEYS[1], 'fence', 1)
local fence = redis.call('HGET', KEYS[1], 'fence')
local attempt = rec.attempts
if attempt ~= MAX_COUNT then
  attempt = num(tonumber(attempt) + 1)
end
local new_max = nil
if ARGV[5] ~= '' then
  new_max = now + tonumber(ARGV[5])
end
redis.call('HSET', KEYS[1], 'attempts', attempt,
  'lease_owner', ARGV[3], 'lease_fence', fence, 'lease_id', ARGV[6],
  'lease_acquired_at', num(now), 'lease_expires_at', num(capped_expiry(now, ttl, new_max)),
  'lease_ttl', ARGV[4], 'lease_attempt', attempt)
if new_max then
  redis.call('HSET', KEYS[1], 'lease_max_expires_at', num(new_max))
else
  redis.call('HDEL', KEYS[1], 'lease_max_expires_at')
end
return reply('granted', now, KEYS[1], rec.lease_owner or false, false)
"""
    )

    # KEYS[1]: the key's record hash
    # ARGV[1]: namespace, ARGV[2]: name, ARGV[3]: fence, ARGV[4]: lease id, ARGV[5]: ttl in seconds
    # Returns {'corrupt', why} or {'ok'|'lost', now, false, FIELDS...}
    LUA_HEARTBEAT_SCRIPT = (
        _LUA_PRELUDE
        + """
local now = store_now()
local rec, why = load_record(KEYS[1], ARGV[1], ARGV[2])
if rec == false then
  return {'corrupt', why}
end
if not is_current(rec, ARGV[3], ARGV[4]) then
  return reply('lost', now, KEYS[1], false, false)
end
local max_expires = tonumber(rec.lease_max_expires_at)
if max_expires ~= nil and now >= max_expires then
  return reply('lost', now, KEYS[1], false, false)
end
redis.call('HSET', KEYS[1], 'lease_expires_at',
  num(capped_expiry(now, tonumber(ARGV[5]), max_expires)), 'lease_ttl', ARGV[5])
return reply('ok', now, KEYS[1], false, false)
"""
    )

    # KEYS[1]: the key's record hash
    # ARGV[1]: namespace, ARGV[2]: name, ARGV[3]: fence, ARGV[4]: lease id, ARGV[5]: serializer,
    # ARGV[6]: payload, ARGV[7]: checksum, ARGV[8]: the key's notification channel,
    # ARGV[9]: the work's compute time in seconds ('' when unknown)
    # Returns {'corrupt', why} or {'ok'|'lost', now, false, FIELDS...} (without the payload)
    LUA_COMPLETE_SCRIPT = (
        _LUA_PRELUDE
        + """
local now = store_now()
local rec, why = load_record(KEYS[1], ARGV[1], ARGV[2])
if rec == false then
  return {'corrupt', why}
end
if not is_current(rec, ARGV[3], ARGV[4]) then
  return reply('lost', now, KEYS[1], false, false)
end
redis.call('HSET', KEYS[1], 'artifact_serializer', ARGV[5], 'artifact_payload', ARGV[6],
  'artifact_size', num(string.len(ARGV[6])), 'artifact_checksum', ARGV[7],
  'artifact_producer', rec.lease_owner, 'artifact_fence', rec.lease_fence,
  'artifact_created_at', num(now))
local compute = tonumber(ARGV[9])
if compute ~= nil and compute >= 0 and compute <= MAX_TIME then
  redis.call('HSET', KEYS[1], 'artifact_compute_seconds', num(compute))
else
  redis.call('HDEL', KEYS[1], 'artifact_compute_seconds')
end
drop_lease(KEYS[1])
redis.call('PUBLISH', ARGV[8], 'complete')
return reply('ok', now, KEYS[1], false, false)
"""
    )

    # KEYS[1]: the key's record hash
    # ARGV[1]: namespace, ARGV[2]: name, ARGV[3]: fence, ARGV[4]: lease id,
    # ARGV[5]: '1' to record a failure, '2' to record a stop (not counted), else '0',
    # ARGV[6]: the error text (already truncated),
    # ARGV[7]: the key's notification channel
    # Returns {'corrupt', why} or {'ok'|'lost', now, false, FIELDS...}
    LUA_RELEASE_SCRIPT = (
        _LUA_PRELUDE
        + """
local now = store_now()
local rec, why = load_record(KEYS[1], ARGV[1], ARGV[2])
if rec == false then
  return {'corrupt', why}
end
if not is_current(rec, ARGV[3], ARGV[4]) then
  return reply('lost', now, KEYS[1], false, false)
end
if ARGV[5] ~= '0' then
  local count = rec.failure_count or '0'
  if ARGV[5] == '1' and count ~= MAX_COUNT then
    count = num(tonumber(count) + 1)
  end
  redis.call('HSET', KEYS[1], 'failure_count', count, 'failure_error', ARGV[6],
    'failure_owner', rec.lease_owner, 'failure_at', num(now))
end
drop_lease(KEYS[1])
redis.call('PUBLISH', ARGV[7], 'release')
return reply('ok', now, KEYS[1], false, false)
"""
    )

    # KEYS[1]: the key's record hash
    # ARGV[1]: namespace, ARGV[2]: name, ARGV[3]: the key's notification channel,
    # ARGV[4]: what to drop: 'lease' (force release), 'expired' (reap), 'result' (forget), 'empty'
    # (discard: everything but the fence, if it holds nothing) or 'old' (prune: everything but the
    # fence, if it is older than ARGV[5] seconds). The hash itself is never deleted: what is left
    # (a tombstone: format, key, fence, attempts 0) keeps the fence rising (dibs.stores.transitions).
    # Returns {'corrupt', why}, {'changed'} or {'unchanged'}
    LUA_DROP_SCRIPT = (
        _LUA_PRELUDE
        + """
local rec, why = load_record(KEYS[1], ARGV[1], ARGV[2])
if rec == false then
  return {'corrupt', why}
end
if rec == nil then
  return {'unchanged'}
end
if ARGV[4] == 'result' then
  if not (rec.artifact_fence or rec.failure_count) then
    return {'unchanged'}
  end
  redis.call('HDEL', KEYS[1], 'artifact_payload', 'artifact_compute_seconds', unpack(GROUPS.artifact))
  redis.call('HDEL', KEYS[1], unpack(GROUPS.failure))
elseif ARGV[4] == 'empty' then
  -- discard: only a record that holds nothing becomes a tombstone (not counted if it is one)
  if rec.lease_id or rec.artifact_fence or rec.failure_count or rec.attempts == '0' then
    return {'unchanged'}
  end
  redis.call('HSET', KEYS[1], 'attempts', '0')
  return {'changed'}
elseif ARGV[4] == 'old' then
  -- prune (ARGV[5]: seconds): see dibs.stores.transitions.prunable; a tombstone is not counted again
  if not (rec.lease_id or rec.artifact_fence or rec.failure_count or rec.attempts ~= '0') then
    return {'unchanged'}
  end
  local limit = store_now() - tonumber(ARGV[5])
  if rec.lease_id and tonumber(rec.lease_expires_at) >= limit then
    return {'unchanged'}
  end
  if rec.artifact_fence then
    if tonumber(rec.artifact_created_at) >= limit then
      return {'unchanged'}
    end
  elseif rec.failure_count and tonumber(rec.failure_at) >= limit then
    return {'unchanged'}
  end
  drop_lease(KEYS[1])
  redis.call('HDEL', KEYS[1], 'artifact_payload', 'artifact_compute_seconds', unpack(GROUPS.artifact))
  redis.call('HDEL', KEYS[1], unpack(GROUPS.failure))
  redis.call('HSET', KEYS[1], 'attempts', '0')
else
  if not rec.lease_id then
    return {'unchanged'}
  end
  if ARGV[4] == 'expired' and store_now() < tonumber(rec.lease_expires_at) then
    return {'unchanged'}
  end
  drop_lease(KEYS[1])
end
redis.call('PUBLISH', ARGV[3], ARGV[4])
return {'changed'}
"""
    )

    # KEYS[1]: the key's record hash
    # ARGV[1]: namespace, or '' when listing (the caller checks the identity against the digest),
    # ARGV[2]: name, ARGV[3]: '1' to include the artifact payload, else '0'
    # Returns {'corrupt', why} or {'ok', now, false, FIELDS...[, payload]}
    LUA_READ_SCRIPT = (
        _LUA_PRELUDE
        + """
local now = store_now()
local rec, why = load_record(KEYS[1], ARGV[1], ARGV[2])
if rec == false then
  return {'corrupt', why}
end
return reply('ok', now, KEYS[1], false, ARGV[3] == '1')
"""
    )

    def __init__(self, url: str) -> None:
        self._url = redact_url(url)
        client_url, self._prefix, self.max_artifact_size = _parse_url(url, self._url)
        self._value_limit: int | None = None  # read from the server on the first complete
        try:
            # One bounded pool per store, shared by every client of the process (dibs.runtime): the
            # watch hub's subscription holds one connection of it, operations the rest, and a caller
            # finding them all busy waits for one instead of opening more (DEFAULT_MAX_CONNECTIONS).
            pool = redis.BlockingConnectionPool.from_url(
                client_url,
                max_connections=DEFAULT_MAX_CONNECTIONS,
                timeout=_DEFAULTS["socket_timeout"],
                **_DEFAULTS,
            )
            self._client = redis.Redis(connection_pool=pool)
            # The pool creates connections lazily; building one (without connecting) now turns an
            # unknown or malformed query option into a configuration error instead of a failure on
            # the first operation.
            pool.connection_class(**pool.connection_kwargs)
        except (ValueError, TypeError) as exc:
            raise ConfigurationError(
                f"invalid Redis store URL {self._url!r}: {exc}; expected "
                "'redis://[user:password@]host[:port][/db][?prefix=dibs:]' with redis-py connection "
                "options (socket_timeout, max_connections, ssl_cert_reqs, ...) as further query parameters",
                url=self._url,
            ) from exc
        self._acquire = self._client.register_script(self.LUA_ACQUIRE_SCRIPT)
        self._heartbeat = self._client.register_script(self.LUA_HEARTBEAT_SCRIPT)
        self._complete = self._client.register_script(self.LUA_COMPLETE_SCRIPT)
        self._release = self._client.register_script(self.LUA_RELEASE_SCRIPT)
        self._drop = self._client.register_script(self.LUA_DROP_SCRIPT)
        self._read = self._client.register_script(self.LUA_READ_SCRIPT)

    @classmethod
    def from_url(cls, url: str) -> RedisStore:
        return cls(url)

    @property
    def url(self) -> str:
        return self._url

    @property
    def prefix(self) -> str:
        """What every Redis key of this store starts with."""
        return self._prefix

    def record_key(self, key: Key) -> str:
        """The Redis key of ``key``'s record hash (for operators and tests)."""
        return f"{self._prefix}rec:{key.digest}"

    def channel(self, key: Key) -> str:
        """The pub/sub channel on which changes to ``key`` that can end a wait are published."""
        return f"{self._prefix}chan:{key.digest}"

    # -- operations ---------------------------------------------------------------------------------

    def read(self, key: Key) -> KeyState:
        reply = self._run(self._read, key, "read", key.namespace, key.name, "1")
        return self._state(key, reply, with_payload=True)

    def acquire(self, key: Key, request: AcquireRequest) -> StoreOutcome:
        reply = self._run(
            self._acquire,
            key,
            "reserve",
            key.namespace,
            key.name,
            request.owner,
            _seconds(request.ttl, "ttl"),
            "" if request.max_lease_age is None else _seconds(request.max_lease_age, "max_lease_age"),
            new_lease_id(),
            "" if request.max_age is None else _seconds(request.max_age, "max_age"),
            "" if request.min_fence is None else str(int(request.min_fence)),
        )
        status = reply[0]
        if status == b"exhausted":
            raise transitions.fence_exhausted(key, int(reply[1]))
        state = self._state(key, reply, with_payload=status == b"present")
        if status == b"present":
            assert state.artifact is not None
            return Present(state.artifact)
        assert state.lease is not None
        if status == b"held":
            return Held(state.lease, state.now, state.failure)
        took_over_from = None if reply[2] is None else str(reply[2].decode("utf-8"))
        return Granted(state.lease, state.failure, took_over_from, reentered=status == b"reentered")

    def heartbeat(self, key: Key, token: LeaseToken, ttl: float) -> LeaseRecord:
        reply = self._run(
            self._heartbeat,
            key,
            "heartbeat",
            key.namespace,
            key.name,
            token.fence,
            token.lease_id,
            _seconds(ttl, "ttl"),
        )
        state = self._state(key, reply)
        if reply[0] == b"lost":
            raise explain_lost(state, token, "heartbeat")
        assert state.lease is not None
        return state.lease

    def value_limit(self) -> int:
        """The most bytes one artifact may have here: the server's limits on one value and on one
        command (read once), or ``max_artifact_size`` when that is lower."""
        if self._value_limit is None:
            limits = []
            for setting, room in (
                ("proto-max-bulk-len", 0),
                ("client-query-buffer-limit", _COMMAND_OVERHEAD),
            ):
                with self._service("read the server's limits", None):
                    try:
                        found = self._client.config_get(setting).get(setting)
                    except redis.exceptions.ResponseError:  # CONFIG refused (managed services, ACLs)
                        found = None  # then Redis's default is assumed
                limits.append(int(found) - room if found is not None else DEFAULT_VALUE_LIMIT)
            self._value_limit = min(limits)
        if self.max_artifact_size is not None:
            return min(self._value_limit, self.max_artifact_size)
        return self._value_limit

    def complete(self, key: Key, token: LeaseToken, artifact: NewArtifact) -> ArtifactRecord:
        payload = artifact.payload
        refuse_too_large(
            key,
            len(payload),
            len(payload),
            self.value_limit(),
            where=f"Redis at {self._url} takes in one value (proto-max-bulk-len, client-query-buffer-limit"
            " or ?max_artifact_size=)",
            remedy="Raise the server's limits, or store the data elsewhere and return a reference to it",
        )
        reply = self._run(
            self._complete,
            key,
            "complete",
            key.namespace,
            key.name,
            token.fence,
            token.lease_id,
            artifact.serializer,
            payload,
            artifact.checksum,
            self.channel(key),
            "" if artifact.compute_seconds is None else repr(float(artifact.compute_seconds)),
        )
        state = self._state(key, reply)
        if reply[0] == b"lost":
            raise explain_lost(state, token, "complete")
        assert state.artifact is not None
        # The reply leaves the payload out (no need to send it back): it is the one just written.
        return ArtifactRecord(
            serializer=state.artifact.serializer,
            payload=payload,
            size=state.artifact.size,
            checksum=state.artifact.checksum,
            producer=state.artifact.producer,
            fence=state.artifact.fence,
            created_at=state.artifact.created_at,
            compute_seconds=state.artifact.compute_seconds,
        )

    def release(self, key: Key, token: LeaseToken, error: str | None = None, *, counted: bool = True) -> None:
        reply = self._run(
            self._release,
            key,
            "release",
            key.namespace,
            key.name,
            token.fence,
            token.lease_id,
            "0" if error is None else ("1" if counted else "2"),
            "" if error is None else error[:MAX_ERROR_LENGTH],
            self.channel(key),
        )
        if reply[0] == b"lost":
            raise explain_lost(self._state(key, reply), token, "release")

    def force_release(self, key: Key) -> bool:
        return self._drop_part(key, "lease", "force-release")

    def forget(self, key: Key) -> bool:
        return self._drop_part(key, "result", "forget")

    def list(self, namespace: str | None = None) -> Listing:
        """Every record under the prefix, sorted by key, without payloads.

        One SCAN over ``{prefix}rec:*`` plus one pipelined read script per record: dibs keeps no
        index, so nothing can fall out of step with the records. A value under the prefix that is
        not a dibs record is skipped, logged and counted (see :class:`~dibs.stores.base.Listing`).
        """
        states: builtins.list[KeyState] = []
        skipped: builtins.list[Skipped] = []
        for batch in self._scan_batches():
            with self._service("list keys", None):
                pipe = self._client.pipeline(transaction=False)
                for record_key in batch:
                    self._read(keys=[record_key], args=["", "", "0"], client=pipe)
                replies = pipe.execute()
            for record_key, reply in zip(batch, replies, strict=True):
                try:
                    state = self._listed_state(record_key, cast(_Reply, reply))
                except CorruptRecord as exc:
                    skip(skipped, self._where(record_key.decode("utf-8", "backslashreplace")), exc)
                    continue
                if state is not None and (namespace is None or state.key.namespace == namespace):
                    states.append(state)
        return Listing(states, skipped)

    def reap(self, namespace: str | None = None) -> int:
        reaped = 0
        for state in self.list(namespace):
            expired = state.lease is not None and not state.lease.live_at(state.now)
            if not (expired or transitions.holds_nothing(state)):
                continue
            try:
                # The script checks expiry again on the server's clock: a holder may have renewed.
                cleared = expired and self._drop_part(state.key, "expired", "reap")
                reaped += int(self.discard(state.key) or cleared)
            except CorruptRecord as exc:  # damaged since it was listed: skipped, as by list
                skip([], self.record_key(state.key), exc)
        return reaped

    def discard(self, key: Key) -> bool:
        return self._drop_part(key, "empty", "discard")

    def prune(self, namespace: str | None, older_than: float) -> int:
        pruned = 0
        for state in self.list(namespace):
            if not transitions.prunable(state, older_than):
                continue
            try:  # the script judges again, on the server's clock
                pruned += self._drop_part(state.key, "old", "prune", _seconds(older_than, "older_than"))
            except CorruptRecord as exc:  # damaged since it was listed: skipped, as by list
                skip([], self.record_key(state.key), exc)
        return pruned

    def read_many(self, keys: Sequence[Key]) -> builtins.list[KeyState]:
        """Several keys in one round trip (a pipeline of read scripts), for the watch hub."""
        with self._service("read keys", None):
            pipe = self._client.pipeline(transaction=False)
            for key in keys:
                self._read(keys=[self.record_key(key)], args=[key.namespace, key.name, "1"], client=pipe)
            replies = pipe.execute(raise_on_error=False)
        states = []
        for key, reply in zip(keys, replies, strict=True):
            try:
                if isinstance(reply, Exception) or reply[0] == b"corrupt":
                    continue  # its waiters ask for themselves, and get the error
                states.append(self._state(key, cast(_Reply, reply), with_payload=True))
            except CorruptRecord:
                continue
        return states

    def change_feed(self) -> ChangeFeed:
        """One pattern subscription to every key's channel under the prefix, for the whole process."""
        return _PatternFeed(self)

    def close(self) -> None:
        super().close()
        self._client.close()
        self._client.connection_pool.disconnect()

    # -- plumbing -----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _service(self, action: str, key: Key | None) -> Iterator[None]:
        """Translate redis-py's errors into dibs errors; messages name the redacted URL, never secrets."""
        what = f"{action} {key}" if key is not None else action
        try:
            yield
        except (redis.exceptions.AuthenticationError, redis.exceptions.NoPermissionError) as exc:
            raise ConfigurationError(
                f"Redis at {self._url} refused to {what}: {exc}; check the user and password in the "
                "store URL and that the user may run EVALSHA, SCRIPT, SCAN, PUBLISH and SUBSCRIBE "
                "on keys and channels starting with the prefix",
                url=self._url,
            ) from exc
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            raise StoreUnavailable(
                f"could not {what}: Redis at {self._url} did not answer ({type(exc).__name__}: {exc})",
                url=self._url,
                key=None if key is None else str(key),
            ) from exc
        except redis.exceptions.RedisError as exc:
            raise StoreUnavailable(
                f"could not {what}: Redis at {self._url} answered an error ({type(exc).__name__}: {exc})",
                url=self._url,
                key=None if key is None else str(key),
            ) from exc

    def _run(self, script: Script, key: Key, action: str, *args: str | bytes | int) -> _Reply:
        """Run one script on ``key``'s record; a foreign or damaged record raises :class:`CorruptRecord`."""
        with self._service(action, key):
            reply = cast(_Reply, script(keys=[self.record_key(key)], args=args))
        if reply[0] == b"corrupt":
            # The reason may quote the foreign value (its format, the key it names): never raw.
            raise self._corrupt(key, self.record_key(key), printable(reply[1].decode("utf-8", "replace")))
        return reply

    def _drop_part(self, key: Key, part: str, action: str, *more: str) -> bool:
        reply = self._run(self._drop, key, action, key.namespace, key.name, self.channel(key), part, *more)
        return bool(reply[0] == b"changed")

    def _where(self, record_key: str) -> str:
        return f"Redis key {record_key!r} on {self._url}"

    def _corrupt(self, key: Key | None, record_key: str, why: str) -> CorruptRecord:
        return decoder.corrupt(key, self._where(record_key), why)

    def _scan_batches(self) -> Iterator[Sequence[bytes]]:
        # Keys stay bytes: a foreign key under the prefix need not be UTF-8, and must still be reported.
        with self._service("list keys", None):
            batch: builtins.list[bytes] = []
            for raw in self._client.scan_iter(match=f"{self._prefix}rec:*", count=_SCAN_BATCH):
                batch.append(raw)
                if len(batch) >= _SCAN_BATCH:
                    yield batch
                    batch = []
            if batch:
                yield batch

    def _listed_state(self, raw_key: bytes, reply: _Reply) -> KeyState | None:
        """A listed record's state, after checking it is the record its Redis key says it is."""
        record_key = raw_key.decode("utf-8", "backslashreplace")
        if reply[0] == b"corrupt":
            raise self._corrupt(None, record_key, printable(reply[1].decode("utf-8", "replace")))
        if reply[3] is None:  # no format: deleted between SCAN and the read
            return None
        digest = record_key.removeprefix(f"{self._prefix}rec:")
        return self._state(None, reply, record_key=record_key, digest=digest)

    def _state(
        self,
        key: Key | None,
        reply: _Reply,
        *,
        with_payload: bool = False,
        record_key: str | None = None,
        digest: str | None = None,
    ) -> KeyState:
        """Build the :class:`KeyState` a script returned (``{status, now, extra, FIELDS...[, payload]}``)
        with the shared decoder (:mod:`dibs.stores.decoder`), reading every value as text."""
        fields = dict(zip(_FIELDS, reply[3 : 3 + len(_FIELDS)], strict=True))
        now = float(reply[1])
        if key is not None and fields["format"] is None:
            return KeyState(key=key, now=now)
        payload = reply[3 + len(_FIELDS)] if with_payload else b""
        if record_key is None:
            assert key is not None
            record_key = self.record_key(key)
        where = self._where(record_key)
        return decoder.decode(
            fields,
            key,
            now,
            where=where,
            digest=digest,
            textual=True,
            expected_format=FORMAT,
            payload=bytes(payload or b""),
        )


class _PatternFeed(ChangeFeed):
    """``PSUBSCRIBE {prefix}chan:*``: every complete, release, forget and reap under the prefix is
    published on its key's channel, and this one subscription hears them all for the whole process.

    The prefix is restricted to characters that mean nothing to a glob, so the pattern matches
    exactly this store's channels.
    """

    def __init__(self, store: RedisStore) -> None:
        self._store = store
        self._pattern = f"{store.prefix}chan:*".encode()
        self._skip = len(f"{store.prefix}chan:")
        self._pubsub: redis.client.PubSub | None = None

    def open(self) -> None:
        store = self._store
        with store._service("follow the keys of", None):
            pubsub: redis.client.PubSub = store._client.pubsub()  # type: ignore[no-untyped-call]
            try:
                pubsub.psubscribe(self._pattern)
                # The server confirms before this returns: a change after it is never missed.
                deadline = time.monotonic() + float(_DEFAULTS["socket_timeout"])
                while True:
                    message = pubsub.get_message(timeout=max(0.0, deadline - time.monotonic()))
                    if message is not None and message["type"] == "psubscribe":
                        break
                    if time.monotonic() >= deadline:
                        raise redis.exceptions.TimeoutError("the server did not confirm the subscription")
            except BaseException:
                with contextlib.suppress(redis.exceptions.RedisError, OSError):
                    pubsub.close()
                raise
        self._pubsub = pubsub

    def changes(self, watched: Mapping[str, Key], timeout: float) -> Collection[str]:
        assert self._pubsub is not None, "open() first"
        digests: set[str] = set()
        with self._store._service("follow the keys of", None):
            message = self._pubsub.get_message(timeout=timeout)
            # Everything already queued is taken in the same call: a burst is one round of reads.
            while message is not None and len(digests) < _SCAN_BATCH:
                if message["type"] == "pmessage":
                    digests.add(message["channel"][self._skip :].decode("ascii", "replace"))
                message = self._pubsub.get_message(timeout=0.0)
        return digests

    def close(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            with contextlib.suppress(redis.exceptions.RedisError, OSError):
                pubsub.close()


#: Query options that are durations in seconds (``True``: 0 is allowed, it turns the option off).
_DURATIONS = {"socket_timeout": False, "socket_connect_timeout": False, "health_check_interval": True}


def _check_duration(name: str, text: str, bad: Callable[[str], ConfigurationError]) -> None:
    """A duration option through the one rule for durations; redis-py would accept NaN or 1e300 and
    fail later, inside a socket call, with ``OverflowError``."""
    try:
        value = float(text)
    except ValueError:
        raise bad(f"{name}={text!r} is not a number of seconds") from None
    try:
        validate_seconds(name, value, allow_zero=_DURATIONS[name])
    except ConfigurationError as exc:
        raise bad(exc.message) from None


def _parse_url(url: str, redacted: str) -> tuple[str, str, int | None]:
    """Split the store URL into the URL redis-py gets, the key prefix and ``max_artifact_size``,
    checking what dibs can."""

    def bad(problem: str) -> ConfigurationError:
        return ConfigurationError(
            f"invalid Redis store URL {redacted!r}: {problem}; expected "
            "'redis://[user:password@]host[:port][/db][?prefix=dibs:]' or 'rediss://...' for TLS",
            url=redacted,
        )

    if not isinstance(url, str):
        raise bad(f"a URL must be a string, got {type(url).__name__}")
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as exc:
        raise bad(str(exc)) from exc
    userinfo = url_userinfo(url)
    if userinfo is not None and ":" in userinfo and not parts.netloc.startswith(userinfo + "@"):
        # redis-py splits the host off at the first '/', '?' or '#': an unencoded password holding one
        # would be sent cut short, and its tail quoted back as a database number, a port or a host.
        raise bad(
            "its password (or an option value after it) contains an unencoded '/', '?', '#' or '@'; "
            "percent-encode them (%2F, %3F, %23, %40). The password is not shown"
        )
    try:
        parts.port  # noqa: B018 -- urllib checks the port only when asked
    except ValueError as exc:
        raise bad(str(exc)) from exc
    if parts.scheme.lower() not in {"redis", "rediss"}:
        raise bad(f"the scheme is {parts.scheme!r}, not 'redis' or 'rediss'")
    if parts.path not in {"", "/"} and not re.fullmatch(r"/\d+", parts.path):
        raise bad(f"the database {parts.path.lstrip('/')!r} is not a number (use e.g. '/0')")
    kept, prefixes = [], []
    max_size: int | None = None
    for item in parts.query.split("&") if parts.query else []:
        name, _, value = item.partition("=")
        if urllib.parse.unquote(name) == "prefix":
            prefixes.append(urllib.parse.unquote(value))
        elif urllib.parse.unquote(name) == "max_artifact_size":
            text = urllib.parse.unquote(value)
            if not text.isdigit() or int(text) < 1:
                raise bad(f"max_artifact_size={text!r} is not a whole number of bytes, 1 or more")
            max_size = int(text)
        elif urllib.parse.unquote(name) in _DURATIONS:
            _check_duration(urllib.parse.unquote(name), urllib.parse.unquote(value), bad)
            kept.append(item)
        else:
            kept.append(item)  # handed on byte for byte: redis-py unquotes the values itself
    if len(prefixes) > 1:
        raise bad(f"'prefix' is given {len(prefixes)} times")
    prefix = prefixes[0] if prefixes else DEFAULT_PREFIX
    if not _PREFIX_RE.fullmatch(prefix):
        raise bad(
            f"the prefix {prefix!r} is not 1 to 100 of letters, digits and '_.:/|-' (e.g. 'dibs:' or "
            "'team-a:dibs:')"
        )
    return urllib.parse.urlunsplit(parts._replace(query="&".join(kept))), prefix, max_size

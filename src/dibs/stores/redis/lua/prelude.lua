-- The start of every dibs script: dibs.stores.redis.scripts puts the constants it generates from
-- Python (FORMAT, FIELDS and the field GROUPS, the fields of the short replies, the limits and
-- field rules, and UNDER_LEASE for this script) above this prelude, and below it the shared parts
-- the script names (dropping.lua), the guard (guard.lua: every script but drop_many, which loads
-- many records) and the script's own body.
--
-- Nothing is written before load_record has accepted the record, so a foreign or damaged value at
-- a dibs key is reported (as {'corrupt', why}) and never changed.
--
-- Integers are compared and stored as decimal strings, never as Lua numbers: those are doubles,
-- and a fence above 2^53 would stop increasing and be written back as '1e+17'. LIMITS gives each
-- integer field its largest value: MAX_FENCE is what HINCRBY holds (a signed 64-bit integer),
-- MAX_COUNT a signed 32-bit one; MAX_TIME is the end of the year 9999. GROUPS, LIMITS, SECONDS and
-- NONEMPTY are literal tables generated from Python: Redis runs this top level on every call.

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
  local values = nil
  if UNDER_LEASE then
    -- A script acting under a lease expects the record: HMGET at once spares a TYPE (issue 20). A
    -- value of another type answers an error (then TYPE names it below); no record, all nils.
    local got = redis.pcall('HMGET', key, unpack(FIELDS))
    if got.err == nil then
      values = got
    end
  end
  if values == nil then
    local kind = redis.call('TYPE', key)['ok']
    if kind == 'none' then
      return nil
    end
    if kind ~= 'hash' then
      return false, 'it is a Redis ' .. kind .. ', not a hash'
    end
    values = redis.call('HMGET', key, unpack(FIELDS))
  end
  local rec, found = {}, false
  for i, field in ipairs(FIELDS) do
    local value = values[i]
    if value then
      if not well_formed(field, value) then
        return false, 'its ' .. field .. ' is ' .. string.format('%q', string.sub(value, 1, 40))
          .. ', not a value dibs writes there'
      end
      rec[field] = value
      found = true
    end
  end
  -- No dibs field: no record at all, or (the key exists) a hash dibs did not write.
  if not found and redis.call('EXISTS', key) == 0 then
    return nil
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

-- Whether decimal a < decimal b, exactly (fences go beyond what a Lua number holds exactly).
local function fence_below(a, b)
  return #a < #b or (#a == #b and a < b)
end

-- Whether (fence, lease id) is the current token: a lease, not yet completed, with both parts
-- equal.
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

-- The namespace's indexes (dibs.stores.redis.index), kept by the scripts that write, in the same
-- atomic step as the record: declared as KEYS[2..7] (one slot on a cluster: the prefix's hash tag),
-- or absent (one key: a cluster without a hash tag keeps no index). KEYS[2] holds every listed
-- record (not a tombstone) as its class letter and its name, score 0, so that one class is a
-- range in key order; KEYS[3] and KEYS[4] the lease expiries of classes 'h' and 'r'; KEYS[5] the
-- artifacts' creation times; KEYS[6] the failures' times; KEYS[7] the set of namespaces.
local INDEXED = #KEYS > 1
-- The record the writes below go to: KEYS[1], or, in drop_many, each of its records in turn.
local record_key = KEYS[1]
-- Whether this run wrote the record, and where the record was placed before its first write (set
-- by writing() then, so a run that writes nothing, a hit, spends nothing on the indexes; a new
-- record starts as a tombstone, placed nowhere).
local dirty, before = false, nil
-- The expiry index of each leased class.
local LEASED = {h = 3, r = 4}

-- Where a record belongs in the indexes: {class, lease expiry, artifact time, failure time}, or
-- nil for a tombstone (or no record), which is listed nowhere. Classes hold whatever does not
-- change with time, so a write moves a record and the clock never does: 'h' a lease without an
-- artifact (held or expired), 'r' a lease beside an artifact (held, or done once it expires),
-- 'd' an artifact alone (done), 'f' a failure alone (failed), 'n' nothing but attempts (free).
local function placement(r)
  if not r then
    return nil
  end
  local class
  if r.lease_id then
    class = r.artifact_fence and 'r' or 'h'
  elseif r.artifact_fence then
    class = 'd'
  elseif r.failure_at then
    class = 'f'
  elseif r.attempts ~= '0' then
    class = 'n'
  else
    return nil
  end
  return {class, r.lease_expires_at or false, r.artifact_created_at or false, r.failure_at or false}
end

-- Move the record named `name` of `namespace` from placement `old` to `new` in the indexes: only
-- what differs is written (a heartbeat: one ZADD; a complete: the class, the expiry, the artifact).
local function place(old, new, name, namespace)
  local oc, nc = old and old[1], new and new[1]
  if oc ~= nc then
    if oc then
      redis.call('ZREM', KEYS[2], oc .. name)
    end
    if nc then
      redis.call('ZADD', KEYS[2], 0, nc .. name)
      if not oc then
        redis.call('SADD', KEYS[7], namespace)
      end
    end
  end
  local ol, nl = oc and LEASED[oc], nc and LEASED[nc]
  if ol and ol ~= nl then
    redis.call('ZREM', KEYS[ol], name)
  end
  if nl and (ol ~= nl or old[2] ~= new[2]) then
    redis.call('ZADD', KEYS[nl], new[2], name)
  end
  for i = 3, 4 do
    -- false for no time, whether or not there is a placement (nil ~= false: a needless ZREM)
    local o, n = old and old[i] or false, new and new[i] or false
    if o ~= n then
      if n then
        redis.call('ZADD', KEYS[i + 2], n, name)
      else
        redis.call('ZREM', KEYS[i + 2], name)
      end
    end
  end
end

-- Bring the indexes in step with `rec` after this run's writes (nothing when it wrote nothing, or
-- keeps no index). Every reply goes through here: reply, short_reply and written().
local function sync_index(rec)
  if dirty and INDEXED then
    dirty = false
    place(before, placement(rec), rec.name, rec.namespace)
  end
end

-- Whether this user may keep the indexes, asked once a run before its first write. Redis checks a
-- script's commands one at a time and keeps what ran before a refused one: a user whose ACL predates
-- the indexes (no ZADD, ZREM, SADD: docs/deploy-redis.md before they came) had its record written,
-- a lease granted, and then the call refused, so nobody held what the store said was held. Asked
-- first, a refusal is a NOPERM error (dibs: a ConfigurationError naming the ACL) and nothing is
-- written. Redis 7 answers without running anything (redis.acl_check_cmd); Redis 6 adds the
-- namespace to the registry, which a write of one of its records keeps anyway.
local rights_checked = false
local function check_index_rights()
  rights_checked = true
  local refused = nil
  if redis.acl_check_cmd then
    for _, probe in ipairs({{'ZADD', KEYS[2], '0', '-'}, {'ZREM', KEYS[2], '-'}, {'SADD', KEYS[7], '-'}}) do
      if not redis.acl_check_cmd(unpack(probe)) then
        refused = probe[1]
        break
      end
    end
  elseif redis.pcall('SADD', KEYS[7], ARGV[1])['err'] then
    refused = 'SADD'
  end
  if refused then
    error({err = 'NOPERM this user may not run ' .. refused .. ' on the indexes (' .. KEYS[2] .. ', '
      .. KEYS[7] .. ') that dibs keeps beside the records since the admin reads use them: grant '
      .. '+zadd +zrem +sadd (docs/deploy-redis.md gives the whole ACL); nothing was written'})
  end
end

-- Before a script's first write to its record: the index rights are checked (once), and where the
-- record stood in the indexes is kept (`before`), for the indexes to be moved once at the end.
local function writing(rec)
  if not dirty then
    if INDEXED and not rights_checked then
      check_index_rights()
    end
    dirty, before = true, INDEXED and placement(rec)
  end
end

-- Every write of a script to its record (record_key) goes through set and unset, which keep `rec`
-- (the record as loaded) equal to what the hash holds, so a reply is built from `rec` without
-- reading the record a second time. set takes field, value pairs, all strings. A fence of 10^15
-- or more is incremented with HINCRBY (exact on a decimal string, where Lua's doubles would not
-- be) and read back before set writes it with the lease.
local function set(rec, ...)
  writing(rec)
  redis.call('HSET', record_key, ...)
  local pairs_ = {...}
  for i = 1, #pairs_, 2 do
    rec[pairs_[i]] = pairs_[i + 1]
  end
end

local function unset(rec, ...)
  writing(rec)
  redis.call('HDEL', record_key, ...)
  for _, field in ipairs({...}) do
    rec[field] = nil
  end
end

local function drop_lease(rec)
  unset(rec, 'lease_max_expires_at', unpack(GROUPS.lease))
end

-- The artifact's payload, or false when it is longer than `limit` bytes (a number; true: any
-- length): a large one is read apart, by the read script without a limit (dibs.stores.large).
local function payload_upto(limit)
  if limit ~= true and redis.call('HSTRLEN', record_key, 'artifact_payload') > limit then
    return false
  end
  return redis.call('HGET', record_key, 'artifact_payload')
end

-- {status, now, extra, FIELDS...[, payload]}: the record after this script's writes (`rec`, kept in
-- step by set and unset; nil when there is none), absent fields as Redis nils. `with_payload`: false,
-- or the payload_upto limit.
local function reply(status, now, rec, extra, with_payload)
  if rec then
    sync_index(rec)
  end
  local out = {status, num(now), extra or false}
  for i, field in ipairs(FIELDS) do
    out[i + 3] = (rec and rec[field]) or false
  end
  if with_payload then
    out[#FIELDS + 4] = payload_upto(with_payload)
  end
  return out
end

-- {status, now, extra, values of `names`}: the reply where the caller knows the rest of the record
-- (a lease it was just granted, an artifact it just stored), so that less is sent and parsed.
local function short_reply(status, now, rec, extra, names)
  sync_index(rec)
  local out = {status, num(now), extra or false}
  for i, field in ipairs(names) do
    out[i + 3] = rec[field] or false
  end
  return out
end

-- A removal's reply, {'changed'}, after the indexes follow.
local function written(rec)
  sync_index(rec)
  return {'changed'}
end

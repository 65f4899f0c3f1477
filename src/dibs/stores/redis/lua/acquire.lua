-- KEYS[1]: the key's record hash
-- ARGV[1]: namespace, ARGV[2]: name, ARGV[3]: owner, ARGV[4]: ttl in seconds,
-- ARGV[5]: maximum lease age in seconds, or '' for none, ARGV[6]: lease id for a new lease,
-- ARGV[7]: the oldest artifact the caller takes, as a maximum age in seconds, or '' for any,
-- ARGV[8]: the lowest fencing token of an artifact the caller takes (decimal), or '',
-- ARGV[9]: the longest payload a 'present' reply includes (bytes; a longer one is false)
-- Returns {'corrupt', why}, {'exhausted', fence},
-- {'granted', now, took_over_from, GRANTED_FIELDS...[, GROUPS.failure...]}, {'present', now, false, PRESENT_FIELDS...,
-- payload} or {'reentered'|'held', now, false, FIELDS...}. A stale artifact is no hit: the
-- lease can be taken beside it, and complete replaces it.
-- After the prelude's guard: `now` is the server's time, `rec` the key's record or nil.
-- A key without a record starts as an empty one, written below in the same HSET as its first
-- lease.
local created = rec == nil
if created then
  rec = {format = FORMAT, namespace = ARGV[1], name = ARGV[2], fence = '0', attempts = '0'}
end
if rec.artifact_fence then
  local stored_at = tonumber(rec.artifact_created_at)
  local stale = (ARGV[7] ~= '' and (tonumber(ARGV[7]) <= 0 or now - stored_at >= tonumber(ARGV[7])))
    or (ARGV[8] ~= '' and fence_below(rec.artifact_fence, ARGV[8]))
  if not stale then
    -- The short reply: the caller needs the artifact alone (the record was checked whole above).
    local out = short_reply('present', now, rec, false, PRESENT_FIELDS)
    out[#PRESENT_FIELDS + 4] = payload_upto(tonumber(ARGV[9]) or true)
    return out
  end
end
local ttl = tonumber(ARGV[4])
local max_expires = tonumber(rec.lease_max_expires_at)
if rec.lease_id and rec.lease_owner == ARGV[3] and (max_expires == nil or now < max_expires) then
  -- The same owner again: its own lease, same token, expiry extended.
  set(rec, 'lease_expires_at', num(capped_expiry(now, ttl, max_expires)), 'lease_ttl', ARGV[4])
  return reply('reentered', now, rec, false, false)
end
if rec.lease_id and now < tonumber(rec.lease_expires_at) then
  return reply('held', now, rec, false, false)
end
-- Free, released or expired: the key changes hands and the fence goes up, exactly, unless it
-- cannot go any higher. Below 10^15 a Lua number holds it exactly; from there HINCRBY adds on the
-- decimal string (read back as a string).
if rec.fence == MAX_FENCE then
  return {'exhausted', rec.fence}
end
local fence
if #rec.fence <= 15 then
  fence = num(tonumber(rec.fence) + 1)
else
  writing(rec)  -- the index rights checked, and the placement kept, before this first write
  redis.call('HINCRBY', KEYS[1], 'fence', 1)
  fence = redis.call('HGET', KEYS[1], 'fence')
end
local attempt = rec.attempts
if attempt ~= MAX_COUNT then
  attempt = num(tonumber(attempt) + 1)
end
local new_max = nil
if ARGV[5] ~= '' then
  new_max = now + tonumber(ARGV[5])
end
local took_over_from = rec.lease_owner or false
-- One HSET writes the whole new lease (and, for a new record, its identity).
local fields = {'fence', fence, 'attempts', attempt,
  'lease_owner', ARGV[3], 'lease_fence', fence, 'lease_id', ARGV[6],
  'lease_acquired_at', num(now), 'lease_expires_at', num(capped_expiry(now, ttl, new_max)),
  'lease_ttl', ARGV[4], 'lease_attempt', attempt}
if created then
  local n = #fields
  fields[n + 1], fields[n + 2], fields[n + 3] = 'format', FORMAT, 'namespace'
  fields[n + 4], fields[n + 5], fields[n + 6] = ARGV[1], 'name', ARGV[2]
end
if new_max then
  local n = #fields
  fields[n + 1], fields[n + 2] = 'lease_max_expires_at', num(new_max)
end
set(rec, unpack(fields))
if not new_max and rec.lease_max_expires_at then
  unset(rec, 'lease_max_expires_at')
end
local out = short_reply('granted', now, rec, took_over_from, GRANTED_FIELDS)
if rec.failure_count then
  -- The failure the grant reports, only when the record holds one (the group is whole: checked).
  for i, field in ipairs(GROUPS.failure) do
    out[#GRANTED_FIELDS + 3 + i] = rec[field]
  end
end
return out

-- KEYS[1]: the key's record hash
-- ARGV[1]: namespace, ARGV[2]: name, ARGV[3]: fence, ARGV[4]: lease id, ARGV[5]: serializer,
-- ARGV[6]: payload, ARGV[7]: checksum, ARGV[8]: the key's notification channel,
-- ARGV[9]: the work's compute time in seconds ('' when unknown)
-- Returns {'corrupt', why}, {'ok', now, false, COMPLETED_FIELDS...} (the artifact's created_at is now) or
-- {'lost', now, false, FIELDS...}
-- After the prelude's guard: `now`, and `rec`, whose current lease is the caller's.
-- One HSET for the artifact, one HDEL for the lease (and a compute time not given this time).
local fields = {'artifact_serializer', ARGV[5], 'artifact_payload', ARGV[6],
  'artifact_size', num(string.len(ARGV[6])), 'artifact_checksum', ARGV[7],
  'artifact_producer', rec.lease_owner, 'artifact_fence', rec.lease_fence,
  'artifact_created_at', num(now)}
local compute = tonumber(ARGV[9])
local drop = {'lease_max_expires_at', unpack(GROUPS.lease)}
if compute ~= nil and compute >= 0 and compute <= MAX_TIME then
  fields[#fields + 1], fields[#fields + 2] = 'artifact_compute_seconds', num(compute)
elseif rec.artifact_compute_seconds then
  drop[#drop + 1] = 'artifact_compute_seconds'
end
set(rec, unpack(fields))
unset(rec, unpack(drop))
redis.call('PUBLISH', ARGV[8], 'complete')
return short_reply('ok', now, rec, false, COMPLETED_FIELDS)

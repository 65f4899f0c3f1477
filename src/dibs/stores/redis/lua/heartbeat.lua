-- KEYS[1]: the key's record hash
-- ARGV[1]: namespace, ARGV[2]: name, ARGV[3]: fence, ARGV[4]: lease id, ARGV[5]: ttl in seconds
-- Returns {'corrupt', why} or {'ok'|'lost', now, false, FIELDS...}
-- After the prelude's guard: `now`, and `rec`, whose current lease is the caller's.
local max_expires = tonumber(rec.lease_max_expires_at)
if max_expires ~= nil and now >= max_expires then
  return reply('lost', now, rec, false, false)
end
set(rec, 'lease_expires_at', num(capped_expiry(now, tonumber(ARGV[5]), max_expires)),
  'lease_ttl', ARGV[5])
return reply('ok', now, rec, false, false)

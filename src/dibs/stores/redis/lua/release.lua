-- KEYS[1]: the key's record hash
-- ARGV[1]: namespace, ARGV[2]: name, ARGV[3]: fence, ARGV[4]: lease id,
-- ARGV[5]: '1' to record a failure, '2' to record a stop (not counted), else '0',
-- ARGV[6]: the error text (already truncated),
-- ARGV[7]: the key's notification channel
-- Returns {'corrupt', why} or {'ok'|'lost', now, false, FIELDS...}
-- After the prelude's guard: `now`, and `rec`, whose current lease is the caller's.
if ARGV[5] ~= '0' then
  local count = rec.failure_count or '0'
  if ARGV[5] == '1' and count ~= MAX_COUNT then
    count = num(tonumber(count) + 1)
  end
  set(rec, 'failure_count', count, 'failure_error', ARGV[6], 'failure_owner', rec.lease_owner,
    'failure_at', num(now))
end
drop_lease(rec)
redis.call('PUBLISH', ARGV[7], 'release')
return reply('ok', now, rec, false, false)

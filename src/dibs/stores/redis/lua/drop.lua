-- KEYS[1]: the key's record hash
-- ARGV[1]: namespace, ARGV[2]: name, ARGV[3]: the key's notification channel,
-- ARGV[4]: what to drop: 'lease' (force release), 'expired' (an expired lease), 'reap' (an expired
-- lease, then the record if it holds nothing), 'result' (forget), 'empty'
-- (discard: everything but the fence, if it holds nothing) or 'old' (prune: everything but the
-- fence, if it is older than ARGV[5] seconds). The hash itself is never deleted: what is left
-- (a tombstone: format, key, fence, attempts 0) keeps the fence rising (dibs.stores.transitions).
-- Returns {'corrupt', why}, {'changed'} or {'unchanged'}
-- After the prelude's guard: `now` is the server's time, `rec` the key's record or nil.
if rec == nil then
  return {'unchanged'}
end
if ARGV[4] == 'result' then
  if not (rec.artifact_fence or rec.failure_count) then
    return {'unchanged'}
  end
  unset(rec, 'artifact_payload', 'artifact_compute_seconds', unpack(GROUPS.artifact))
  unset(rec, unpack(GROUPS.failure))
elseif ARGV[4] == 'empty' then
  -- discard: only a record that holds nothing becomes a tombstone (not counted if it is one)
  if rec.lease_id or rec.artifact_fence or rec.failure_count or rec.attempts == '0' then
    return {'unchanged'}
  end
  set(rec, 'attempts', '0')
  return written(rec)
elseif ARGV[4] == 'old' then
  -- prune (ARGV[5]: seconds): see dibs.stores.transitions.prunable; a tombstone is not counted
  -- again
  if not (rec.lease_id or rec.artifact_fence or rec.failure_count or rec.attempts ~= '0') then
    return {'unchanged'}
  end
  local limit = now - tonumber(ARGV[5])
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
  -- One HDEL of what the record holds (a batch of prunes is this script a thousand times over).
  local gone = {}
  for _, field in ipairs(CLEARED) do
    if rec[field] then
      gone[#gone + 1] = field
    end
  end
  if rec.artifact_fence then
    gone[#gone + 1] = 'artifact_payload'
  end
  if #gone > 0 then
    unset(rec, unpack(gone))
  end
  set(rec, 'attempts', '0')
elseif ARGV[4] == 'reap' then
  -- reap: an expired lease nobody took over is cleared, then a record that holds nothing (but
  -- counts attempts) becomes a tombstone, in one step (dibs.stores.base.reap_each in two).
  local expired = rec.lease_id and now >= tonumber(rec.lease_expires_at)
  if expired then
    drop_lease(rec)
  end
  if not (rec.lease_id or rec.artifact_fence or rec.failure_count) and rec.attempts ~= '0' then
    set(rec, 'attempts', '0')
  elseif not expired then
    return {'unchanged'}
  end
  if expired then
    redis.call('PUBLISH', ARGV[3], 'expired')
  end
  return written(rec)
else
  if not rec.lease_id then
    return {'unchanged'}
  end
  if ARGV[4] == 'expired' and now < tonumber(rec.lease_expires_at) then
    return {'unchanged'}
  end
  drop_lease(rec)
end
redis.call('PUBLISH', ARGV[3], ARGV[4])
return written(rec)

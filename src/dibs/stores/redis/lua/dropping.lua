-- The removal rules, written once for the drop script (one record) and drop_many (many records of
-- one namespace in one call: prune and reap where the indexes are kept).
--
-- drop_record(rec, now, channel, mode, seconds): `rec` is a record load_record accepted (not nil)
-- at record_key; `mode` says what to drop: 'lease' (force release), 'expired' (an expired lease),
-- 'reap' (an expired lease, then the record if it holds nothing), 'result' (forget), 'empty'
-- (discard: everything but the fence, if it holds nothing) or 'old' (prune: everything but the
-- fence, if it is older than `seconds`). The hash itself is never deleted: what is left (a
-- tombstone: format, key, fence, attempts 0) keeps the fence rising (dibs.stores.transitions).
-- A change is published on `channel` (what the waiters of the key wake on: the mode, 'expired' for
-- reap, nothing for discard) and the indexes follow it (sync_index). Returns whether it changed.
local function drop_record(rec, now, channel, mode, seconds)
  if mode == 'result' then
    if not (rec.artifact_fence or rec.failure_count) then
      return false
    end
    unset(rec, 'artifact_payload', 'artifact_compute_seconds', unpack(GROUPS.artifact))
    unset(rec, unpack(GROUPS.failure))
  elseif mode == 'empty' then
    -- discard: only a record that holds nothing becomes a tombstone (not counted if it is one)
    if rec.lease_id or rec.artifact_fence or rec.failure_count or rec.attempts == '0' then
      return false
    end
    set(rec, 'attempts', '0')
    sync_index(rec)
    return true
  elseif mode == 'old' then
    -- prune: see dibs.stores.transitions.prunable; a tombstone is not counted again
    if not (rec.lease_id or rec.artifact_fence or rec.failure_count or rec.attempts ~= '0') then
      return false
    end
    local limit = now - tonumber(seconds)
    if rec.lease_id and tonumber(rec.lease_expires_at) >= limit then
      return false
    end
    if rec.artifact_fence then
      if tonumber(rec.artifact_created_at) >= limit then
        return false
      end
    elseif rec.failure_count and tonumber(rec.failure_at) >= limit then
      return false
    end
    -- One HDEL of what the record holds.
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
  elseif mode == 'reap' then
    -- reap: an expired lease nobody took over is cleared, then a record that holds nothing (but
    -- counts attempts) becomes a tombstone, in one step (dibs.stores.base.reap_each in two).
    local expired = rec.lease_id and now >= tonumber(rec.lease_expires_at)
    if expired then
      drop_lease(rec)
    end
    if not (rec.lease_id or rec.artifact_fence or rec.failure_count) and rec.attempts ~= '0' then
      set(rec, 'attempts', '0')
    elseif not expired then
      return false
    end
    if expired then
      redis.call('PUBLISH', channel, 'expired')
    end
    sync_index(rec)
    return true
  else
    if not rec.lease_id then
      return false
    end
    if mode == 'expired' and now < tonumber(rec.lease_expires_at) then
      return false
    end
    drop_lease(rec)
  end
  redis.call('PUBLISH', channel, mode)
  sync_index(rec)
  return true
end

-- KEYS[2..7]: a namespace's indexes (see the prelude); KEYS[1], then KEYS[8..]: the record hashes
-- of its keys to judge, in the order of their names
-- ARGV[1]: namespace, ARGV[2]: 'old' (prune) or 'reap', ARGV[3]: for 'old', the seconds,
-- ARGV[4]: the record keys' common start (the prefix's 'rec:'), ARGV[5]: the channels' ('chan:'),
-- ARGV[6..]: the names, one a record
-- Returns one item a record, in order: 1 (changed), 0 (unchanged, or no record) or the text of why
-- it is not a dibs record (a foreign or damaged value: skipped, never changed)
-- One call for many records (prune and reap, a batch at a time, where the indexes are kept: every
-- key of the namespace is then in one slot). Each record is loaded and judged exactly as the drop
-- script does it (load_record, then drop_record), on the server's clock read once: the call is one
-- atomic step, so every record is judged at the same instant. A key's channel is its record key
-- with ARGV[5] in place of ARGV[4] (both end in the key's digest), which spares sending it.
local namespace, mode, seconds = ARGV[1], ARGV[2], ARGV[3]
local skip, channels = #ARGV[4] + 1, ARGV[5]
local now = store_now()
local out = {}
for i = 6, #ARGV do
  local n = i - 5
  record_key = n == 1 and KEYS[1] or KEYS[n + 6]
  dirty, before = false, nil -- this record's writes not begun (drop_record syncs each it makes)
  local rec, why = load_record(record_key, namespace, ARGV[i])
  if rec == false then
    out[n] = why
  elseif rec ~= nil and drop_record(rec, now, channels .. string.sub(record_key, skip), mode, seconds) then
    out[n] = 1
  else
    out[n] = 0
  end
end
return out

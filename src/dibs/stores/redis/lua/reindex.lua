-- KEYS[1]: the key's record hash, KEYS[2..7]: its namespace's indexes (see the prelude)
-- ARGV[1]: namespace, ARGV[2]: name
-- Returns {'corrupt', why} or {'ok'}
-- Places the record in its namespace's indexes from what it holds now, whatever they said of it
-- before: the backfill of records written before the indexes (or by an older dibs), and the repair
-- of a stale entry. Atomic, as every script: a writer's change comes before or after it, whole.
local name = ARGV[2]
redis.call('ZREM', KEYS[2], 'h' .. name, 'r' .. name, 'd' .. name, 'f' .. name, 'n' .. name)
for i = 3, 6 do
  redis.call('ZREM', KEYS[i], name)
end
place(nil, placement(rec), name, ARGV[1])
return {'ok'}

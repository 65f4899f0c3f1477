-- KEYS[1]: the key's record hash, KEYS[2..7]: its namespace's indexes, or none (see the prelude)
-- ARGV[1]: namespace, ARGV[2]: name, ARGV[3]: the key's notification channel,
-- ARGV[4]: what to drop (a mode of dropping.lua's drop_record), ARGV[5]: for 'old', the seconds
-- Returns {'corrupt', why}, {'changed'} or {'unchanged'}
-- After the prelude's guard: `now` is the server's time, `rec` the key's record or nil.
if rec ~= nil and drop_record(rec, now, ARGV[3], ARGV[4], ARGV[5]) then
  return {'changed'}
end
return {'unchanged'}

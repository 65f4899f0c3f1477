-- KEYS[1]: the key's record hash
-- ARGV[1]: namespace, or '' when listing (the caller checks the identity against the digest),
-- ARGV[2]: name, ARGV[3]: '1' to include the artifact payload, else '0',
-- ARGV[4]: the longest payload included (bytes; a longer one is false), or absent for any length
-- Returns {'corrupt', why} or {'ok', now, false, FIELDS...[, payload]}
-- After the prelude's guard: `now` is the server's time, `rec` the key's record or nil.
return reply('ok', now, rec, false, ARGV[3] == '1' and (tonumber(ARGV[4]) or true))

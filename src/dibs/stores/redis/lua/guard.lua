-- The guard every script starts with, written once here: the server's time, then the record at
-- KEYS[1], checked to be the one of the key ARGV[1] (namespace) / ARGV[2] (name). A foreign or
-- damaged value ends the script before anything is written; so does, in a script that acts under a
-- lease (UNDER_LEASE: ARGV[3] is its fence, ARGV[4] its id), a token that is not the current one.
local now = store_now()
local rec, why = load_record(KEYS[1], ARGV[1], ARGV[2])
if rec == false then
  return {'corrupt', why}
end
if UNDER_LEASE and not is_current(rec, ARGV[3], ARGV[4]) then
  return reply('lost', now, rec, false, false)
end

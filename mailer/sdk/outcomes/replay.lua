-- Queue past events at one endpoint again, with their original ids, behind the
-- earlier events of their jobs still queued there.
-- KEYS[1] ready (zset), KEYS[2] wake (list), KEYS[3] the endpoint (hash)
-- ARGV[1] endpoint key prefix, ARGV[2] endpoint, then per event: its id, its time
-- (ms), job id, body
-- Returns how many were queued (an event queued there already is not), or -1 if
-- there is no such endpoint.
if redis.call('EXISTS', KEYS[3]) == 0 then
  return -1
end
local prefix, endpoint = ARGV[1], ARGV[2]
local now = wh_now()
local queued = 0
for a = 3, #ARGV, 4 do
  queued = queued + wh_enqueue(prefix, KEYS[1], endpoint, ARGV[a], ARGV[a + 2], ARGV[a + 3], tonumber(ARGV[a + 1]), now)
end
wh_ready(prefix, KEYS[1], KEYS[2], endpoint, now)
return queued

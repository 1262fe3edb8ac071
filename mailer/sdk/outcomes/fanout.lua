-- Fan a batch of the feed's events out to their tenants' enabled endpoints, and
-- move the cursor past them: one replica's batch at a time, in the feed's order
-- (the cursor is compared first: a replica that read the same batch finds it
-- moved and queues nothing twice).
-- KEYS[1] cursor (string), KEYS[2] every endpoint (set), KEYS[3] ready (zset),
-- KEYS[4] wake (list)
-- ARGV[1] the cursor read ('' for none), ARGV[2] the batch's last id, ARGV[3]
-- endpoint key prefix, ARGV[4] tenant set key prefix, ARGV[5] '1' when the
-- batch is sent without its events (there was no endpoint to fan out to), then
-- per event: its id, its time (ms), tenant, type, job id, body
-- Returns the deliveries queued; -1 if the cursor had moved; -2 if a batch sent
-- without its events finds endpoints now (send it again with them).
if (redis.call('GET', KEYS[1]) or '') ~= ARGV[1] then
  return -1
end
if redis.call('SCARD', KEYS[2]) == 0 then
  redis.call('SET', KEYS[1], ARGV[2])
  return 0
end
if ARGV[5] == '1' then
  return -2
end
redis.call('SET', KEYS[1], ARGV[2])
local prefix, tenants = ARGV[3], ARGV[4]
local now = wh_now()
local queued = 0
local endpoints_of = {}
for a = 6, #ARGV, 6 do
  local event_id, event_ms, tenant, kind, job_id, body =
    ARGV[a], tonumber(ARGV[a + 1]), ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5]
  local endpoints = endpoints_of[tenant]
  if not endpoints then
    endpoints = redis.call('SMEMBERS', tenants .. tenant)
    endpoints_of[tenant] = endpoints
  end
  for _, endpoint in ipairs(endpoints) do
    local e = redis.call('HMGET', prefix .. endpoint, 'enabled', 'events', 'created_ms')
    local wanted = e[2] == '' or e[2] == false or string.find(',' .. e[2] .. ',', ',' .. kind .. ',', 1, true)
    if e[1] == '1' and wanted and tonumber(e[3] or 0) <= event_ms then
      queued = queued + wh_enqueue(prefix, KEYS[3], endpoint, event_id, job_id, body, event_ms, now)
    end
  end
end
if queued > 0 then
  redis.call('LPUSH', KEYS[4], '1')
  redis.call('LTRIM', KEYS[4], 0, 0)
end
return queued

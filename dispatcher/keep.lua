-- Keep the in-flight slots of tenants whose jobs wait downstream while no worker
-- takes them (a worker held back by a limit of its own).
-- A slot must last as long as its message may legitimately wait in SQS; a
-- live replica renews it so, a pass at a time, and a slot no live replica
-- renews still expires by itself. Only the tenants whose earliest slot is due
-- within the horizon are visited (the expiring zset, ring.lua), a page at a
-- time: the work is proportional to the slots that need it.
-- KEYS[1] expiring (zset: tenant -> at or before its earliest slot expiry, ms)
-- KEYS[2] dispatched jobs (zset: job id -> stranded at ms, dispatcher/reconcile.lua)
-- ARGV[1] in-flight key prefix, ARGV[2] keep for (ms from now),
-- ARGV[3] due within (ms from now), ARGV[4] stranded this long after the kept
-- expiry (ms), ARGV[5] offset, ARGV[6] page size
-- Returns {tenants visited, of them still due (an expired slot heads their
-- set: the reaper's to take back), slots kept}
local expiring, dispatched = KEYS[1], KEYS[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local keep_until = now + tonumber(ARGV[2])
local due = now + tonumber(ARGV[3])
local stranded_at = keep_until + tonumber(ARGV[4])
local tenants = redis.call('ZRANGE', expiring, '-inf', due, 'BYSCORE', 'LIMIT', tonumber(ARGV[5]), tonumber(ARGV[6]))
local stayed, kept = 0, 0
for _, tenant in ipairs(tenants) do
  local key = ARGV[1] .. tenant
  -- Live slots only: an expired one belongs to a dead holder, for the reaper.
  for _, job_id in ipairs(redis.call('ZRANGE', key, now, '+inf', 'BYSCORE')) do
    redis.call('ZADD', key, 'XX', 'GT', keep_until, job_id)
    redis.call('ZADD', dispatched, 'XX', 'GT', stranded_at, job_id)
    kept = kept + 1
  end
  -- Its place in the expiring zset: its earliest slot (ring.lua schedule_expiry).
  local head = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if head[2] then
    redis.call('ZADD', expiring, head[2], tenant)
    if tonumber(head[2]) <= due then stayed = stayed + 1 end
  else
    redis.call('ZREM', expiring, tenant)
  end
end
return { #tenants, stayed, kept }

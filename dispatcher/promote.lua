-- Move scheduled jobs that are due into their tenants' queues. Atomic, so any
-- number of dispatchers may call it at once: each job enters its queue once.
-- KEYS[1..9] ring context (ring.lua), KEYS[10] scheduled jobs (zset)
-- ARGV[1..3] ring context, ARGV[4] job key prefix, ARGV[5] most jobs per call
-- Returns {jobs moved, ms until the next scheduled job is due (-1: none)}.
local ctx = ring_context(KEYS, ARGV)
local scheduled, job_prefix = KEYS[10], ARGV[4]
local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', scheduled, '-inf', now, 'LIMIT', 0, tonumber(ARGV[5]))
local moved = 0
local tenants, seen = {}, {}
for _, job_id in ipairs(due) do
  redis.call('ZREM', scheduled, job_id)
  local job_key = job_prefix .. job_id
  local rec = redis.call('HMGET', job_key, 'tenant', 'state', 'priority')
  -- A record gone (expired, purged) or no longer scheduled (cancelled) is dropped.
  if rec[2] == 'scheduled' then
    redis.call('HSET', job_key, 'state', 'queued', 'queued_ms', now)
    push_waiting(ctx, rec[1], rec[3], job_id, false)
    moved = moved + 1
    if not seen[rec[1]] then
      seen[rec[1]] = true
      table.insert(tenants, rec[1])
    end
  end
end
for _, tenant in ipairs(tenants) do
  activate(ctx, tenant, now)
end
local head = redis.call('ZRANGE', scheduled, 0, 0, 'WITHSCORES')
local wait = -1
if head[2] then
  wait = math.max(0, tonumber(head[2]) - now)
end
return {moved, wait}

-- Bring back what dead replicas held: expired claim leases go back to the
-- head of their queues, and blocked tenants whose in-flight slots expired
-- rejoin the ring.
-- KEYS[1..6] ring context (ring.lua), KEYS[7] leases (zset)
-- ARGV[1..3] ring context, ARGV[4] job key prefix, ARGV[5] max leases per call
-- Returns the number of leases reaped.
local ctx = ring_context(KEYS, ARGV)
local now = now_ms()
local expired = redis.call('ZRANGEBYSCORE', KEYS[7], '-inf', now, 'LIMIT', 0, tonumber(ARGV[5]))
-- Newest first: each goes to the head of its queue, so the oldest ends up first.
for i = #expired, 1, -1 do
  local job_id = expired[i]
  redis.call('ZREM', KEYS[7], job_id)
  return_to_queue(ctx, ARGV[4] .. job_id, job_id, now)
end
for _, tenant in ipairs(redis.call('SMEMBERS', ctx.blocked)) do
  activate(ctx, tenant, now)
end
return #expired

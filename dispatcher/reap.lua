-- Bring back what dead replicas held: expired claim leases go back to the
-- head of their queues, and the tenants whose earliest in-flight slot is due
-- drop their expired slots and, if blocked, rejoin the ring. The work is
-- proportional to what expired, never to how many tenants are blocked: a
-- slot freed by a finish re-activates its tenant there and then: every
-- script that blocks a tenant gives it its place in the expiring zset.
-- KEYS[1..9] ring context (ring.lua), KEYS[10] leases (zset)
-- ARGV[1..3] ring context, ARGV[4] job key prefix, ARGV[5] most leases and
-- most tenants per call (more are left to the next call)
-- Returns the number of leases reaped.
local ctx = ring_context(KEYS, ARGV)
local now = now_ms()
local most = tonumber(ARGV[5])
local expired = redis.call('ZRANGEBYSCORE', KEYS[10], '-inf', now, 'LIMIT', 0, most)
-- Newest first: each goes to the head of its queue, so the oldest ends up first.
for i = #expired, 1, -1 do
  local job_id = expired[i]
  redis.call('ZREM', KEYS[10], job_id)
  return_to_queue(ctx, ARGV[4] .. job_id, job_id, now)
end
if #expired > 0 then
  drop_lone_anchor(KEYS[10])
end
for _, tenant in ipairs(redis.call('ZRANGEBYSCORE', ctx.expiring, '-inf', now, 'LIMIT', 0, most)) do
  -- Due by its score, which may be early (its slots were pushed later since):
  -- then this only moves it to its true earliest expiry.
  local gone = redis.call('ZREMRANGEBYSCORE', ctx.inflight_prefix .. tenant, '-inf', now)
  count_inflight(ctx, -gone)
  schedule_expiry(ctx, tenant)
  activate(ctx, tenant, now)
end
return #expired

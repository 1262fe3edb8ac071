-- Bring back what dead replicas held: expired claim leases go back to the
-- head of their queues, and the tenants whose earliest in-flight slot is due
-- drop their expired slots and, if blocked, rejoin the ring. The work is
-- proportional to what expired, never to how many tenants are blocked: a
-- slot freed by a finish re-activates its tenant there and then. A pass
-- over the blocked tenants, a page a call, checks each has a place in the
-- expiring zset, once after every daemon start.
-- KEYS[1..9] ring context (ring.lua), KEYS[10] leases (zset),
-- KEYS[11] where the pass over the blocked set stands (string)
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
for _, tenant in ipairs(redis.call('ZRANGEBYSCORE', ctx.expiring, '-inf', now, 'LIMIT', 0, most)) do
  -- Due by its score, which may be early (its slots were pushed later since):
  -- then this only moves it to its true earliest expiry.
  local gone = redis.call('ZREMRANGEBYSCORE', ctx.inflight_prefix .. tenant, '-inf', now)
  count_inflight(ctx, -gone)
  schedule_expiry(ctx, tenant)
  activate(ctx, tenant, now)
end
-- A safety net: a blocked tenant the expiring zset does not know (blocked
-- by a daemon older than it, before an upgrade) would never be visited when
-- its slots expire; give it its place. One pass over the blocked set, a page
-- a call, once for a store (KEYS[11] absent: no daemon of this version has
-- reaped it yet), going on across restarts until it ends: then one GET a
-- call, whatever the number of blocked tenants. Not again at every daemon
-- start: the scripts since the expiring zset give every tenant they block its
-- place, and no older daemon runs beside or after them (that upgrade stops
-- every daemon first, docs/operations.md). (Sampling on every call cost more
-- the more tenants were blocked.) A small page keeps an idle daemon's Redis
-- CPU flat during the pass (100,000 blocked tenants take about 6,000 reaps,
-- under two hours with one replica): such a tenant also comes back at its
-- next enqueue or finish.
local pass = redis.call('GET', KEYS[11])
if pass ~= 'done' then
  local page = redis.call('SSCAN', ctx.blocked, pass or '0', 'COUNT', 16)
  redis.call('SET', KEYS[11], page[1] == '0' and 'done' or page[1])
  local sample = page[2]
  if #sample > 0 then
    local scores = redis.call('ZMSCORE', ctx.expiring, unpack(sample))
    for i, tenant in ipairs(sample) do
      if not scores[i] then
        schedule_expiry(ctx, tenant)
        activate(ctx, tenant, now)
      end
    end
  end
end
return #expired

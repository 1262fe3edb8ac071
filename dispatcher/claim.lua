-- Claim up to N jobs fairly: deficit round robin over the ring, each claim a lease.
-- KEYS[1..9] ring context (ring.lua), KEYS[10] deficits (hash), KEYS[11] weights (hash),
-- KEYS[12] leases (zset)
-- ARGV[1..3] ring context, ARGV[4] N, ARGV[5] default weight, ARGV[6] lease ms,
-- ARGV[7] job key prefix, ARGV[8] in-flight TTL ms (what a hand-off gives a slot),
-- ARGV[9] payload key prefix
-- Returns a flat list: id, tenant, kind, payload, attempts, created_ms, replays for each job.
local ctx = ring_context(KEYS, ARGV)
local deficits, weights, leases = KEYS[10], KEYS[11], KEYS[12]
local wanted, default_weight = tonumber(ARGV[4]), tonumber(ARGV[5])
local lease_ms, job_prefix, payload_prefix = tonumber(ARGV[6]), ARGV[7], ARGV[9]
-- When the reaper must look at the tenant: when the slot would expire after
-- a hand-off now (a hand-off later only makes it later). A lease that runs out
-- before any hand-off needs no visit: the reaper returns the job from the
-- leases, and that frees the slot.
local slot_ms = tonumber(ARGV[8])
local now = now_ms()
local out = {}
local claimed = 0
-- Jobs claimed per tenant in this call: their counters move once per tenant.
local took = {}
local function settle(tenant)
  if took[tenant] then
    count_waiting(ctx, tenant, -took[tenant])
    took[tenant] = nil
  end
end
-- Each step claims a job, drops the id of a job no longer waiting (cancelled)
-- or takes a tenant out of the ring, so this is bounded by N, the dropped ids
-- and the ring's length; the guard only caps one call's work.
local steps = 0
while claimed < wanted and steps < wanted * 4 + 64 do
  steps = steps + 1
  local tenant = redis.call('LINDEX', ctx.ring, 0)
  if not tenant then
    break
  end
  local leave = false
  if redis.call('SISMEMBER', ctx.paused, tenant) == 1 then
    leave = true
  elseif live_inflight(ctx, tenant, now) >= cap_of(ctx, tenant) then
    redis.call('SADD', ctx.blocked, tenant)
    leave = true
  else
    local job_id = nil
    for _, p in ipairs(PRIORITIES) do
      job_id = redis.call('LPOP', queue_key(ctx, tenant, p))
      if job_id then
        break
      end
    end
    if not job_id then
      redis.call('HDEL', deficits, tenant)
      -- Its queues are empty: whatever its count says is drift, put right.
      settle(tenant)
      local left = tonumber(redis.call('HGET', ctx.counts, tenant))
      if left then
        count_waiting(ctx, tenant, -left)
      end
      redis.call('ZREM', ctx.top, tenant)
      leave = true
    else
      local job_key = job_prefix .. job_id
      local rec = redis.call('HMGET', job_key, 'state', 'kind', 'payload', 'attempts', 'created_ms',
        'replays')
      -- A missing record or one not queued (cancelled while waiting: its id
      -- was left in the queue, and its count taken then) is dropped.
      if rec[1] == 'queued' then
        local deficit = tonumber(redis.call('HGET', deficits, tenant)) or 0
        if deficit <= 0 then
          -- The tenant's turn starts: its quantum is its weight.
          deficit = tonumber(redis.call('HGET', weights, tenant)) or default_weight
        end
        deficit = deficit - 1
        -- The fraction keeps claim order among equal deadlines, so expired
        -- claims go back to their queue in the order they left it.
        local deadline = now + lease_ms + claimed / 1000
        redis.call('HSET', job_key, 'state', 'claimed', 'claimed_ms', now)
        redis.call('ZADD', leases, deadline, job_id)
        take_slot(ctx, tenant, job_id, deadline, now + slot_ms)
        took[tenant] = (took[tenant] or 0) + 1
        table.insert(out, job_id)
        table.insert(out, tenant)
        table.insert(out, rec[2] or '')
        -- In the record if it was written so before the payload had a key of its own.
        table.insert(out, rec[3] or redis.call('GET', payload_prefix .. job_id) or '')
        table.insert(out, rec[4] or '0')
        table.insert(out, rec[5] or '0')
        table.insert(out, rec[6] or '0')
        claimed = claimed + 1
        if not has_waiting(ctx, tenant) then
          redis.call('HDEL', deficits, tenant)
          leave = true
        elseif redis.call('ZCARD', ctx.inflight_prefix .. tenant) >= cap_of(ctx, tenant) then
          redis.call('HSET', deficits, tenant, deficit)
          redis.call('SADD', ctx.blocked, tenant)
          leave = true
        elseif deficit <= 0 then
          redis.call('HDEL', deficits, tenant)
          redis.call('LMOVE', ctx.ring, ctx.ring, 'LEFT', 'RIGHT')
        else
          redis.call('HSET', deficits, tenant, deficit)
        end
      end
    end
  end
  if leave then
    redis.call('LPOP', ctx.ring)
    redis.call('SREM', ctx.members, tenant)
  end
end
for tenant in pairs(took) do
  settle(tenant)
end
return out

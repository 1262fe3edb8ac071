-- Prepended to every dispatcher script at load time (see store.py): the
-- shared context and the rule for which tenants sit in the ring.
--
-- The ring holds, once each, the tenants that have a waiting job, a free
-- in-flight slot and are not paused: the claim script never has to skip
-- over tenants that could not be served. A tenant with work but no free
-- slot waits in the blocked set until a slot comes back.
--
-- Context, the same first six KEYS and first three ARGV in every script:
--   KEYS[1] ring (list)      KEYS[2] ring members (set)   KEYS[3] blocked (set)
--   KEYS[4] caps (hash)      KEYS[5] wake (list)          KEYS[6] paused (set)
--   ARGV[1] queue key prefix   ARGV[2] in-flight key prefix   ARGV[3] default in-flight cap

local PRIORITIES = {'high', 'normal', 'low'}

local function ring_context(keys, argv)
  return {
    ring = keys[1], members = keys[2], blocked = keys[3],
    caps = keys[4], wake = keys[5], paused = keys[6],
    queue_prefix = argv[1], inflight_prefix = argv[2],
    default_cap = tonumber(argv[3]),
  }
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function queue_key(ctx, tenant, priority)
  return ctx.queue_prefix .. tenant .. ':' .. priority
end

local function has_waiting(ctx, tenant)
  for _, priority in ipairs(PRIORITIES) do
    if redis.call('LLEN', queue_key(ctx, tenant, priority)) > 0 then
      return true
    end
  end
  return false
end

local function cap_of(ctx, tenant)
  return tonumber(redis.call('HGET', ctx.caps, tenant)) or ctx.default_cap
end

-- Slots are scored by expiry, so a slot whose holder died comes back on its
-- own: a counter only a live process decrements would leak.
local function live_inflight(ctx, tenant, now)
  local key = ctx.inflight_prefix .. tenant
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  return redis.call('ZCARD', key)
end

local function wake_dispatchers(ctx)
  redis.call('LPUSH', ctx.wake, '1')
  -- Bounded: with no dispatcher running, tokens must not pile up.
  redis.call('LTRIM', ctx.wake, 0, 63)
end

-- Put the tenant in the ring if it may be served now, else note why not.
local function activate(ctx, tenant, now)
  if redis.call('SISMEMBER', ctx.members, tenant) == 1 then
    return
  end
  if not has_waiting(ctx, tenant) or redis.call('SISMEMBER', ctx.paused, tenant) == 1 then
    redis.call('SREM', ctx.blocked, tenant)
    return
  end
  if live_inflight(ctx, tenant, now) >= cap_of(ctx, tenant) then
    redis.call('SADD', ctx.blocked, tenant)
    return
  end
  redis.call('SREM', ctx.blocked, tenant)
  redis.call('SADD', ctx.members, tenant)
  redis.call('RPUSH', ctx.ring, tenant)
  wake_dispatchers(ctx)
end

-- Give a claimed job back to the head of its queue (its lease ended unfinished).
local function return_to_queue(ctx, job_key, job_id, now)
  local rec = redis.call('HMGET', job_key, 'tenant', 'state', 'priority')
  local tenant, state, priority = rec[1], rec[2], rec[3]
  if not tenant then
    return
  end
  redis.call('ZREM', ctx.inflight_prefix .. tenant, job_id)
  if state == 'claimed' then
    redis.call('HSET', job_key, 'state', 'queued')
    redis.call('LPUSH', queue_key(ctx, tenant, priority), job_id)
  end
  activate(ctx, tenant, now)
end

-- Script body follows.

-- Prepended to every dispatcher script that changes the ring (calls.script): the
-- shared context and the rule for which tenants sit in the ring.
--
-- The ring holds, once each, the tenants that have a waiting job, a free
-- in-flight slot and are not paused: the claim script never has to skip
-- over tenants that could not be served. A tenant with work but no free
-- slot waits in the blocked set until a slot comes back: a finish (or a
-- cancel, a requeue) re-activates its tenant at once, and the reaper visits
-- only the tenants whose earliest slot expired (the expiring zset), never
-- every blocked tenant.
--
-- Every per-job step costs O(1) or O(log n) in tenants and in backlog depth;
-- the whole-system views (stats, /metrics) read counters these scripts keep
-- as work happens (backlogs, totals), never every tenant.
--
-- Context, the same first nine KEYS and first three ARGV in every script:
--   KEYS[1] ring (list)      KEYS[2] ring members (set)   KEYS[3] blocked (set)
--   KEYS[4] caps (hash)      KEYS[5] wake (list)          KEYS[6] paused (set)
--   KEYS[7] counts (hash: tenant -> jobs waiting; '~waiting', '~inflight': the totals)
--   KEYS[8] expiring (zset: tenant -> when the reaper should look at its slots, ms)
--   KEYS[9] backlog top (zset: tenant -> largest power of two its backlog reached)
--   ARGV[1] queue key prefix   ARGV[2] in-flight key prefix   ARGV[3] default in-flight cap

-- Every lane of a tenant (dispatcher/keys.py LANES): its priorities, then
-- their bulk lanes. A bulk job is taken only when the
-- urgent lanes are empty, and never into the last quarter of its tenant's
-- in-flight slots (bulk_cap), which stay for urgent jobs: however deep its
-- bulk backlog, a tenant's urgent job finds a slot, and goes first.
local PRIORITIES = {'high', 'normal', 'low', 'bulk.high', 'bulk.normal', 'bulk.low'}
local URGENT_LANES = 3

-- The most slots a tenant's bulk jobs may hold (at least one).
local function bulk_cap(cap)
  return math.max(1, cap - math.floor(cap / 4))
end

local function ring_context(keys, argv)
  return {
    ring = keys[1], members = keys[2], blocked = keys[3],
    caps = keys[4], wake = keys[5], paused = keys[6],
    counts = keys[7], expiring = keys[8], top = keys[9],
    queue_prefix = argv[1], inflight_prefix = argv[2],
    default_cap = tonumber(argv[3]),
  }
end

-- (Arithmetic converts TIME's strings once; tonumber() converts twice.)
local function now_ms()
  local t = redis.call('TIME')
  return t[1] * 1000 + math.floor(t[2] / 1000)
end

-- A number passed to redis.call is formatted with sprintf("%.14g") each time:
-- about a tenth of a busy shard's CPU went there. A value passed many times
-- (the time of the call, an expiry all of a call's jobs share) is formatted
-- once, as text.
local function as_text(n)
  return string.format('%d', n)
end

local function queue_key(ctx, tenant, priority)
  return ctx.queue_prefix .. tenant .. ':' .. priority
end

-- A queue may still hold ids of jobs cancelled while waiting (cancel leaves
-- them, the claim drops them): "waiting" here may mean only those, and a
-- claim then finds nothing and takes the tenant out of the ring. Redis deletes
-- an empty list, so one EXISTS over the priorities answers for all three.
local function queue_keys(ctx, tenant)
  local keys = {}
  for i, priority in ipairs(PRIORITIES) do
    keys[i] = queue_key(ctx, tenant, priority)
  end
  return keys
end

local function has_waiting(ctx, tenant)
  return redis.call('EXISTS', unpack(queue_keys(ctx, tenant))) > 0
end

local function has_urgent_waiting(ctx, tenant)
  return redis.call('EXISTS', unpack(queue_keys(ctx, tenant), 1, URGENT_LANES)) > 0
end

local function cap_of(ctx, tenant)
  return tonumber(redis.call('HGET', ctx.caps, tenant)) or ctx.default_cap
end

-- The counters behind the whole-system views: jobs waiting, per tenant and
-- in all, and in-flight slots in all (hash increments: O(1)). A count below
-- zero can only be drift (a job taken out of a queue by a script that does
-- not count): it is put right here, so the tenants' counts add up to the total.
local function power_of_two(n)
  local p = 1
  while p * 2 <= n do
    p = p * 2
  end
  return p
end

-- The tenant's own count. Returns its new count and the change the total
-- must take (less than delta where the count would have gone below zero).
local function count_tenant_waiting(ctx, tenant, delta)
  local n = redis.call('HINCRBY', ctx.counts, tenant, delta)
  if n <= 0 then
    redis.call('HDEL', ctx.counts, tenant)
    delta = delta - n
  elseif delta > 0 and n >= 2 and power_of_two(n) > power_of_two(math.max(1, n - delta)) then
    -- The top backlogs move only when a count reaches the next power of two:
    -- a sorted-set write per job would cost O(log n) on every enqueue.
    redis.call('ZADD', ctx.top, 'GT', power_of_two(n), tenant)
  end
  return n, delta
end

local function count_total(ctx, field, delta)
  if delta ~= 0 then
    redis.call('HINCRBY', ctx.counts, field, delta)
  end
end

local function count_total_waiting(ctx, delta)
  count_total(ctx, '~waiting', delta)
end

local function count_waiting(ctx, tenant, delta)
  if delta == 0 then
    return 0
  end
  local n, applied = count_tenant_waiting(ctx, tenant, delta)
  count_total_waiting(ctx, applied)
  return n
end

local function count_inflight(ctx, delta)
  count_total(ctx, '~inflight', delta)
end

-- The tenant's place in the expiring zset: its earliest slot's expiry, or
-- none when it holds no slot. Between two of these, slots only get later
-- (hand-off, touch, renew) or go: the score stays at or before the truth,
-- so the reaper may visit a tenant early, never late. (A claim scores its
-- slots, and its tenant, by when a slot handed off at the end of its lease
-- would expire: the lease's end plus the in-flight TTL. A claimed slot whose
-- lease runs out first needs no visit: the lease reaper frees it with its lease.)
local function schedule_expiry(ctx, tenant)
  local head = redis.call('ZRANGE', ctx.inflight_prefix .. tenant, 0, 0, 'WITHSCORES')
  if head[2] then
    redis.call('ZADD', ctx.expiring, head[2], tenant)
  else
    redis.call('ZREM', ctx.expiring, tenant)
  end
end

-- Slots are scored by expiry, so a slot whose holder died comes back on its
-- own: a counter only a live process decrements would leak. Returns how many
-- expired slots were dropped.
local function drop_expired(ctx, tenant, now)
  local expired = redis.call('ZREMRANGEBYSCORE', ctx.inflight_prefix .. tenant, '-inf', now)
  if expired > 0 then
    count_inflight(ctx, -expired)
    schedule_expiry(ctx, tenant)
  end
  return expired
end

-- The tenant's slots, expired ones dropped only if they are what holds it at
-- its cap: below the cap they change nothing, and the reaper drops them when
-- it visits (the expiring zset has the tenant due at or before the earliest).
-- So a turn below the cap costs one ZCARD (none when the caller counted them:
-- `held`).
local function held_slots(ctx, tenant, cap, now, held)
  held = held or redis.call('ZCARD', ctx.inflight_prefix .. tenant)
  if held >= cap then
    held = held - drop_expired(ctx, tenant, now)
  end
  return held
end

-- Slots are given back (finish, cancel, requeue): one ZREM for the tenant's
-- jobs. The tenant's score in the expiring zset stays (early, at worst)
-- unless it holds no slot any more. Returns how many it held, and how many it
-- holds now when it held any (for activate: nil, not counted, when it held none).
local function release_slots(ctx, tenant, job_ids)
  local key = ctx.inflight_prefix .. tenant
  local freed = redis.call('ZREM', key, unpack(job_ids))
  local left = nil
  if freed > 0 then
    count_inflight(ctx, -freed)
    left = redis.call('ZCARD', key)
    if left == 0 then
      redis.call('ZREM', ctx.expiring, tenant)
    end
  end
  return freed, left
end

local function release_slot(ctx, tenant, job_id)
  return release_slots(ctx, tenant, {job_id})
end

-- The token says why (Keys.wake): '1' a tenant may be claimable, 's' a
-- scheduled job is due before any other was; only the second sends a
-- dispatcher to look for due scheduled jobs.
local function wake_dispatchers(ctx, token)
  -- Bounded: with no dispatcher running, tokens must not pile up.
  if redis.call('LPUSH', ctx.wake, token or '1') > 64 then
    redis.call('LTRIM', ctx.wake, 0, 63)
  end
end

-- Put the tenant in the ring if it may be served now, else note why not.
-- `held`: the slots it holds, when the caller has just counted them.
local function activate(ctx, tenant, now, held)
  if redis.call('SISMEMBER', ctx.members, tenant) == 1 then
    return
  end
  if not has_waiting(ctx, tenant) or redis.call('SISMEMBER', ctx.paused, tenant) == 1 then
    redis.call('SREM', ctx.blocked, tenant)
    return
  end
  local cap = cap_of(ctx, tenant)
  held = held_slots(ctx, tenant, cap, now, held)
  if held >= cap or (held >= bulk_cap(cap) and not has_urgent_waiting(ctx, tenant)) then
    -- No need to note when: the tenant holds slots, so it is in the expiring
    -- zset, and a finish re-activates it sooner.
    redis.call('SADD', ctx.blocked, tenant)
    return
  end
  redis.call('SREM', ctx.blocked, tenant)
  redis.call('SADD', ctx.members, tenant)
  redis.call('RPUSH', ctx.ring, tenant)
  wake_dispatchers(ctx)
end

-- A job joins its tenant's queue, at the tail (new) or the head (returned).
-- Returns the tenant's count of waiting jobs, with this one.
local function push_waiting(ctx, tenant, priority, job_id, head)
  redis.call(head and 'LPUSH' or 'RPUSH', queue_key(ctx, tenant, priority), job_id)
  return count_waiting(ctx, tenant, 1)
end

-- Give a claimed job back to the head of its queue (its lease ended unfinished).
local function return_to_queue(ctx, job_key, job_id, now)
  local rec = redis.call('HMGET', job_key, 'tenant', 'state', 'priority')
  local tenant, state, priority = rec[1], rec[2], rec[3]
  if not tenant then
    return
  end
  release_slot(ctx, tenant, job_id)
  if state == 'claimed' then
    redis.call('HSET', job_key, 'state', 'queued')
    push_waiting(ctx, tenant, priority, job_id, true)
  end
  activate(ctx, tenant, now)
end

-- The anchor that keeps a set of jobs a skiplist (Keys.ANCHOR: the dispatched
-- index's, dispatcher/stranded.py, written by handoff.lua; the leases', by
-- claim.lua) goes with the last of its jobs, so that a store with none keeps
-- no such key, as it did before the anchor. It alone is scored +inf (job
-- scores are times): a job left alone in the set (no anchor: an earlier
-- version's) stays.
local function drop_lone_anchor(set)
  if redis.call('ZCARD', set) == 1 then
    redis.call('ZREMRANGEBYSCORE', set, '+inf', '+inf')
  end
end

-- Jobs leave such a set: ids[first..last]. Returns how many of them it held.
local function zrem_jobs(set, ids, first, last)
  local gone = redis.call('ZREM', set, unpack(ids, first, last))
  if gone > 0 then
    drop_lone_anchor(set)
  end
  return gone
end

-- Script body follows.

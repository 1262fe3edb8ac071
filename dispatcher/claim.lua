-- Claim up to N jobs fairly: deficit round robin over the ring, each claim a lease.
-- KEYS[1..9] ring context (ring.lua), KEYS[10] deficits (hash), KEYS[11] weights (hash),
-- KEYS[12] leases (zset), KEYS[13] this claim's record (Keys.claim: a string, its token in the name)
-- ARGV[1..3] ring context, ARGV[4] N, ARGV[5] default weight, ARGV[6] lease ms,
-- ARGV[7] job key prefix, ARGV[8] in-flight TTL ms (what a hand-off gives a slot: a claim
-- gives it that from its lease's end),
-- ARGV[9] payload key prefix, ARGV[10] what separates a queue entry's id from its payload,
-- ARGV[11] the leases' anchor (Keys.ANCHOR)
-- Returns a flat list: id, tenant, kind, payload, attempts, created_ms, replays for each job,
-- then, when it answers any, the claim's time (ms: a hand-off within the lease need not
-- write the jobs' slots again, handoff.lua).
--
-- Idempotent per token: a claim asked again under the token of one that leased
-- jobs (its answer was lost on the way back) answers those jobs, the ones still
-- leased to it, and claims nothing more. Without that, nobody would know they
-- are leased, and they would wait for the lease to end and the reaper.
--
-- A tenant's turn is settled once, not once per job: its cap, slots and
-- deficit are read once, its jobs popped in one LMPOP (the first non-empty
-- priority first), their leases and slots written in one ZADD each, and its
-- count of waiting jobs moved once. A turn of one job (the default weight)
-- costs six commands: four for the turn (ZCARD, LMPOP, ZADD, HINCRBY),
-- two for the job (its record read and marked claimed; the payloads its
-- queue entries carried are written in one MSET a call); a turn of bulk jobs
-- one more, the LMPOP of the urgent lanes that found them empty.
-- The ring itself is read once and written once a call (while it holds no
-- more tenants than the call wants jobs, and fewer than 64; a longer one
-- costs an LMOVE a turn), and the tenants that leave it are taken out of its
-- members, and put in the blocked set, in one SREM and one SADD.
local record = KEYS[13]
local written = redis.call('GET', record)
if written then
  -- The claim's time, then its jobs, each after ARGV[10] (no job id holds it).
  -- A job still leased to it is claimed since that time: reaped (its lease ran
  -- out), requeued or cancelled it is not claimed, and claimed again it is so
  -- since a later time.
  local earlier, from = {}, 1
  while true do
    local at = string.find(written, ARGV[10], from, true)
    earlier[#earlier + 1] = string.sub(written, from, at and at - 1 or -1)
    if not at then
      break
    end
    from = at + #ARGV[10]
  end
  local again = {}
  for i = 2, #earlier do
    local job_id = earlier[i]
    local rec = redis.call('HMGET', ARGV[7] .. job_id, 'state', 'claimed_ms', 'tenant', 'kind',
      'attempts', 'created_ms', 'replays')
    if rec[1] == 'claimed' and rec[2] == earlier[1] then
      again[#again + 1] = job_id
      again[#again + 1] = rec[3]
      again[#again + 1] = rec[4] or ''
      again[#again + 1] = redis.call('GET', ARGV[9] .. job_id) or ''
      again[#again + 1] = rec[5] or '0'
      again[#again + 1] = rec[6] or '0'
      again[#again + 1] = rec[7] or '0'
    end
  end
  if #again > 0 then
    again[#again + 1] = earlier[1]
  end
  return again
end
-- Tenants in the ring: only this call moves them while it runs. An empty ring
-- has nothing to claim; a dispatcher asks again after a short batch and after
-- each wake-up, and such calls stop here, before ring.lua's helpers are built.
-- A ring of no more tenants than the call wants jobs (under load: the few
-- whose slots a finish just freed), and fewer than 64, is read whole and
-- turned here, in Lua, and written back once at the end: one LRANGE and a
-- DEL and RPUSH a call instead of an LMOVE a turn and an RPOP a leave. A
-- longer one is turned in Redis, a turn at a time: a call then takes fewer
-- turns than the ring has tenants, and writing the whole ring back would
-- cost more than the turns.
local ring_read = math.min(64, tonumber(ARGV[4]) + 1)
local held_ring = redis.call('LRANGE', KEYS[1], 0, ring_read - 1)
local ring_len = #held_ring
if ring_len == 0 then
  return {}
elseif ring_len == ring_read then
  held_ring, ring_len = nil, redis.call('LLEN', KEYS[1])
end
-- ring.lua goes here
local ctx = ring_context(KEYS, ARGV)
local deficits, weights, leases = KEYS[10], KEYS[11], KEYS[12]
local wanted, default_weight = tonumber(ARGV[4]), tonumber(ARGV[5])
local lease_ms, job_prefix, payload_prefix = tonumber(ARGV[6]), ARGV[7], ARGV[9]
-- A queue entry is a job id, or (enqueue.lua) its id and its payload: the
-- payload leaves the queue with it, so it gets its key here (dispatcher/record.py).
local sep = ARGV[10]
local sep_len = #sep
local find, sub = string.find, string.sub
-- A job cancelled while its entry waited: the entry held its only copy of the
-- payload, which its dead letter keeps as long as its record, and its replay
-- (replay.lua) reads from the key.
local function keep_payload(job_key, payload_key, payload)
  local ttl = redis.call('PTTL', job_key)
  if ttl > 0 then
    redis.call('SET', payload_key, payload, 'PX', ttl)
  else
    redis.call('SET', payload_key, payload)
  end
  redis.call('HSET', job_key, 'inline', '0')
end
-- A claimed job's slot expires when a hand-off at the end of its lease would
-- have it expire: the lease's end plus the in-flight TTL. So a hand-off within
-- the lease (the claimer's own: nobody else hands off its jobs) need not write
-- the slot again (handoff.lua: an update of a sorted set held as a listpack is
-- a scan of it, two for a new score). A lease that runs out first frees the
-- slot with it: the reaper returns the job and releases its slot; a claimer
-- that renews its leases past that hands off with the slot written again. The
-- reaper is due for the tenant when the slot expires.
local slot_ms = tonumber(ARGV[8])
-- Jobs a turn pops at most (one LMPOP, one ZADD of their slots).
local MOST_PER_TURN = 500
local now = now_ms()
local now_s = as_text(now)
-- When the slots of this call expire, and the reaper is due for their tenants
-- (the same for every one).
local due_s = as_text(now + lease_ms + slot_ms)
local out = {}
local claimed = 0
local slots_taken = 0
-- What the total of waiting jobs takes, once a call.
local total_delta = 0
-- The claimed jobs' answer, seven values a job, and how many values so far.
local n_out = 0
-- The deadline of the claim's job number `claimed` (from 0; written where the
-- job is taken, not in a function: a call a job), as tostring
-- writes it: the lease's end plus claimed / 1000 ms. The fraction keeps claim
-- order among equal deadlines, so expired claims go back to their queue in
-- the order they left it. A time of 13 digits keeps one decimal (%.14g): for
-- the first 50 jobs of a call that is none, the lease's end as written once
-- (formatting the float, and Redis parsing a fraction, cost a few thousand
-- instructions a job).
local lease_end = now + lease_ms
local lease_s = as_text(lease_end)
local whole_until = (lease_end >= 1e12 and lease_end < 1e13) and 50 or 0
-- Score, member pairs for the leases zset and the expiring zset, written a
-- few hundred at a time (one ZADD's arguments stay well inside Lua's stack).
-- The leases' anchor first in each ZADD of them (Keys.ANCHOR, scored +inf, no
-- job: ring.lua's drop_lone_anchor takes it out with the last lease): it keeps
-- the set in Redis's skiplist encoding, where a lease added or removed is a
-- lookup, not a scan of the set (a listpack's few dozen leases cost a claim
-- some 4,300 instructions a job more, its ids sorted so that each went first),
-- and first it turns a set an earlier version left a listpack before its
-- leases go in.
local anchor = ARGV[11]
local all_leases, due_tenants, n_leases = {'+inf', anchor}, {}, 2
-- Key, value pairs of the payloads the claimed entries carried, for one MSET:
-- a command a job less (a call from Lua costs some 4,000 instructions of its own).
local payloads, n_payloads = {}, 0
local function write_leases()
  if n_leases > 2 then
    redis.call('ZADD', leases, unpack(all_leases, 1, n_leases))
    redis.call('ZADD', ctx.expiring, 'LT', unpack(due_tenants))
    all_leases, due_tenants, n_leases = {'+inf', anchor}, {}, 2
  end
  if n_payloads > 0 then
    redis.call('MSET', unpack(payloads, 1, n_payloads))
    payloads, n_payloads = {}, 0
  end
end

-- Pop up to `room` of the tenant's jobs and claim those still queued (an
-- entry whose record is gone or no longer queued, cancelled while waiting, is
-- dropped: its count was taken then; and so is an entry no longer the job's
-- place, replayed: its id waits at the tail. The payload such an entry
-- carries is kept for the job). Returns (jobs claimed, entries popped, slots
-- taken).
--
-- The per-job work is what a claim costs under load, so it builds no table
-- of its own: its lease pairs go straight into all_leases, its payload into
-- payloads, its slot into the turn's (one ZADD).
local function take(tenant, room, bulk_room)
  -- Its queues, as queue_keys names them (ring.lua's lanes), with no table built:
  -- the urgent lanes first; the bulk lanes only when those are empty, and only
  -- into the slots bulk jobs may hold (bulk_cap). A fourth answer, true: only
  -- bulk jobs wait, and they have no room (the tenant is blocked for them).
  local prefix = ctx.queue_prefix .. tenant .. ':'
  local popped = redis.call('LMPOP', URGENT_LANES, prefix .. PRIORITIES[1], prefix .. PRIORITIES[2],
    prefix .. PRIORITIES[3], 'LEFT', 'COUNT', room)
  if not popped then
    if math.min(room, bulk_room) <= 0 then
      return 0, 0, 0, redis.call('EXISTS', prefix .. PRIORITIES[4], prefix .. PRIORITIES[5],
        prefix .. PRIORITIES[6]) > 0
    end
    popped = redis.call('LMPOP', 3, prefix .. PRIORITIES[4], prefix .. PRIORITIES[5],
      prefix .. PRIORITIES[6], 'LEFT', 'COUNT', math.min(room, bulk_room))
    if not popped then
      return 0, 0, 0
    end
  end
  local ids = popped[2]
  local turn_slots, n_slots = {}, 0
  for i = 1, #ids do
    -- Split here, not in a function: a call a job costs more than the split.
    local job_id, payload = ids[i], nil
    local at = find(job_id, sep, 1, true)
    if at then
      job_id, payload = sub(job_id, 1, at - 1), sub(job_id, at + sep_len)
    end
    local job_key = job_prefix .. job_id
    local rec = redis.call('HMGET', job_key, 'state', 'kind', 'attempts', 'created_ms', 'replays', 'inline')
    if rec[1] == 'queued' and (not payload or rec[6] == '1') then
      if payload then
        redis.call('HSET', job_key, 'state', 'claimed', 'claimed_ms', now_s, 'inline', '0')
        payloads[n_payloads + 1] = payload_prefix .. job_id
        payloads[n_payloads + 2] = payload
        n_payloads = n_payloads + 2
      else
        payload = redis.call('GET', payload_prefix .. job_id) or ''
        redis.call('HSET', job_key, 'state', 'claimed', 'claimed_ms', now_s)
      end
      all_leases[n_leases + 1] = claimed < whole_until and lease_s or tostring(lease_end + claimed / 1000)
      all_leases[n_leases + 2] = job_id
      n_leases = n_leases + 2
      turn_slots[n_slots + 1] = due_s
      turn_slots[n_slots + 2] = job_id
      n_slots = n_slots + 2
      out[n_out + 1] = job_id
      out[n_out + 2] = tenant
      out[n_out + 3] = rec[2] or ''
      out[n_out + 4] = payload
      out[n_out + 5] = rec[3] or '0'
      out[n_out + 6] = rec[4] or '0'
      out[n_out + 7] = rec[5] or '0'
      n_out = n_out + 7
      claimed = claimed + 1
    elseif payload and (rec[6] == '1' or rec[6] == '2') then
      keep_payload(job_key, payload_prefix .. job_id, payload)
    end
  end
  local n = n_slots / 2
  if n == 0 then
    return 0, #ids, 0
  end
  -- The leases and the reaper's schedule are written once, after the last turn.
  local added = redis.call('ZADD', ctx.inflight_prefix .. tenant, unpack(turn_slots, 1, n_slots))
  due_tenants[#due_tenants + 1] = due_s
  due_tenants[#due_tenants + 1] = tenant
  if n_leases >= 2 * MOST_PER_TURN + 2 then
    write_leases()
  end
  return n, #ids, added
end

-- Per call, not per turn: whether any tenant is paused or has a weight, a
-- cap or a deficit of its own. Most of the time none has, and a turn then
-- reads none of them.
local any_paused, any_weight, any_cap, any_deficit = false, false, false, false
if redis.call('EXISTS', ctx.paused, weights, ctx.caps, deficits) > 0 then
  any_paused = redis.call('EXISTS', ctx.paused) == 1
  any_weight = redis.call('EXISTS', weights) == 1
  any_cap = redis.call('EXISTS', ctx.caps) == 1
  any_deficit = redis.call('EXISTS', deficits) == 1
end

-- Whole rounds at once. While every tenant has a quantum of one job (weight
-- one, none set), a round gives each tenant in the ring one job; the rounds
-- the call still wants whole are given in one pass over the ring, a turn a
-- tenant: the jobs the one-by-one round robin claims, with a turn's commands
-- paid once a tenant rather than once a job. (A short ring, the one or two
-- tenants whose slots a finish just freed, is the common case under load.) A
-- pass counts its tenants when it starts; a turn that goes on (below) is not
-- a new one. A tenant with a turn left over (a deficit) has that turn first.
-- A pass's rounds are not a deficit: a tenant that leaves the ring in the
-- middle of them (at its cap) keeps none, as one-job turns would leave it none;
-- kept, they were a deficit every later call read a turn, with whole rounds
-- off until it was spent (claims of 50 of a deep backlog took twice the turns).
local whole_rounds = default_weight == 1 and not any_weight
local pass_left, pass_rounds, goes_on = 0, 1, false

-- The ring's moves, as LMOVE and RPOP make them: on held_ring, a deque from
-- index ring_head to ring_tail, when it was read whole; else in Redis.
local ring_head, ring_tail, ring_moved = 1, ring_len, false
-- The head's turn: it goes to the tail at once (where a turn of one job
-- leaves it).
local function next_turn()
  if not held_ring then
    return redis.call('LMOVE', ctx.ring, ctx.ring, 'LEFT', 'RIGHT')
  end
  if ring_head > ring_tail then
    return nil
  end
  local tenant = held_ring[ring_head]
  held_ring[ring_head] = nil
  ring_head, ring_tail, ring_moved = ring_head + 1, ring_tail + 1, true
  held_ring[ring_tail] = tenant
  return tenant
end
-- The tenant whose turn it was, at the tail, leaves the ring.
local function leave_ring()
  if not held_ring then
    redis.call('RPOP', ctx.ring)
    return
  end
  held_ring[ring_tail] = nil
  ring_tail = ring_tail - 1
end
-- ... or goes back to the head: its turn goes on.
local function turn_goes_on()
  if not held_ring then
    redis.call('LMOVE', ctx.ring, ctx.ring, 'RIGHT', 'LEFT')
    return
  end
  local tenant = held_ring[ring_tail]
  held_ring[ring_tail] = nil
  ring_tail, ring_head = ring_tail - 1, ring_head - 1
  held_ring[ring_head] = tenant
end
local function write_ring()
  if held_ring and ring_moved then
    redis.call('DEL', ctx.ring)
    if ring_tail >= ring_head then
      redis.call('RPUSH', ctx.ring, unpack(held_ring, ring_head, ring_tail))
    end
  end
end
-- Tenants that left the ring, and those of them blocked: one SREM and one SADD a call.
local left_ring, blocked_now = {}, {}

-- Each step claims jobs, drops ids of jobs no longer waiting (cancelled) or
-- takes a tenant out of the ring, so this is bounded by N, the dropped ids
-- and the ring's length; the guard only caps one call's work.
local steps = 0
while claimed < wanted and steps < wanted * 4 + 64 do
  steps = steps + 1
  -- The head's turn: back to the head only if its turn goes on.
  local tenant = next_turn()
  if not tenant then
    break
  end
  if whole_rounds and not goes_on then
    if pass_left <= 0 then
      pass_left = ring_len
      pass_rounds = math.max(1, math.floor((wanted - claimed) / ring_len))
    end
    pass_left = pass_left - 1
  end
  goes_on = false
  local leave, again = false, false
  local cap, held = 0, 0
  if any_paused and redis.call('SISMEMBER', ctx.paused, tenant) == 1 then
    leave = true
  else
    cap = any_cap and cap_of(ctx, tenant) or ctx.default_cap
    held = held_slots(ctx, tenant, cap, now_s)
    if held >= cap then
      blocked_now[#blocked_now + 1] = tenant
      leave = true
    end
  end
  if not leave then
    local stored = any_deficit and tonumber(redis.call('HGET', deficits, tenant)) or nil
    local deficit = stored
    local from_pass = false
    if not deficit or deficit <= 0 then
      -- The tenant's turn starts: its quantum is its weight (or the pass's rounds).
      deficit = any_weight and tonumber(redis.call('HGET', weights, tenant)) or default_weight
      if whole_rounds then
        deficit, from_pass = pass_rounds, true
      end
    end
    local room = math.min(deficit, cap - held, wanted - claimed, MOST_PER_TURN)
    local n, popped, added, full = take(tenant, room, bulk_cap(cap) - held)
    if full then
      -- Only bulk jobs wait, and the slots left are kept for urgent ones.
      blocked_now[#blocked_now + 1] = tenant
      leave = true
    elseif popped == 0 then
      if stored then
        redis.call('HDEL', deficits, tenant)
      end
      -- Its queues are empty: whatever its count says is drift, put right.
      local left = tonumber(redis.call('HGET', ctx.counts, tenant))
      if left then
        count_waiting(ctx, tenant, -left)
      end
      redis.call('ZREM', ctx.top, tenant)
      leave = true
    elseif n == 0 then
      -- Only ids of cancelled jobs: its turn has not been used.
      again = true
    else
      slots_taken = slots_taken + added
      local left, applied = count_tenant_waiting(ctx, tenant, -n)
      total_delta = total_delta + applied
      deficit = deficit - n
      -- What is left of its turn, for when it goes on (or comes back unblocked).
      local remaining = deficit > 0 and deficit or nil
      -- Jobs counted waiting have their entries queued: only at a count of
      -- zero may the queues be empty (or hold cancelled jobs' entries only).
      if left <= 0 and not has_waiting(ctx, tenant) then
        -- A turn does not outlive the backlog it was for.
        remaining = nil
        leave = true
      elseif held + added >= cap and held + added - drop_expired(ctx, tenant, now_s) >= cap then
        blocked_now[#blocked_now + 1] = tenant
        leave = true
        if from_pass then
          remaining = nil
        end
      else
        again = remaining ~= nil
      end
      if remaining then
        if remaining ~= stored then
          redis.call('HSET', deficits, tenant, remaining)
          any_deficit = true
        end
      elseif stored then
        redis.call('HDEL', deficits, tenant)
      end
    end
  end
  if leave then
    leave_ring()
    left_ring[#left_ring + 1] = tenant
    ring_len = ring_len - 1
  elseif again then
    turn_goes_on()
    goes_on = true
  end
end
write_ring()
if #left_ring > 0 then
  redis.call('SREM', ctx.members, unpack(left_ring))
end
if #blocked_now > 0 then
  redis.call('SADD', ctx.blocked, unpack(blocked_now))
end
write_leases()
count_total_waiting(ctx, total_delta)
count_inflight(ctx, slots_taken)
if claimed > 0 then
  -- Kept for a lease: past it the jobs are the reaper's, not this claim's. One
  -- string written with its TTL, in one command.
  local leased = {now_s}
  for i = 1, n_out, 7 do
    leased[#leased + 1] = out[i]
  end
  redis.call('SET', record, table.concat(leased, ARGV[10]), 'PX', ARGV[6])
  out[n_out + 1] = now_s
end
return out

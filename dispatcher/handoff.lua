-- Jobs were handed to their downstream (SQS): end their leases, keep their
-- in-flight slots until they finish (or, as a floor, for a TTL from now, never
-- shortening one the worker already kept longer), and index
-- them by when they count as stranded unless they show progress first.
-- KEYS[1..9] ring context (ring.lua: the counters and the expiring zset),
-- KEYS[10] leases (zset), KEYS[11] dispatched jobs (zset: job id -> stranded at ms)
-- ARGV[1..3] ring context, ARGV[4] job key prefix, ARGV[5] in-flight TTL ms,
-- ARGV[6] stranded after ms, ARGV[7] the index's anchor (Keys.ANCHOR), ARGV[8] until
-- when the jobs' claims hold their leases for sure (ms: the earliest claim's time plus
-- a lease; 0: not known), ARGV[9..] job ids
local ctx = ring_context(KEYS, ARGV)
local leases, dispatched = KEYS[10], KEYS[11]
local job_prefix = ARGV[4]
local now = now_ms()
local now_s = as_text(now)
-- Formatted once: every job of the call shares them.
local expiry = as_text(now + tonumber(ARGV[5]))
local stranded_at = as_text(now + tonumber(ARGV[6]))
-- Handed off before ARGV[8], a job still claimed is still this claimer's
-- (only the claimer hands off its jobs, with the claim of the same version):
-- its lease has not run out (a renewal only moves it later), so no reaper
-- returned it and no other claimer took it since. Its claim gave its slot
-- the lease's end plus the TTL (claim.lua), no earlier than the expiry here,
-- and the slot is not written again: a ZADD of a slot costs a scan of the
-- tenant's slots (a listpack), two more for a new score, some 7,000
-- instructions of Redis's a job. The claimer says when it claimed them:
-- reading claimed_ms, near the end of each record, would cost half that.
local rewrite_slots = now >= tonumber(ARGV[8])
-- Every lease ends, whatever the record says: one ZREM for the batch (and the
-- leases' anchor with the last of them, ring.lua).
zrem_jobs(leases, ARGV, 9, #ARGV)
-- The anchor first, with every hand-off: it makes a new index a skiplist at once
-- (Redis picks the encoding by the first member), and turns one an earlier
-- version made a listpack; in a skiplist, writing it again is one lookup.
local stranded, n_stranded = {'+inf', ARGV[7]}, 2
-- Per tenant, in the order first seen: its jobs' new slot expiries (one ZADD each),
-- of the jobs whose slots the claim did not give that expiry already.
local tenants, slots = {}, {}
for i = 9, #ARGV do
  local job_id = ARGV[i]
  local job_key = job_prefix .. job_id
  -- Within the leases, its state alone (no record: none), not an HMGET's table a job:
  -- its tenant is read only for a slot written again.
  local state, tenant
  if rewrite_slots then
    local rec = redis.call('HMGET', job_key, 'state', 'tenant')
    state, tenant = rec[1], rec[2]
  else
    state = redis.call('HGET', job_key, 'state')
  end
  if state == 'queued' or state == 'claimed' then
    if state == 'queued' then
      -- The lease ran out before the hand-off was recorded and the job went
      -- back to its queue: it is in SQS now, so take it out again (the reaper
      -- put it at the head: this reads no further). Rare: its lane is read only then.
      local rec = redis.call('HMGET', job_key, 'tenant', 'priority')
      tenant = rec[1]
      if redis.call('LREM', queue_key(ctx, tenant, rec[2]), 1, job_id) == 1 then
        count_waiting(ctx, tenant, -1)
      end
    end
    redis.call('HSET', job_key, 'state', 'dispatched', 'dispatched_ms', now_s)
    if state == 'queued' or rewrite_slots then
      if not slots[tenant] then
        slots[tenant] = {}
        tenants[#tenants + 1] = tenant
      end
      slots[tenant][#slots[tenant] + 1] = expiry
      slots[tenant][#slots[tenant] + 1] = job_id
    end
    stranded[n_stranded + 1] = stranded_at
    stranded[n_stranded + 2] = job_id
    n_stranded = n_stranded + 2
  end
end
for _, tenant in ipairs(tenants) do
  -- GT: the worker may have parked a job (touch.lua) before this
  -- hand-off was recorded; its longer expiry stands. A slot added here (its
  -- claimed slot was freed: reaped with the lease, or dropped as expired by a
  -- claim once the lease and the TTL after it had passed) is counted, and its
  -- tenant is due for the reaper.
  local added = redis.call('ZADD', ctx.inflight_prefix .. tenant, 'GT', unpack(slots[tenant]))
  if added > 0 then
    count_inflight(ctx, added)
    redis.call('ZADD', ctx.expiring, 'LT', expiry, tenant)
  end
end
if n_stranded > 2 then
  redis.call('ZADD', dispatched, unpack(stranded))
end
return now

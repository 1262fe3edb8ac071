-- Put jobs back in the scheduled set, due after a wait, with why they wait: jobs a
-- worker will not hand off now (claimed: their lease ends), or that a worker takes
-- back from downstream (dispatched: out of the dispatched index). Either way the
-- job's in-flight slot is freed and it is an ordinary scheduled job again:
-- promoted when due, claimed and handed off as any other. A job kind uses it for
-- a wait that must not block its tenant's other jobs.
-- KEYS[1..9] ring context (ring.lua), KEYS[10] leases (zset), KEYS[11] dispatched
-- jobs (zset), KEYS[12] scheduled jobs (zset), then per job: its hash and its B
-- busy markers (Keys.busy_markers), and, last, the journal (stream) when there is
-- one (journal.lua)
-- ARGV[1..3] ring context, ARGV[4] the wait (ms), ARGV[5] why (the jobs'
-- waiting_for), ARGV[6] B, ARGV[7..] the journal (journal.lua), then per job: its
-- id and its journal entry (a count M and M pairs), appended only when the job
-- starts to wait for this reason (not again at each recheck)
-- Returns, per job: 1 deferred, and it waits for this reason anew; 2 deferred, as it
-- waited before; 0 left as it is (not claimed under a lease nor dispatched, or a
-- worker is at it: one of its busy markers exists); -1 no record.
-- Idempotent: a job deferred already is scheduled, and is left as it is.
local ctx = ring_context(KEYS, ARGV)
local leases, dispatched, scheduled = KEYS[10], KEYS[11], KEYS[12]
local wait, reason = tonumber(ARGV[4]), ARGV[5]
local now = now_ms()
local due = as_text(now + wait)
local markers = tonumber(ARGV[6])
local journal, a = journal_context(KEYS[#KEYS], ARGV, 7)
local function busy(at)
  for i = at, at + markers - 1 do
    if redis.call('EXISTS', KEYS[i]) == 1 then
      return true
    end
  end
  return false
end
local out, tenants, seen = {}, {}, {}
local k = 12
while a <= #ARGV do
  local job_id, entry = ARGV[a], a + 1
  a = journal_skip(ARGV, entry)
  local job_key, first_marker = KEYS[k + 1], k + 2
  k = k + 1 + markers
  local rec = redis.call('HMGET', job_key, 'tenant', 'state', 'waiting_for')
  local tenant, state = rec[1], rec[2]
  local result, took = 0, false
  if not tenant then
    result = -1
  elseif busy(first_marker) then
    took = false
  elseif state == 'claimed' then
    took = zrem_jobs(leases, {job_id}, 1, 1) == 1
  elseif state == 'dispatched' then
    zrem_jobs(dispatched, {job_id}, 1, 1)
    took = true
  end
  if took then
    release_slot(ctx, tenant, job_id)
    redis.call('HSET', job_key, 'state', 'scheduled', 'waiting_for', reason, 'waiting_until_ms', due)
    redis.call('ZADD', scheduled, due, job_id)
    result = 2
    if rec[3] ~= reason then
      journal_append(journal, job_key, job_id, nil, ARGV, entry)
      result = 1
    end
    if not seen[tenant] then
      seen[tenant] = true
      tenants[#tenants + 1] = tenant
    end
  end
  out[#out + 1] = result
end
-- Slots were freed: the tenant's other jobs may be claimed now.
for _, tenant in ipairs(tenants) do
  activate(ctx, tenant, now)
end
journal_trim(journal, now)
return out

-- Cancel a job not yet handed to its downstream: scheduled, queued or claimed
-- (a claimed job may still reach its downstream, but its record says dead, so
-- its worker drops it). It becomes a dead letter with the given reason.
-- KEYS[1..9] ring context (ring.lua), KEYS[10] job hash, KEYS[11] scheduled (zset),
-- KEYS[12] leases (zset), KEYS[13] dead letters (zset), KEYS[14] the job's content,
-- KEYS[15] the job's payload, KEYS[16..15+B] the job's B busy markers
-- (Keys.busy_markers), then the journal (stream) when there is one (journal.lua)
-- ARGV[1..3] ring context, ARGV[4] job id, ARGV[5] seconds to keep the record
-- (0: forever), ARGV[6] the reason, ARGV[7] B, ARGV[8..7+B] each busy marker's
-- state, then the journal (journal.lua), then the job's journal entry (a count M
-- and M pairs)
-- Returns {1, state it had} when cancelled; {0, state, dead reason} when it is
-- too late (dispatched, sent, dead, or a worker is at it now: the state of its
-- first busy marker that exists); {-1} if there is no such job.
local ctx = ring_context(KEYS, ARGV)
local job_key, job_id, keep, reason = KEYS[10], ARGV[4], tonumber(ARGV[5]), ARGV[6]
local rec = redis.call('HMGET', job_key, 'tenant', 'state', 'dead_reason')
local tenant, state = rec[1], rec[2]
if not tenant then
  return {-1}
end
-- A worker is at it (a copy already downstream while the record still says
-- claimed or queued): it is going out. Checked here, atomically with the script
-- that sets the marker.
local markers = tonumber(ARGV[7])
for i = 1, markers do
  if redis.call('EXISTS', KEYS[15 + i]) == 1 then
    return {0, ARGV[7 + i], ''}
  end
end
if state == 'scheduled' then
  redis.call('ZREM', KEYS[11], job_id)
elseif state == 'queued' then
  -- Its entry stays in the queue (taking it out would scan the backlog): the
  -- claim drops it when it comes up, as it drops any id no longer queued,
  -- and keeps the payload the entry may carry for this dead letter
  -- (claim.lua, replay.lua); its payload key may not exist until then.
  count_waiting(ctx, tenant, -1)
elseif state == 'claimed' then
  zrem_jobs(KEYS[12], {job_id}, 1, 1)
  release_slot(ctx, tenant, job_id)
else
  return {0, state, rec[3] or ''}
end
local now = now_ms()
redis.call('HSET', job_key, 'state', 'dead', 'finished_ms', now, 'dead_reason', reason,
  'cancelled_from', state)
redis.call('ZADD', KEYS[13], now, job_id)
if keep > 0 then
  redis.call('EXPIRE', job_key, keep)
  redis.call('EXPIRE', KEYS[14], keep)
  redis.call('EXPIRE', KEYS[15], keep)
end
local journal, entry = journal_context(KEYS[16 + markers], ARGV, 8 + markers)
journal_append(journal, job_key, job_id, 'dead', ARGV, entry)
journal_trim(journal, now)
activate(ctx, tenant, now)
return {1, state}

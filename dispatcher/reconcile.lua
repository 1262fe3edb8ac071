-- Find dispatched jobs that made no progress for longer than they can
-- legitimately wait (their downstream no longer holds them: for a queue, a
-- redrive policy moved the message away, a purge, the retention period) and decide
-- each one's fate. Atomic, so replicas may run it at once: a job is picked by
-- one of them per round (its deadline moves on as it is picked).
-- KEYS[1] dispatched jobs (zset: job id -> stranded at ms), KEYS[2] what the
-- reconciler did (hash: 'handed_again' | 'dead' -> count)
-- ARGV[1] job key prefix, ARGV[2] in-flight key prefix, ARGV[3] stranded after ms,
-- ARGV[4] in-flight TTL ms, ARGV[5] hand-offs allowed before a dead letter,
-- ARGV[6] most jobs per call, ARGV[7] payload key prefix, ARGV[8] the index's
-- anchor (Keys.ANCHOR), ARGV[9..] the key prefix of each busy marker (Keys.busy_markers)
-- Returns a flat list, per stranded job: outcome ('again': hand it downstream
-- again; 'dead': it was handed again often enough), id, tenant, kind, payload,
-- created_ms, replays, hand-offs made by the reconciler so far (with this one).
local index, counts = KEYS[1], KEYS[2]
local job_prefix, inflight_prefix = ARGV[1], ARGV[2]
local stranded_after, inflight_ttl = tonumber(ARGV[3]), tonumber(ARGV[4])
local allowed = tonumber(ARGV[5])
local function busy(job_id)
  for i = 9, #ARGV do
    if redis.call('EXISTS', ARGV[i] .. job_id) == 1 then
      return true
    end
  end
  return false
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- The anchor (scored +inf: never due) is all an index holds once its jobs are
-- done: it goes, so that an idle store keeps no index (the next hand-off writes
-- it again). If the one member left is a job, the ZREM finds nothing.
if redis.call('ZCARD', index) == 1 then
  redis.call('ZREM', index, ARGV[8])
end
local due = redis.call('ZRANGEBYSCORE', index, '-inf', now, 'LIMIT', 0, tonumber(ARGV[6]))
local out = {}
for _, job_id in ipairs(due) do
  local job_key = job_prefix .. job_id
  local rec = redis.call('HMGET', job_key, 'tenant', 'state', 'kind', 'payload', 'created_ms',
    'replays', 'reconciled')
  local tenant, state = rec[1], rec[2]
  if not tenant or state ~= 'dispatched' then
    -- Finished (or its record expired) without leaving the index: forget it.
    redis.call('ZREM', index, job_id)
  elseif busy(job_id) then
    -- A worker is at it right now: that is progress.
    redis.call('ZADD', index, now + stranded_after, job_id)
  else
    local made = tonumber(rec[7]) or 0
    local outcome = 'dead'
    if made < allowed then
      outcome = 'again'
      made = made + 1
      redis.call('HSET', job_key, 'reconciled', made, 'reconciled_ms', now)
      -- It goes back to SQS as the same job: it keeps its tenant's slot, if it
      -- still has one (an expired slot is not taken again here: the slot
      -- counters belong to the scripts that share ring.lua).
      redis.call('ZADD', inflight_prefix .. tenant, 'XX', 'GT', now + inflight_ttl, job_id)
    end
    -- Picked for this round: no other replica takes it meanwhile.
    redis.call('ZADD', index, now + stranded_after, job_id)
    redis.call('HINCRBY', counts, outcome == 'again' and 'handed_again' or 'dead', 1)
    -- In the record if it was written so before the payload had a key of its own.
    local payload = rec[4] or redis.call('GET', ARGV[7] .. job_id) or ''
    for _, v in ipairs({outcome, job_id, tenant, rec[3] or '', payload, rec[5] or '0',
      rec[6] or '0', made}) do
      table.insert(out, v)
    end
  end
end
return out

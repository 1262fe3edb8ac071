-- Give a dead letter another life: back to the tail of its tenant's queue,
-- state queued, attempts from 0, kept until it finishes again. A job
-- cancelled while queued may have left its entry, with the only copy of its
-- payload, in the queue (the record's 'inline' mark, dispatcher/record.py):
-- marked 2, that entry is no longer the job's place, and the claim that comes
-- to it (always before the id pushed here, behind it in the same queue) only
-- saves the payload to the key.
-- KEYS[1..9] ring context (ring.lua), KEYS[10] job hash, KEYS[11] dead letters (zset),
-- KEYS[12] the job's content (string, may not exist), KEYS[13] the job's payload (string)
-- ARGV[1..3] ring context, ARGV[4] job id
-- Returns {1} when replayed; {0, state} when the job is not dead; {-2} when it
-- has nothing to send (an unreadable SQS message kept as raw text); {-1} if
-- there is no such job.
local ctx = ring_context(KEYS, ARGV)
local job_key, job_id = KEYS[10], ARGV[4]
local rec = redis.call('HMGET', job_key, 'tenant', 'state', 'priority', 'payload', 'inline')
local tenant, state, priority, payload = rec[1], rec[2], rec[3], rec[4]
local in_queue = rec[5] == '1' or rec[5] == '2'
if not tenant then
  redis.call('ZREM', KEYS[11], job_id)
  return {-1}
end
if state ~= 'dead' then
  return {0, state}
end
-- In the record if it was written so before the payload had a key of its own.
if not payload and not in_queue and redis.call('EXISTS', KEYS[13]) == 0 then
  return {-2}
end
local now = now_ms()
redis.call('ZREM', KEYS[11], job_id)
redis.call('HDEL', job_key, 'finished_ms', 'dead_reason', 'cancelled_from')
redis.call('HSET', job_key, 'state', 'queued', 'attempts', 0, 'queued_ms', now, 'replayed_ms', now)
redis.call('HINCRBY', job_key, 'replays', 1)
redis.call('PERSIST', job_key)
redis.call('PERSIST', KEYS[12])
redis.call('PERSIST', KEYS[13])
if in_queue then
  redis.call('HSET', job_key, 'inline', 2)
end
push_waiting(ctx, tenant, priority or 'normal', job_id, false)
activate(ctx, tenant, now)
return {1}

-- Jobs were handed to their downstream (SQS): end their leases, keep their
-- in-flight slots until they finish (or, as a floor, for a TTL from now, never
-- shortening one the sender already kept longer), and index
-- them by when they count as stranded unless they show progress first.
-- KEYS[1] leases (zset), KEYS[2] dispatched jobs (zset: job id -> stranded at ms)
-- ARGV[1] job key prefix, ARGV[2] queue key prefix, ARGV[3] in-flight key prefix,
-- ARGV[4] in-flight TTL ms, ARGV[5] stranded after ms, ARGV[6..] job ids
local leases, dispatched = KEYS[1], KEYS[2]
local job_prefix, queue_prefix, inflight_prefix = ARGV[1], ARGV[2], ARGV[3]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expiry = now + tonumber(ARGV[4])
local stranded_at = now + tonumber(ARGV[5])
for i = 6, #ARGV do
  local job_id = ARGV[i]
  local job_key = job_prefix .. job_id
  redis.call('ZREM', leases, job_id)
  local rec = redis.call('HMGET', job_key, 'tenant', 'state', 'priority')
  local tenant, state, priority = rec[1], rec[2], rec[3]
  if tenant then
    if state == 'queued' then
      -- The lease ran out before the hand-off was recorded and the job went
      -- back to its queue: it is in SQS now, so take it out again.
      redis.call('LREM', queue_prefix .. tenant .. ':' .. priority, 1, job_id)
    end
    if state == 'queued' or state == 'claimed' then
      redis.call('HSET', job_key, 'state', 'dispatched', 'dispatched_ms', now)
      -- GT: the sender may have parked the message (touch.lua) before this
      -- hand-off was recorded; its longer expiry stands.
      redis.call('ZADD', inflight_prefix .. tenant, 'GT', expiry, job_id)
      redis.call('ZADD', dispatched, stranded_at, job_id)
    end
  end
end
return now

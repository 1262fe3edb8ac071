-- SES refused a tenant's mail for a fault of its own: hold the tenant, with a
-- backoff that doubles on each fault after a hold ended (not for the other
-- mails of the batch that faulted together), from Redis time. While it is
-- held its mail waits in SQS (one message rechecked when the hold ends, the
-- rest behind it): its in-flight slots and its dispatched jobs' deadlines are
-- kept until the hold ends plus the in-flight TTL, as a park keeps them
-- (dispatcher/touch.lua), or they would lapse under a long hold, letting more
-- of its backlog into SQS and its jobs be taken for lost (dispatcher/reconcile.lua).
-- KEYS[1] the tenant's hold (hash: reason, until_ms, backoff_ms),
-- KEYS[2] the tenant's in-flight set (zset: job id -> expiry ms),
-- KEYS[3] dispatched jobs (zset: job id -> stranded at ms)
-- ARGV[1] reason (ses_<code>), ARGV[2] first backoff (ms), ARGV[3] longest backoff (ms),
-- ARGV[4] in-flight TTL (ms), ARGV[5] stranded this long after a slot's kept expiry (ms)
-- Returns {until_ms, reason, wait_ms}: the hold in force (a running one is kept).
local function keep_slots(until_ms)
  local keep_until = until_ms + tonumber(ARGV[4])
  local stranded_at = keep_until + tonumber(ARGV[5])
  for _, job_id in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
    redis.call('ZADD', KEYS[2], 'XX', 'GT', keep_until, job_id)
    -- XX: only jobs already handed off are in the index (a claimed one is not).
    redis.call('ZADD', KEYS[3], 'XX', 'GT', stranded_at, job_id)
  end
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local held = redis.call('HMGET', KEYS[1], 'until_ms', 'backoff_ms', 'reason')
local until_ms, backoff = tonumber(held[1]), tonumber(held[2])
if until_ms and until_ms > now then
  -- Slots handed off since the hold began are kept as long.
  keep_slots(until_ms)
  return {until_ms, held[3], until_ms - now}
end
local first, most = tonumber(ARGV[2]), tonumber(ARGV[3])
if backoff then
  backoff = math.min(backoff * 2, most)
else
  backoff = first
end
until_ms = now + backoff
redis.call('HSET', KEYS[1], 'reason', ARGV[1], 'until_ms', until_ms, 'backoff_ms', backoff)
-- Forgotten once a longest backoff passed without another fault.
redis.call('PEXPIRE', KEYS[1], backoff + most)
keep_slots(until_ms)
return {until_ms, ARGV[1], backoff}

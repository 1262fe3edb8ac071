-- A tenant's jobs wait downstream for a limit of their worker's: keep every one
-- of its in-flight slots at least until then, not only those of the messages
-- just refused (the rest of its group waits behind them in the FIFO queue). Without this, a long
-- wait (a daily quota) would let the slots expire and the dispatcher hand the
-- tenant's backlog to SQS. The wait is progress: the dispatched jobs among
-- them count as stranded only that much later (dispatcher/reconcile.lua).
-- KEYS[1] the tenant's in-flight set (zset: job id -> expiry ms),
-- KEYS[2] dispatched jobs (zset: job id -> stranded at ms)
-- ARGV[1] keep until (ms), ARGV[2] stranded this long after that (ms)
local stranded_at = tonumber(ARGV[1]) + tonumber(ARGV[2])
for _, job_id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  redis.call('ZADD', KEYS[1], 'XX', 'GT', ARGV[1], job_id)
  -- XX: only jobs already handed off are in the index (a claimed one is not).
  redis.call('ZADD', KEYS[2], 'XX', 'GT', stranded_at, job_id)
end
return 0

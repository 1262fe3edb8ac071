-- A tenant's mail waits in SQS for its quota: keep every one of its in-flight
-- slots at least until then, not only those of the messages just refused (the
-- rest of its group waits behind them in the FIFO queue). Without this, a long
-- wait (a daily quota) would let the slots expire and the dispatcher hand the
-- tenant's backlog to SQS.
-- KEYS[1] the tenant's in-flight set (zset: job id -> expiry ms)
-- ARGV[1] keep until (ms)
for _, job_id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  redis.call('ZADD', KEYS[1], 'XX', 'GT', ARGV[1], job_id)
end
return 0

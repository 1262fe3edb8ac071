-- Enqueue one job: its record and its id at the tail of its tenant's queue.
-- KEYS[1..6] ring context (ring.lua), KEYS[7] job hash, KEYS[8] all-tenants set
-- ARGV[1..3] ring context, ARGV[4] job id, ARGV[5] tenant, ARGV[6] priority,
-- ARGV[7..] the record's other fields, as field, value pairs
-- Returns 1, or 0 if a job with this id already exists (nothing written).
local ctx = ring_context(KEYS, ARGV)
local job_key, job_id, tenant, priority = KEYS[7], ARGV[4], ARGV[5], ARGV[6]
if redis.call('EXISTS', job_key) == 1 then
  return 0
end
local now = now_ms()
redis.call('HSET', job_key, 'tenant', tenant, 'priority', priority, 'state', 'queued',
  'created_ms', now, 'attempts', 0, unpack(ARGV, 7))
redis.call('RPUSH', queue_key(ctx, tenant, priority), job_id)
redis.call('SADD', KEYS[8], tenant)
activate(ctx, tenant, now)
return 1

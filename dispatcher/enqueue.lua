-- Enqueue one job: its record and its id at the tail of its tenant's queue or,
-- when its send time is still to come, in the scheduled set until then.
-- KEYS[1..9] ring context (ring.lua), KEYS[10] job hash, KEYS[11] all-tenants set,
-- KEYS[12] scheduled jobs (zset), KEYS[13] the job's content (string),
-- KEYS[14] (optional) the idempotency key (string)
-- ARGV[1..3] ring context, ARGV[4] job id, ARGV[5] tenant, ARGV[6] priority,
-- ARGV[7] send time in ms (0: now), ARGV[8] idempotency key TTL in seconds,
-- ARGV[9] the content ('': none), ARGV[10..] the record's other fields, as field, value pairs
-- Returns {1, job id} when written; {0, job id} if a job with this id already
-- exists; {2, first job id} if the idempotency key was used already. Only the
-- first writes anything.
local ctx = ring_context(KEYS, ARGV)
local job_key, job_id, tenant, priority = KEYS[10], ARGV[4], ARGV[5], ARGV[6]
local idem_key = KEYS[14]
if idem_key then
  local first = redis.call('GET', idem_key)
  if first then
    return {2, first}
  end
end
if redis.call('EXISTS', job_key) == 1 then
  return {0, job_id}
end
local now = now_ms()
local send_at = tonumber(ARGV[7])
local state = 'queued'
if send_at > now then
  state = 'scheduled'
end
redis.call('HSET', job_key, 'tenant', tenant, 'priority', priority, 'state', state,
  'created_ms', now, 'attempts', 0, unpack(ARGV, 10))
if ARGV[9] ~= '' then
  redis.call('SET', KEYS[13], ARGV[9])
end
if idem_key then
  redis.call('SET', idem_key, job_id, 'EX', tonumber(ARGV[8]))
end
redis.call('SADD', KEYS[11], tenant)
if state == 'scheduled' then
  redis.call('HSET', job_key, 'send_at_ms', send_at)
  redis.call('ZADD', KEYS[12], send_at, job_id)
  -- The new earliest: wake an idle dispatcher, so that it waits for this one.
  if redis.call('ZRANGE', KEYS[12], 0, 0)[1] == job_id then
    wake_dispatchers(ctx)
  end
else
  push_waiting(ctx, tenant, priority, job_id, false)
  activate(ctx, tenant, now)
end
return {1, job_id}

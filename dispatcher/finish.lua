-- A job ended (sent, dead, or done): record it and free its in-flight slot.
-- KEYS[1..9] ring context (ring.lua), KEYS[10] job hash, KEYS[11] leases (zset),
-- KEYS[12] dead letters (zset), KEYS[13] the job's content (string, may not exist),
-- KEYS[14] dispatched jobs (zset, dispatcher/reconcile.lua), KEYS[15] the job's payload (string)
-- ARGV[1..3] ring context, ARGV[4] job id, ARGV[5] final state ('sent', 'dead' or 'suppressed'),
-- ARGV[6] seconds to keep the record (0: forever), ARGV[7..] field, value pairs
-- A sent job gets sent_ms (Redis time, as every stored time).
-- Returns 1; 0 if the job was already sent (nothing changed); -1 if unknown.
local ctx = ring_context(KEYS, ARGV)
local job_key, job_id, final, keep = KEYS[10], ARGV[4], ARGV[5], tonumber(ARGV[6])
-- 'payload': only a record written before the payload had a key of its own
-- has that field (nil, and free, for the rest).
local rec = redis.call('HMGET', job_key, 'tenant', 'state', 'payload')
local tenant, state = rec[1], rec[2]
if not tenant then
  return -1
end
local now = now_ms()
release_slot(ctx, tenant, job_id)
-- Only a claimed job holds a lease (a hand-off ends it, in the same script
-- that marks the job dispatched) and only a dispatched job sits in the
-- dispatched index (the reconciler forgets any other it finds there).
if state == 'dispatched' then
  redis.call('ZREM', KEYS[14], job_id)
else
  redis.call('ZREM', KEYS[11], job_id)
end
if state == 'sent' then
  activate(ctx, tenant, now)
  return 0
end
local fields = {'state', final, 'finished_ms', now}
if final == 'sent' then
  table.insert(fields, 'sent_ms')
  table.insert(fields, now)
end
for i = 7, #ARGV do
  table.insert(fields, ARGV[i])
end
redis.call('HSET', job_key, unpack(fields))
if final == 'sent' and state == 'dead' then
  -- Sent after all (a dead letter replayed, or one that was racing its sender):
  -- it is no dead letter any more.
  redis.call('ZREM', KEYS[12], job_id)
end
if final == 'dead' then
  redis.call('ZADD', KEYS[12], now, job_id)
  if keep > 0 then
    -- Dead letters older than their records' TTL are gone: drop their ids too.
    redis.call('ZREMRANGEBYSCORE', KEYS[12], '-inf', now - keep * 1000)
    redis.call('EXPIRE', KEYS[13], keep)
    redis.call('EXPIRE', KEYS[15], keep)
  end
else
  -- A sent job keeps its metadata only.
  if rec[3] then
    redis.call('HDEL', job_key, 'payload')
  end
  redis.call('DEL', KEYS[13], KEYS[15])
end
if keep > 0 then
  redis.call('EXPIRE', job_key, keep)
end
activate(ctx, tenant, now)
return 1

-- SES refused a tenant's mail for a fault of its own: hold the tenant, with a
-- backoff that doubles on each fault after a hold ended (not for the other
-- mails of the batch that faulted together), from Redis time. While it is
-- held its mail waits in SQS (one message rechecked when the hold ends, the
-- rest behind it); the caller keeps its slots and jobs alive as long
-- (dispatcher/touch.lua, as every hold and park does).
-- KEYS[1] the tenant's hold (hash: reason, until_ms, backoff_ms)
-- ARGV[1] reason (ses_<code>), ARGV[2] first backoff (ms), ARGV[3] longest backoff (ms)
-- Returns {until_ms, reason, wait_ms}: the hold in force (a running one is kept).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local held = redis.call('HMGET', KEYS[1], 'until_ms', 'backoff_ms', 'reason')
local until_ms, backoff = tonumber(held[1]), tonumber(held[2])
if until_ms and until_ms > now then
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
return {until_ms, ARGV[1], backoff}

-- Give back deliveries whose lease ran out (the replica delivering them died or
-- stalled): due again at once, at their endpoints.
-- KEYS[1] ready (zset), KEYS[2] in flight (zset), KEYS[3] busy (hash), KEYS[4] wake (list)
-- ARGV[1] endpoint key prefix, ARGV[2] most deliveries per call
-- Returns how many were given back.
local ready, inflight, busy, wake = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local prefix = ARGV[1]
local now = wh_now()
local expired = redis.call('ZRANGEBYSCORE', inflight, '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
for _, member in ipairs(expired) do
  redis.call('ZREM', inflight, member)
  local endpoint, event_id = string.match(member, '^(%S+) (.+)$')
  if redis.call('HINCRBY', busy, endpoint, -1) <= 0 then
    redis.call('HDEL', busy, endpoint)
  end
  local p = prefix .. endpoint
  if redis.call('HEXISTS', p .. ':body', event_id) == 1 then
    redis.call('ZADD', p .. ':due', now, event_id)
  end
  wh_ready(prefix, ready, wake, endpoint, now)
end
return #expired

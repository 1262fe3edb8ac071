-- Claim due deliveries, fairly over endpoints: at most ARGV[2] in all, and never
-- more in flight at one endpoint than its cap, over every replica. A claimed
-- delivery leaves its endpoint's due set for the in-flight set, under a lease:
-- no other replica delivers it meanwhile; the reaper (reap.lua) gives it back if
-- the lease runs out. An endpoint served goes behind the others due now.
-- KEYS[1] ready (zset), KEYS[2] in flight (zset), KEYS[3] busy (hash)
-- ARGV[1] endpoint key prefix, ARGV[2] most deliveries, ARGV[3] per-endpoint cap,
-- ARGV[4] lease (ms), ARGV[5] most endpoints looked at
-- Returns per delivery: endpoint, event id, body, attempts made, tenant, url,
-- secret, previous secret ('' for none, or once its overlap is over).
local ready, inflight, busy = KEYS[1], KEYS[2], KEYS[3]
local prefix, left, cap, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local now = wh_now()
local out = {}
for _, endpoint in ipairs(redis.call('ZRANGEBYSCORE', ready, '-inf', now, 'LIMIT', 0, tonumber(ARGV[5]))) do
  if left <= 0 then
    break
  end
  local p = prefix .. endpoint
  local e = redis.call('HMGET', p, 'enabled', 'tenant', 'url', 'secret', 'old_secret', 'old_until_ms')
  local taken = tonumber(redis.call('HGET', busy, endpoint) or '0')
  local due = {}
  if e[1] == '1' and taken < cap then
    due = redis.call('ZRANGEBYSCORE', p .. ':due', '-inf', now, 'LIMIT', 0, math.min(cap - taken, left))
  end
  local old = ''
  if e[5] and tonumber(e[6] or 0) > now then
    old = e[5]
  end
  for _, event_id in ipairs(due) do
    redis.call('ZREM', p .. ':due', event_id)
    local body = redis.call('HGET', p .. ':body', event_id)
    if body then
      redis.call('ZADD', inflight, now + lease, endpoint .. ' ' .. event_id)
      taken = taken + 1
      left = left - 1
      local tries = redis.call('HGET', p .. ':tries', event_id) or '0'
      for _, v in ipairs({endpoint, event_id, body, tries, e[2], e[3], e[4], old}) do
        out[#out + 1] = v
      end
    end
  end
  if taken > 0 then
    redis.call('HSET', busy, endpoint, taken)
  end
  local first = redis.call('ZRANGE', p .. ':due', 0, 0, 'WITHSCORES')
  if e[1] ~= '1' or taken >= cap or not first[1] then
    -- Disabled, at its cap, or nothing queued: a settle or an enable brings it back.
    redis.call('ZREM', ready, endpoint)
  elseif tonumber(first[2]) <= now then
    redis.call('ZADD', ready, now, endpoint)
  else
    redis.call('ZADD', ready, first[2], endpoint)
  end
end
return out

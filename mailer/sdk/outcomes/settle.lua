-- What became of one delivery attempt. 'delivered' and 'given_up' end it at the
-- endpoint (the next event of its job becomes due); 'retry' makes it due again
-- ARGV[6] ms from now; 'gone' (410) keeps it and disables the endpoint. Any failure
-- starts the endpoint's failing time if it had none; one that finds it failing
-- for ARGV[9] ms disables it ('failing'); a delivery clears it.
-- KEYS[1] ready (zset), KEYS[2] in flight (zset), KEYS[3] busy (hash), KEYS[4] wake (list)
-- ARGV[1] endpoint key prefix, ARGV[2] endpoint, ARGV[3] event id, ARGV[4] its
-- job id, ARGV[5] outcome, ARGV[6] ms until the retry, ARGV[7] attempts made,
-- ARGV[8] the attempt's record (JSON), ARGV[9] failing time that disables (ms),
-- ARGV[10] attempt records kept
-- Returns the reason the endpoint was disabled now ('gone', 'failing'), '' if it
-- was not; false if the endpoint or the delivery is gone.
local ready, inflight, busy, wake = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local prefix, endpoint, event_id, job_id, outcome = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local p = prefix .. endpoint
local now = wh_now()
if redis.call('ZREM', inflight, endpoint .. ' ' .. event_id) == 1 then
  if redis.call('HINCRBY', busy, endpoint, -1) <= 0 then
    redis.call('HDEL', busy, endpoint)
  end
end
if redis.call('EXISTS', p) == 0 then
  return false
end
redis.call('LPUSH', p .. ':attempts', ARGV[8])
redis.call('LTRIM', p .. ':attempts', 0, tonumber(ARGV[10]) - 1)
if redis.call('HEXISTS', p .. ':body', event_id) == 0 then
  -- Settled already (a lease that ran out, and another replica's attempt).
  wh_ready(prefix, ready, wake, endpoint, now)
  return false
end
local disabled = ''
if outcome == 'delivered' or outcome == 'given_up' then
  wh_done(prefix, endpoint, event_id, job_id, now)
else
  redis.call('HSET', p .. ':tries', event_id, ARGV[7])
  redis.call('ZADD', p .. ':due', now + tonumber(ARGV[6]), event_id)
end
if outcome == 'delivered' then
  redis.call('HDEL', p, 'failing_since_ms')
else
  redis.call('HSETNX', p, 'failing_since_ms', now)
  local since = tonumber(redis.call('HGET', p, 'failing_since_ms'))
  if outcome == 'gone' then
    disabled = 'gone'
  elseif now - since >= tonumber(ARGV[9]) then
    disabled = 'failing'
  end
end
if disabled ~= '' and redis.call('HGET', p, 'enabled') == '1' then
  redis.call('HSET', p, 'enabled', '0', 'disabled_reason', disabled, 'disabled_ms', now)
  redis.call('ZREM', ready, endpoint)
else
  disabled = ''
end
wh_ready(prefix, ready, wake, endpoint, now)
return disabled

-- Prepended (deliveries.script) to the scripts that move webhook deliveries:
-- what an endpoint's queue is, and the two steps every script shares.
--
-- Each endpoint has its own queue (keys <prefix><endpoint>:<part>, MailKeys.webhook_part):
-- 'body' (hash: event id -> the body to deliver), 'pending' (zset: event id -> the
-- event's time), 'due' (zset: the event ids whose turn it is -> when, ms), 'tail'
-- (hash: job id -> the last of its events queued here), 'next' (hash: event id ->
-- the next event of its job), 'tries' (hash: event id -> attempts made).
--
-- Events of one job are a chain: only the first one not yet delivered (or given
-- up) is ever due, the next one becomes due when it is done. So an endpoint gets
-- a job's events in order, while its other jobs' events go on meanwhile.
-- The ready set (zset: endpoint -> when its next delivery is due) holds the
-- endpoints a delivery loop should look at; the claim drops those with nothing
-- due, disabled, or at their concurrency cap, and a settle puts them back.

local function wh_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Queue an event at an endpoint, behind the earlier events of its job still there.
-- Returns 1, or 0 when the event is queued there already.
local function wh_enqueue(prefix, ready, endpoint, event_id, job_id, body, event_ms, now)
  local p = prefix .. endpoint
  if redis.call('HSETNX', p .. ':body', event_id, body) == 0 then
    return 0
  end
  redis.call('ZADD', p .. ':pending', event_ms, event_id)
  local tail = redis.call('HGET', p .. ':tail', job_id)
  redis.call('HSET', p .. ':tail', job_id, event_id)
  if tail then
    redis.call('HSET', p .. ':next', tail, event_id)
  else
    redis.call('ZADD', p .. ':due', now, event_id)
    redis.call('ZADD', ready, 'LT', now, endpoint)
  end
  return 1
end

-- An event is done at an endpoint (delivered, or given up): forget it, and make
-- the next event of its job due.
local function wh_done(prefix, endpoint, event_id, job_id, now)
  local p = prefix .. endpoint
  redis.call('HDEL', p .. ':body', event_id)
  redis.call('ZREM', p .. ':pending', event_id)
  redis.call('ZREM', p .. ':due', event_id)
  redis.call('HDEL', p .. ':tries', event_id)
  local following = redis.call('HGET', p .. ':next', event_id)
  if following then
    redis.call('HDEL', p .. ':next', event_id)
    redis.call('ZADD', p .. ':due', now, following)
  elseif redis.call('HGET', p .. ':tail', job_id) == event_id then
    redis.call('HDEL', p .. ':tail', job_id)
  end
end

-- Put an enabled endpoint with something queued back among the ready ones, and
-- wake a delivery loop to look again when its next delivery is due (it may be
-- waiting for a later one, or for a moment).
local function wh_ready(prefix, ready, wake, endpoint, now)
  local p = prefix .. endpoint
  if redis.call('HGET', p, 'enabled') ~= '1' then
    return
  end
  local first = redis.call('ZRANGE', p .. ':due', 0, 0, 'WITHSCORES')
  if first[1] then
    redis.call('ZADD', ready, 'LT', first[2], endpoint)
    redis.call('LPUSH', wake, '1')
    redis.call('LTRIM', wake, 0, 0)
  end
end

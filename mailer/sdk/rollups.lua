-- Count outcomes in a tenant's day of deliverability counts, and sends in the
-- send history; one call per group of sends or per SES event.
-- KEYS[1] the tenant's rollup prefix (the day's hash is KEYS[1] .. day, the day
--         counted in Redis time, days since 1970), KEYS[2] the tenant's send
--         history, KEYS[3] the global send history
-- ARGV[1] the day hash's TTL in seconds, ARGV[2] recipients sent now (0: the send
--         histories are left alone), ARGV[3..] field, count pairs
--         (field "<provider>:<counter>")
-- Returns the day.
local t = redis.call('TIME')
local now_s = tonumber(t[1])
local day = math.floor(now_s / 86400)
local key = KEYS[1] .. day
-- Counts and TTLs go to redis.call as the text they came as: a number is formatted
-- again for each call (a few thousand instructions each).
for i = 3, #ARGV, 2 do
  redis.call('HINCRBY', key, ARGV[i], ARGV[i + 1])
end
if #ARGV >= 3 then
  -- The day's TTL starts with its first count; later ones need not push it.
  if redis.call('TTL', key) < 0 then
    redis.call('EXPIRE', key, ARGV[1])
  end
end
local sent = tonumber(ARGV[2])
if sent > 0 then
  -- 60 fields at most: minute mod 60 -> "<minute>:<count>"; a slot of an older
  -- minute is that minute's no more, and starts again.
  local minute = math.floor(now_s / 60)
  local slot = tostring(minute % 60)
  for k = 2, 3 do
    local old = redis.call('HGET', KEYS[k], slot)
    local count = sent
    if old then
      local m, c = string.match(old, '^(%d+):(%d+)$')
      if tonumber(m) == minute then
        count = count + tonumber(c)
      end
    end
    redis.call('HSET', KEYS[k], slot, minute .. ':' .. count)
    redis.call('EXPIRE', KEYS[k], '3660')
  end
end
return day

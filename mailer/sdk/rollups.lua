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
local now_s = t[1] + 0
local day = math.floor(now_s / 86400)
-- Numbers made text with string.format('%d'): `..` and tostring() format them
-- as floats, twice the work (each a few thousand instructions).
local key = KEYS[1] .. string.format('%d', day)
-- Counts and TTLs go to redis.call as the text they came as: a number is formatted
-- again for each call (a few thousand instructions each).
local fresh = false
for i = 3, #ARGV, 2 do
  -- A count that comes back as just this call's could be the day's first: then,
  -- and only then, the day's hash may be new (the one writer of these hashes
  -- gives each its TTL in the call that makes it).
  if redis.call('HINCRBY', key, ARGV[i], ARGV[i + 1]) == ARGV[i + 1] + 0 then
    fresh = true
  end
end
if fresh then
  -- The day's TTL starts with its first count; later ones need not push it.
  if redis.call('TTL', key) < 0 then
    redis.call('EXPIRE', key, ARGV[1])
  end
end
local sent = ARGV[2] + 0
if sent > 0 then
  -- 60 fields at most: minute mod 60 -> "<minute>:<count>"; a slot of an older
  -- minute is that minute's no more, and starts again.
  local minute = math.floor(now_s / 60)
  local slot = string.format('%d', minute % 60)
  for k = 2, 3 do
    local old = redis.call('HGET', KEYS[k], slot)
    local count = sent
    local this_minute = false
    if old then
      local m, c = string.match(old, '^(%d+):(%d+)$')
      if m and m + 0 == minute then
        count, this_minute = count + c, true
      end
    end
    redis.call('HSET', KEYS[k], slot, string.format('%d:%d', minute, count))
    if not this_minute then
      -- The history goes an hour after its last minute: pushed at the minute's
      -- first send (then for 3660 s, past the minute's end and the hour after),
      -- not at each send of it, for no reader counts a minute once the hour
      -- has passed it.
      redis.call('EXPIRE', KEYS[k], '3660')
    end
  end
end
return day

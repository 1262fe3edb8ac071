-- Count a tenant's sends, bounces and complaints in sliding windows, and read them.
-- Each window is a hash of BUCKETS buckets ("<index>:s", ":b", ":c") plus running
-- totals ("s", "b", "c") and the oldest live bucket ("lo"); old buckets are dropped
-- on every call, so the totals are always the window's, read in O(1).
-- KEYS[2i-1] window i's hash, KEYS[2i] its base (the window when an operator
--            lifted the guard; may not exist), KEYS[#KEYS] the guard hash
-- ARGV[1] sends (recipients), ARGV[2] bounced recipients, ARGV[3] complaints,
-- ARGV[4] tenant, ARGV[5..] each window's length in seconds, in KEYS order
-- Returns {now_ms, guard state or false, then per window: s, b, c, and the same
--          counted only since the base (what the guard judges)}
local BUCKETS = 48
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local add = {s = tonumber(ARGV[1]), b = tonumber(ARGV[2]), c = tonumber(ARGV[3])}
local names = {'s', 'b', 'c'}
local out = {now, redis.call('HGET', KEYS[#KEYS], ARGV[4])}
local nwin = (#KEYS - 1) / 2
for i = 1, nwin do
  local key, base = KEYS[2 * i - 1], KEYS[2 * i]
  local width = tonumber(ARGV[4 + i]) * 1000 / BUCKETS
  local idx = math.floor(now / width)
  local first = idx - BUCKETS + 1
  local lo = tonumber(redis.call('HGET', key, 'lo'))
  if lo and lo < first then
    if first - lo > BUCKETS then
      redis.call('DEL', key)
    else
      for j = lo, first - 1 do
        for _, n in ipairs(names) do
          local v = redis.call('HGET', key, j .. ':' .. n)
          if v then
            redis.call('HINCRBY', key, n, -tonumber(v))
            redis.call('HDEL', key, j .. ':' .. n)
          end
        end
      end
      redis.call('HSET', key, 'lo', first)
    end
  end
  if add.s + add.b + add.c > 0 then
    if redis.call('HSETNX', key, 'lo', idx) == 0 and tonumber(redis.call('HGET', key, 'lo')) < first then
      redis.call('HSET', key, 'lo', first)
    end
    for _, n in ipairs(names) do
      if add[n] > 0 then
        redis.call('HINCRBY', key, idx .. ':' .. n, add[n])
        redis.call('HINCRBY', key, n, add[n])
      end
    end
    redis.call('PEXPIRE', key, math.ceil(width * (BUCKETS + 1)))
  end
  local totals = redis.call('HMGET', key, 's', 'b', 'c')
  local since = {tonumber(totals[1]) or 0, tonumber(totals[2]) or 0, tonumber(totals[3]) or 0}
  if redis.call('EXISTS', base) == 1 then
    -- Only what came after the lift counts for the guard: bucket by bucket, what
    -- the window holds beyond what it held then.
    since = {0, 0, 0}
    for j = first, idx do
      for k, n in ipairs(names) do
        local now_v = tonumber(redis.call('HGET', key, j .. ':' .. n)) or 0
        local then_v = tonumber(redis.call('HGET', base, j .. ':' .. n)) or 0
        if now_v > then_v then
          since[k] = since[k] + now_v - then_v
        end
      end
    end
  end
  for k = 1, 3 do
    out[#out + 1] = tonumber(totals[k]) or 0
  end
  for k = 1, 3 do
    out[#out + 1] = since[k]
  end
end
return out

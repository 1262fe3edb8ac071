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
-- A window costs one read (HMGET) and one write (HSET) a call; more only when
-- buckets leave it, a bucket starts (its TTL) or a base exists.
local BUCKETS = 48
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local add = {tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])}
local names = {'s', 'b', 'c'}
local out = {now, redis.call('HGET', KEYS[#KEYS], ARGV[4])}
local nwin = (#KEYS - 1) / 2
-- Bases exist only after an operator lifted the guard: one look for them all.
local bases = {}
for i = 1, nwin do
  bases[i] = KEYS[2 * i]
end
local any_base = redis.call('EXISTS', unpack(bases)) > 0
local adding = add[1] + add[2] + add[3] > 0

-- The fields of buckets from..to, in order, each with its three counts.
local function bucket_fields(from, to)
  local fields = {}
  for j = from, to do
    for _, n in ipairs(names) do
      fields[#fields + 1] = j .. ':' .. n
    end
  end
  return fields
end

for i = 1, nwin do
  local key, base = KEYS[2 * i - 1], bases[i]
  local width = tonumber(ARGV[4 + i]) * 1000 / BUCKETS
  local idx = math.floor(now / width)
  local first = idx - BUCKETS + 1
  local got = redis.call('HMGET', key, 'lo', 's', 'b', 'c', idx .. ':s', idx .. ':b', idx .. ':c')
  local lo = tonumber(got[1])
  local totals, held = {}, {}
  for k = 1, 3 do
    totals[k], held[k] = tonumber(got[1 + k]) or 0, tonumber(got[4 + k]) or 0
  end
  local set, changed = {}, {}
  if lo and lo < first then
    if first - lo > BUCKETS then
      redis.call('DEL', key)
      lo, totals, held = nil, {0, 0, 0}, {0, 0, 0}
    else
      local stale = bucket_fields(lo, first - 1)
      local values = redis.call('HMGET', key, unpack(stale))
      local present, dropped = {}, {0, 0, 0}
      for j, v in ipairs(values) do
        if v then
          local k = (j - 1) % 3 + 1
          dropped[k] = dropped[k] + tonumber(v)
          present[#present + 1] = stale[j]
        end
      end
      if #present > 0 then
        redis.call('HDEL', key, unpack(present))
      end
      for k = 1, 3 do
        if dropped[k] > 0 then
          totals[k] = totals[k] - dropped[k]
          changed[k] = true
        end
      end
      lo = first
      set[#set + 1], set[#set + 2] = 'lo', first
    end
  end
  if adding then
    if not lo then
      set[#set + 1], set[#set + 2] = 'lo', idx
    end
    for k, n in ipairs(names) do
      if add[k] > 0 then
        totals[k] = totals[k] + add[k]
        changed[k] = true
        set[#set + 1], set[#set + 2] = idx .. ':' .. n, held[k] + add[k]
      end
    end
  end
  for k, n in ipairs(names) do
    if changed[k] then
      set[#set + 1], set[#set + 2] = n, totals[k]
    end
  end
  if #set > 0 then
    redis.call('HSET', key, unpack(set))
  end
  if adding and held[1] + held[2] + held[3] == 0 then
    -- A new bucket: the key lives until that bucket has left the window (set
    -- in bucket k, the TTL ends after bucket k+BUCKETS began); later writes to
    -- the same bucket need not push it further.
    redis.call('PEXPIRE', key, math.ceil(width * (BUCKETS + 1)))
  end
  local since = {totals[1], totals[2], totals[3]}
  if any_base and redis.call('EXISTS', base) == 1 then
    -- Only what came after the lift counts for the guard: bucket by bucket, what
    -- the window holds beyond what it held then.
    since = {0, 0, 0}
    local fields = bucket_fields(first, idx)
    local now_v, then_v = redis.call('HMGET', key, unpack(fields)), redis.call('HMGET', base, unpack(fields))
    for j = 1, #fields do
      local k = (j - 1) % 3 + 1
      local a, b = tonumber(now_v[j]) or 0, tonumber(then_v[j]) or 0
      if a > b then
        since[k] = since[k] + a - b
      end
    end
  end
  for k = 1, 3 do
    out[#out + 1] = totals[k]
  end
  for k = 1, 3 do
    out[#out + 1] = since[k]
  end
end
return out

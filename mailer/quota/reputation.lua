-- Count a tenant's sends, bounces and complaints in sliding windows, and read them.
-- Each window is a hash of BUCKETS buckets ("<index>:s", ":b", ":c") plus running
-- totals ("s", "b", "c") and the oldest live bucket ("lo"); old buckets are dropped
-- on every call, so the totals are always the window's, read in O(1).
-- KEYS[2i-1] window i's hash, KEYS[2i] its base (the window when an operator
--            lifted the guard; may not exist), KEYS[#KEYS] the guard hash
-- ARGV[1] sends (recipients), ARGV[2] bounced recipients, ARGV[3] complaints,
-- ARGV[4] tenant, ARGV[5..] each window's length in seconds, in KEYS order
-- Returns {now_ms, guard state or false, 1 if a base exists (else 0), then per
--          window: s, b, c, and, only if a base exists, the same counted only since
--          the base (what the guard judges; without a base, s, b and c)}: each reply
--          field costs Redis more than a command's own work, and bases are rare
-- A window costs one read (HMGET) and one write (HSET) a call; more only when
-- buckets leave it, a bucket starts (its TTL) or a base exists.
--
-- Most of a call's cost is Lua's own work, not its commands: a number made text
-- (each `idx .. ':s'` formats idx again, as does a number passed to redis.call),
-- tonumber() (it converts twice; `+ 0` once), and a table grown one field at a
-- time (each growth a rehash; a constructor sizes it once). Hence the shapes below.
local BUCKETS = 48
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local add_s, add_b, add_c = ARGV[1] + 0, ARGV[2] + 0, ARGV[3] + 0
local guard = redis.call('HGET', KEYS[#KEYS], ARGV[4])
local nwin = (#KEYS - 1) / 2
-- Bases exist only after an operator lifted the guard: one look for them all.
local any_base
if nwin == 2 then
  any_base = redis.call('EXISTS', KEYS[2], KEYS[4]) > 0
else
  local bases = {}
  for i = 1, nwin do
    bases[i] = KEYS[2 * i]
  end
  any_base = redis.call('EXISTS', unpack(bases)) > 0
end
-- Sized for the usual reply (two windows, no base) from the start.
local out
if nwin == 2 and not any_base then
  out = {now, guard, 0, 0, 0, 0, 0, 0, 0}
else
  out = {now, guard, any_base and 1 or 0}
end
local o = 3
local adding = add_s + add_b + add_c > 0

-- The fields of buckets from..to, in order, each with its three counts.
local function bucket_fields(from, to)
  local fields = {}
  for j = from, to do
    local p = string.format('%d:', j)
    fields[#fields + 1], fields[#fields + 2], fields[#fields + 3] = p .. 's', p .. 'b', p .. 'c'
  end
  return fields
end

for i = 1, nwin do
  local key = KEYS[2 * i - 1]
  local width = ARGV[4 + i] * 1000 / BUCKETS
  local idx = math.floor(now / width)
  local first = idx - BUCKETS + 1
  -- The current bucket's fields, its index made text once.
  local p = string.format('%d:', idx)
  local fs, fb, fc = p .. 's', p .. 'b', p .. 'c'
  local got = redis.call('HMGET', key, 'lo', 's', 'b', 'c', fs, fb, fc)
  local lo = got[1]
  if lo then lo = lo + 0 end
  local s, b, c = (got[2] or 0) + 0, (got[3] or 0) + 0, (got[4] or 0) + 0
  -- The current bucket's counts stay text until one is added to (most calls add
  -- sends only): whether the bucket is new needs none of them as numbers.
  local hs, hb, hc = got[5], got[6], got[7]
  local new_bucket = not (hs or hb or hc)
  -- Room for the common write (a bucket's count and its total) from the start.
  local set, n = {false, false, false, false}, 0
  local cs, cb, cc = false, false, false
  if lo and lo < first then
    if first - lo > BUCKETS then
      redis.call('DEL', key)
      lo, s, b, c, hs, hb, hc, new_bucket = nil, 0, 0, 0, false, false, false, true
    else
      local stale = bucket_fields(lo, first - 1)
      local values = redis.call('HMGET', key, unpack(stale))
      local present, dropped = {}, {0, 0, 0}
      for j, v in ipairs(values) do
        if v then
          local k = (j - 1) % 3 + 1
          dropped[k] = dropped[k] + v
          present[#present + 1] = stale[j]
        end
      end
      if #present > 0 then
        redis.call('HDEL', key, unpack(present))
      end
      if dropped[1] > 0 then s, cs = s - dropped[1], true end
      if dropped[2] > 0 then b, cb = b - dropped[2], true end
      if dropped[3] > 0 then c, cc = c - dropped[3], true end
      lo = first
      set[n + 1], set[n + 2], n = 'lo', first, n + 2
    end
  end
  if adding then
    if not lo then
      set[n + 1], set[n + 2], n = 'lo', idx, n + 2
    end
    if add_s > 0 then
      s, cs = s + add_s, true
      set[n + 1], set[n + 2], n = fs, (hs or 0) + add_s, n + 2
    end
    if add_b > 0 then
      b, cb = b + add_b, true
      set[n + 1], set[n + 2], n = fb, (hb or 0) + add_b, n + 2
    end
    if add_c > 0 then
      c, cc = c + add_c, true
      set[n + 1], set[n + 2], n = fc, (hc or 0) + add_c, n + 2
    end
  end
  if cs then set[n + 1], set[n + 2], n = 's', s, n + 2 end
  if cb then set[n + 1], set[n + 2], n = 'b', b, n + 2 end
  if cc then set[n + 1], set[n + 2], n = 'c', c, n + 2 end
  if n > 0 then
    redis.call('HSET', key, unpack(set, 1, n))
  end
  if adding and new_bucket then
    -- A new bucket: the key lives until that bucket has left the window (set
    -- in bucket k, the TTL ends after bucket k+BUCKETS began); later writes to
    -- the same bucket need not push it further.
    redis.call('PEXPIRE', key, math.ceil(width * (BUCKETS + 1)))
  end
  if not any_base then
    out[o + 1], out[o + 2], out[o + 3], o = s, b, c, o + 3
  elseif redis.call('EXISTS', KEYS[2 * i]) == 1 then
    -- Only what came after the lift counts for the guard: bucket by bucket, what
    -- the window holds beyond what it held then.
    local since = {0, 0, 0}
    local fields = bucket_fields(first, idx)
    local now_v, then_v = redis.call('HMGET', key, unpack(fields)), redis.call('HMGET', KEYS[2 * i], unpack(fields))
    for j = 1, #fields do
      local k = (j - 1) % 3 + 1
      local x, y = (now_v[j] or 0) + 0, (then_v[j] or 0) + 0
      if x > y then
        since[k] = since[k] + x - y
      end
    end
    out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] = s, b, c, since[1], since[2], since[3]
    o = o + 6
  else
    out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] = s, b, c, s, b, c
    o = o + 6
  end
end
return out

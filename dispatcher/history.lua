-- Prepended (calls.script) to finish.lua, history_read.lua and history_outcome.lua:
-- the history of finished jobs (dispatcher/history.py). A sent job's record is
-- kept whole for a short while (its detail TTL); what is read of it after that
-- is one field of a day's bucket, a hash with a TTL: the field is the job id,
-- its value a short line (history_line) of the record fields its kind names
-- (Keys.history_fields, packed in ARGV: history_layout). A job id's bucket is one
-- of the day's N (its SHA-1 picks it), N the number the day's first line
-- wrote in the days map (a hash: day -> N, and '<day>:n' -> the lines written
-- that day), so that a reader finds every day's buckets. N is sized from the
-- day before's lines, HISTORY_LINES_A_BUCKET a bucket (at least the setting's N):
-- a bucket then stays a listpack (Redis's hash-max-listpack-entries, 512 by
-- default) on a day up to twice as busy. The buckets' names are built here, in
-- the days map's hash slot (its tag): a pool's or a cluster's.

local HISTORY_LINES_A_BUCKET = 256

-- A table with room for n values, made at once: one grown a value at a time is
-- made anew at each power of two. (Room for a few thousand at most: unpack's
-- stack; past them it grows.)
local NO_VALUES = {}
local function sized_table(n)
  return {unpack(NO_VALUES, 1, math.min(n, 4000))}
end

-- The fields a line keeps, in its order after version, state and tenant, as
-- Keys.history_fields packs them: 'name,default,after;...' (after: '1' for a time
-- kept as the ms after created_ms). names[i] is the line's (3 + i)th part, index
-- its inverse; default[i] what a line leaves out of it, after[i] whether it is
-- such a time. Arrays, not maps by name: a table's keys set one by one were
-- most of what reading the layout cost a call.
local function history_layout(packed)
  local names, default, after, index = {}, {}, {}, {}
  local n = 0
  for name, d, a in string.gmatch(packed, '([^,;]+),([^,;]*),([^,;]*)') do
    n = n + 1
    names[n], default[n], after[n], index[name] = name, d, a == '1', n
  end
  return {names = names, default = default, after = after, index = index, line = {},
    created = index['created_ms']}
end

-- The same layout, given in ARGV from `at` as its fields' N names, then their N
-- defaults, then N afters ('1' or ''): taken as they are, not parsed (gmatch
-- over the packed layout cost a finish some 23,000 instructions more a call).
-- Its tables are made their size at once (a table grown a key at a time is
-- made anew at each power of two).
local function history_layout_args(argv, at, n)
  local names = {unpack(argv, at, at + n - 1)}
  local after, created = {unpack(argv, at + 2 * n, at + 3 * n - 1)}, nil
  for i = 1, n do
    after[i] = after[i] == '1'
    if names[i] == 'created_ms' then
      created = i
    end
  end
  return {names = names, default = {unpack(argv, at + n, at + 2 * n - 1)}, after = after,
    n = n, created = created}
end

local function history_bucket(prefix, day, shards, job_id)
  local shard = tonumber(string.sub(redis.sha1hex(job_id), 1, 8), 16) % tonumber(shards)
  return prefix .. day .. ':' .. shard
end

-- The context of a call that writes lines: nil when the call keeps no history
-- (its bucket prefix is ''). ARGV from `at`: the buckets' prefix, the seconds a
-- sent job's record stays whole, the buckets a day, the number L of the line's
-- fields, then the fields (history_layout_args: 3L). `keep`: the history's TTL.
-- The day's first line: its number of buckets, from the day before's lines; and
-- the days whose buckets have all expired leave the map.
local function history_new_day(days_key, day, least, keep)
  local before = tonumber(redis.call('HGET', days_key, (day - 1) .. ':n') or '0')
  local shards = math.max(least, math.ceil(before / HISTORY_LINES_A_BUCKET))
  if redis.call('HSETNX', days_key, day, shards) == 0 then
    return redis.call('HGET', days_key, day)
  end
  local oldest = day - math.ceil(keep / 86400) - 1
  for _, field in ipairs(redis.call('HKEYS', days_key)) do
    if tonumber(string.match(field, '^%d+')) < oldest then
      redis.call('HDEL', days_key, field)
    end
  end
  return string.format('%d', shards)
end

local function history_context(days_key, argv, at, now, keep)
  local prefix, n = argv[at], argv[at + 3] + 0
  local next_at = at + 4 + 3 * n
  if prefix == '' then
    return nil, next_at
  end
  local day = math.floor(now / 86400000)
  local shards = redis.call('HGET', days_key, day)
  if not shards then
    shards = history_new_day(days_key, day, tonumber(argv[at + 2]), keep)
  end
  -- A bucket lives `keep` past its day's end: its last line's retention.
  local ttl = string.format('%d', keep + (day + 1) * 86400 - math.floor(now / 1000))
  -- The call's lines by bucket (history_add: by the bucket's number + 1), each
  -- bucket's as field, value pairs, in the order first written (history_write).
  local h = {prefix = prefix, detail = argv[at + 1], day = day, shards = shards, ttl = ttl,
    days = days_key, added = 0, layout = history_layout_args(argv, at + 4, n),
    buckets = {}, lines = sized_table(shards + 0), n_shards = shards + 0}
  return h, next_at
end

-- Times after created_ms are kept as ms after it: shorter.
local function history_after(t, base)
  if not t or not base then
    return ''
  end
  return string.format('%d', tonumber(t) - tonumber(base))
end

-- A field's value as a line keeps it: '' for none or its default, a time after
-- created_ms as the ms after `created` (the record's created_ms). `i`: the
-- field's place in the layout.
local function history_value(layout, i, v, created)
  if not v or v == layout.default[i] then
    return ''
  elseif layout.after[i] then
    return history_after(v, created)
  end
  return v
end

-- The job's line: '1' (the layout), state, tenant, then the layout's fields, from
-- `values` (values[i] is layout.names[i], as the record has it, and is made
-- what the line keeps of it, in place), each as history_value gives it. Written
-- out here, the fewest Lua steps a field (a field's steps, in a line a job, are
-- most of the Lua a finish spends on the history): a time after created_ms left
-- a number, which table.concat writes as an integer (below 10^14).
local function history_line(state, tenant, layout, values)
  local default, after, n = layout.default, layout.after, layout.n
  local created = layout.created and values[layout.created]
  -- (Arithmetic converts a string once; tonumber() twice.)
  local base = created and created + 0
  for i = 1, n do
    local v = values[i]
    if not v or v == default[i] then
      values[i] = ''
    elseif after[i] then
      values[i] = base and v - base or ''
    end
  end
  return '1|' .. state .. '|' .. tenant .. '|' .. table.concat(values, '|', 1, n)
end

-- The job's line, written with the call's others (history_write). `hash`: the
-- number history_bucket takes of the job id's SHA-1 (its first 8 hex digits),
-- made by the caller (calls.history_hash).
local function history_add(h, job_id, hash, state, tenant, values)
  -- history_bucket's number, its name made once a call (history_write).
  local bucket = hash % h.n_shards
  local lines = h.lines[bucket + 1]
  local line = history_line(state, tenant, h.layout, values)
  if lines then
    local n = #lines
    lines[n + 1], lines[n + 2] = job_id, line
  else
    h.lines[bucket + 1], h.buckets[#h.buckets + 1] = {job_id, line}, bucket
  end
  h.added = h.added + 1
end

-- The call's lines: one HSET and one EXPIRE a bucket, not a line (a call's
-- jobs share the day, so its buckets' TTL); then the day's count of lines
-- (what sizes the next day's buckets). How many buckets a call's lines fall
-- in follows their random ids: at most one a line.
local function history_write(h)
  if not h or h.added == 0 then
    return
  end
  local day = h.prefix .. h.day .. ':'
  for _, shard in ipairs(h.buckets) do
    local bucket = day .. shard
    redis.call('HSET', bucket, unpack(h.lines[shard + 1]))
    redis.call('EXPIRE', bucket, h.ttl)
  end
  redis.call('HINCRBY', h.days, h.day .. ':n', h.added)
end

-- The job's bucket and line, newest day first; nil if no bucket has it.
local function history_find(days_key, prefix, job_id)
  local days = redis.call('HGETALL', days_key)
  local order = {}
  for i = 1, #days, 2 do
    local day = tonumber(days[i])  -- nil for a day's count ('<day>:n')
    if day then
      order[#order + 1] = {day, days[i + 1]}
    end
  end
  table.sort(order, function(x, y) return x[1] > y[1] end)
  for _, d in ipairs(order) do
    local bucket = history_bucket(prefix, string.format('%d', d[1]), d[2], job_id)
    local line = redis.call('HGET', bucket, job_id)
    if line then
      return bucket, line
    end
  end
  return nil
end

-- Prepended (calls.script) to finish.lua, history_read.lua and history_outcome.lua:
-- the history of sent mail (dispatcher/history.py). A sent mail's record is kept
-- whole for a short while (its detail TTL); what status() and SES events need
-- of it after that is one field of a day's bucket, a hash with a TTL: the field
-- is the job id, its value a short line (history_line). A job id's bucket is one
-- of the day's N (its SHA-1 picks it), N the number the day's first sent mail
-- wrote in the days map (a hash: day -> N), so that a change of N applies from a
-- new day on and a reader finds every day's buckets. The buckets' names are
-- built here, in the days map's hash slot (its tag): a pool's or a cluster's.

-- The record fields a line keeps, in its order after version, state and tenant.
local HISTORY_FIELDS = {
  'priority', 'recipients', 'created_ms', 'dispatched_ms', 'finished_ms', 'attempts',
  'throttled', 'send_seq', 'delivery', 'bounce_type', 'suppressed', 'replays', 'suppressed_reason',
}
local history_index = {}
for i, name in ipairs(HISTORY_FIELDS) do
  history_index[name] = i
end

local function history_bucket(prefix, day, shards, job_id)
  local shard = tonumber(string.sub(redis.sha1hex(job_id), 1, 8), 16) % tonumber(shards)
  return prefix .. day .. ':' .. shard
end

-- The context of a call that writes lines: nil when the call keeps no history
-- (its bucket prefix is ''). ARGV from `at`: the buckets' prefix, the seconds a
-- sent mail's record stays whole, the buckets a day. `keep`: the history's TTL.
local function history_context(days_key, argv, at, now, keep)
  local prefix = argv[at]
  if prefix == '' then
    return nil, at + 3
  end
  local day = math.floor(now / 86400000)
  local shards = argv[at + 2]
  if redis.call('HSETNX', days_key, day, shards) == 1 then
    -- The day's first line: days whose buckets have all expired leave the map.
    local oldest = day - math.ceil(keep / 86400) - 1
    for _, d in ipairs(redis.call('HKEYS', days_key)) do
      if tonumber(d) < oldest then
        redis.call('HDEL', days_key, d)
      end
    end
  else
    shards = redis.call('HGET', days_key, day)
  end
  -- A bucket lives `keep` past its day's end: its last line's retention.
  local ttl = string.format('%d', keep + (day + 1) * 86400 - math.floor(now / 1000))
  return {prefix = prefix, detail = argv[at + 1], day = day, shards = shards, ttl = ttl, touched = {}}, at + 3
end

-- Times after created_ms are kept as ms after it: shorter.
local function history_after(t, base)
  if not t or not base then
    return ''
  end
  return string.format('%d', tonumber(t) - tonumber(base))
end

-- The job's line: '1' (the layout), state, tenant, then HISTORY_FIELDS, from
-- `values` (values[at + i] is HISTORY_FIELDS[i], as the record has it), '' for
-- one it lacks.
local function history_line(state, tenant, values, at)
  local line = {'1', state, tenant}
  local created = values[at + 3]
  for i, name in ipairs(HISTORY_FIELDS) do
    local v = values[at + i]
    if v and (name == 'dispatched_ms' or name == 'finished_ms') then
      v = history_after(v, created)
    end
    line[#line + 1] = v or ''
  end
  return table.concat(line, '|')
end

local function history_add(h, job_id, state, tenant, values, at)
  local bucket = history_bucket(h.prefix, h.day, h.shards, job_id)
  redis.call('HSET', bucket, job_id, history_line(state, tenant, values, at))
  if not h.touched[bucket] then
    h.touched[bucket] = true
    redis.call('EXPIRE', bucket, h.ttl)
  end
end

-- The job's bucket and line, newest day first; nil if no bucket has it.
local function history_find(days_key, prefix, job_id)
  local days = redis.call('HGETALL', days_key)
  local order = {}
  for i = 1, #days, 2 do
    order[#order + 1] = {tonumber(days[i]), days[i + 1]}
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

-- A finished job's later outcome on its line in the history (history.lua), unless
-- the line holds a worse one. KEYS[1] the days map; ARGV[1] the buckets' prefix,
-- ARGV[2] the job id, ARGV[3] the line's fields (Keys.history_fields, packed:
-- history_layout), ARGV[4] the number R of the ranked field's values, ARGV[5..4+R]
-- them, least bad first (a value not among them is less bad than any), then
-- field, value pairs to set, the ranked field's first.
-- Returns 1 written, 0 a worse one kept, -1 no line (or one of another layout).
local bucket, line = history_find(KEYS[1], ARGV[1], ARGV[2])
if not bucket then
  return -1
end
local layout = history_layout(ARGV[3])
local r = tonumber(ARGV[4])
local rank = {}
for i = 1, r do
  rank[ARGV[4 + i]] = i
end
local parts = {}
for part in string.gmatch(line .. '|', '([^|]*)|') do
  parts[#parts + 1] = part
end
if parts[1] ~= '1' or #parts ~= 3 + #layout.names then
  return -1
end
local first = 5 + r
local ranked = 3 + layout.index[ARGV[first]]
if (rank[parts[ranked]] or 0) > (rank[ARGV[first + 1]] or 0) then
  return 0
end
local created = layout.created and parts[3 + layout.created]
if created == '' then
  created = nil
end
for i = first, #ARGV, 2 do
  local at = layout.index[ARGV[i]]
  parts[3 + at] = history_value(layout, at, ARGV[i + 1], created)
end
redis.call('HSET', bucket, ARGV[2], table.concat(parts, '|'))
return 1

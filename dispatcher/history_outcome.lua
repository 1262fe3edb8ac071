-- What SES reported of a sent mail, on its line in the history (history.lua),
-- unless the line holds a worse outcome. KEYS[1] the days map; ARGV[1] the
-- buckets' prefix, ARGV[2] the job id, ARGV[3] the outcome, ARGV[4] its bounce
-- type ('' none), ARGV[5..] the outcomes, least bad first.
-- Returns 1 written, 0 a worse one kept, -1 no line.
local bucket, line = history_find(KEYS[1], ARGV[1], ARGV[2])
if not bucket then
  return -1
end
local rank = {}
for i = 5, #ARGV do
  rank[ARGV[i]] = i
end
local parts = {}
for part in string.gmatch(line .. '|', '([^|]*)|') do
  parts[#parts + 1] = part
end
-- The line's delivery and bounce type: 3 + their place in HISTORY_FIELDS.
local delivery, bounce = 3 + 9, 3 + 10
if (rank[parts[delivery]] or 0) > (rank[ARGV[3]] or 0) then
  return 0
end
parts[delivery], parts[bounce] = ARGV[3], ARGV[4]
redis.call('HSET', bucket, ARGV[2], table.concat(parts, '|'))
return 1

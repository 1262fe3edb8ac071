-- Which commands may this connection's user run? (mailer/ops/redis_acl.py)
-- KEYS[1]: a key under fairpost's prefix (the probes' keys are copies of it)
-- ARGV: for each command, its word count N, then N words (name, subcommand, arguments)
-- Returns, for each command: 1 allowed, 0 denied, -1 not checkable from a script.
if not redis.acl_check_cmd then
  return redis.error_reply('ERR no redis.acl_check_cmd before Redis 7.0')
end
local out = {}
local i = 1
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  local words = {}
  for j = 1, n do words[j] = ARGV[i + j] end
  local ok, allowed = pcall(redis.acl_check_cmd, unpack(words))
  if not ok then
    out[#out + 1] = -1
  elseif allowed then
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
  i = i + n + 1
end
return out

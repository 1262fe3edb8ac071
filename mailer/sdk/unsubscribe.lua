-- Unsubscribe an address from one topic of a tenant, or from every topic ('*'),
-- or take that back; an unsubscribe that changed something appends its event to
-- the journal in the same step (mailer/sdk/unsubscribes.py owns the format).
-- KEYS[1] the tenant's unsubscribes (hash: address -> "<topics> <source> <ms>"),
-- KEYS[2] the journal (stream; only with a journal)
-- ARGV[1] address (normalized), ARGV[2] topic ('*': every topic), ARGV[3] 'add' or
-- 'remove', ARGV[4] source, ARGV[5..] the journal (journal.lua), then the event's
-- entry (M, then M field, value pairs)
-- Returns 1 changed, 0 nothing to change, -1 one topic taken back from an address
-- unsubscribed from every topic (take back '*' first).
local journal, at = journal_context(KEYS[2], ARGV, 5)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local address, topic = ARGV[1], ARGV[2]
local current = redis.call('HGET', KEYS[1], address)
local topics = current and string.match(current, '^(%S+)') or nil
local set, names = {}, {}
if topics and topics ~= '*' then
  for name in string.gmatch(topics, '[^,]+') do
    set[name] = true
  end
end
local function write()
  names = {}
  for name in pairs(set) do
    names[#names + 1] = name
  end
  if #names == 0 then
    redis.call('HDEL', KEYS[1], address)
    return
  end
  table.sort(names)
  redis.call('HSET', KEYS[1], address, table.concat(names, ',') .. ' ' .. ARGV[4] .. ' ' .. now)
end
if ARGV[3] == 'add' then
  if topics == '*' or set[topic] then
    return 0
  end
  if topic == '*' then
    redis.call('HSET', KEYS[1], address, '* ' .. ARGV[4] .. ' ' .. now)
  else
    set[topic] = true
    write()
  end
  journal_append(journal, KEYS[1], '', nil, ARGV, at, {}, 0)
  journal_trim(journal, now)
  return 1
end
if not topics then
  return 0
end
if topic == '*' then
  redis.call('HDEL', KEYS[1], address)
  return 1
end
if topics == '*' then
  return -1
end
if not set[topic] then
  return 0
end
set[topic] = nil
write()
return 1

-- Delete dead letters for good: record, content, payload and place in the dead set.
-- A job replayed meanwhile (no longer dead) is left alone.
-- KEYS[1] dead letters (zset)
-- ARGV[1] job key prefix, ARGV[2] content key prefix, ARGV[3] payload key
-- prefix, ARGV[4] only this tenant ('': any), ARGV[5..] job ids
-- Returns the number of dead letters deleted.
local dead, job_prefix, content_prefix, payload_prefix = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local only = ARGV[4]
local count = 0
for i = 5, #ARGV do
  local job_id = ARGV[i]
  local rec = redis.call('HMGET', job_prefix .. job_id, 'tenant', 'state')
  if not rec[1] then
    -- Its record expired: only the id was left.
    redis.call('ZREM', dead, job_id)
  elseif rec[2] == 'dead' and (only == '' or rec[1] == only) then
    redis.call('DEL', job_prefix .. job_id, content_prefix .. job_id, payload_prefix .. job_id)
    redis.call('ZREM', dead, job_id)
    count = count + 1
  end
end
return count

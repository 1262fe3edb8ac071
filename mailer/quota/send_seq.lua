-- Number a tenant's accepted mail in send order, for "bounces among its last N sends",
-- and index each mail's SES message id, by which SES events find the job: a group's
-- sends in one call. One script with the sender's record of the send, never a plain
-- SET: a full Redis (noeviction) refuses plain writes, and lets a script that has
-- written finish (dispatcher/scripts.py), so the record of a send is never refused
-- half-way.
-- KEYS[1]     the tenant's send counter (string); then for each mail i, in send order:
-- KEYS[2i]    its job's record (hash), KEYS[2i+1] its SES message id's index (string:
--             the job id)
-- ARGV[1]     how long the counter lives after these sends (ms: the job TTL, past
--             which no SES event can find the mail)
-- ARGV[2]     how long each index lives (seconds: FAIRPOST_SES_INDEX_TTL)
-- ARGV[2i+1]  mail i's recipients, ARGV[2i+2] its job id
-- Each recipient takes one number; a job records its last one (send_seq).
-- Returns each job's send_seq, in order.
local count = (#KEYS - 1) / 2
local total = 0
for i = 1, count do
  total = total + ARGV[2 * i + 1]
end
-- One INCRBY for the group: its numbers are consecutive, in send order.
local seq = redis.call('INCRBY', KEYS[1], total) - total
redis.call('PEXPIRE', KEYS[1], ARGV[1])
local out = {}
for i = 1, count do
  redis.call('SET', KEYS[2 * i + 1], ARGV[2 * i + 2], 'EX', ARGV[2])
  seq = seq + ARGV[2 * i + 1]
  if redis.call('EXISTS', KEYS[2 * i]) == 1 then
    redis.call('HSET', KEYS[2 * i], 'send_seq', string.format('%d', seq))
  end
  out[i] = seq
end
return out

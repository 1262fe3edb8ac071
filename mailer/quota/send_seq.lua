-- Number a tenant's accepted mail in send order, for "bounces among its last N sends",
-- and index its SES message id, by which SES events find the job. One script with
-- the sender's record of the send, never a plain SET: a full Redis (noeviction)
-- refuses plain writes, and lets a script that has written finish
-- (dispatcher/scripts.py), so the record of a send is never refused half-way.
-- KEYS[1] the tenant's send counter (string), KEYS[2] the job's record (hash),
-- KEYS[3] the SES message id's index (string: the job id)
-- ARGV[1] the mail's recipients, ARGV[2] how long the counter lives after this send
--         (ms: the job TTL, past which no SES event can find the mail), ARGV[3] the
--         job id, ARGV[4] how long the index lives (seconds: FAIRPOST_SES_INDEX_TTL)
-- Each recipient takes one number; the job records its last one (send_seq).
-- Returns the job's send_seq.
redis.call('SET', KEYS[3], ARGV[3], 'EX', tonumber(ARGV[4]))
local seq = redis.call('INCRBY', KEYS[1], tonumber(ARGV[1]))
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('HSET', KEYS[2], 'send_seq', seq)
end
return seq

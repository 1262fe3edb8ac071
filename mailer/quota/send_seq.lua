-- Number a tenant's accepted mail in send order, for "bounces among its last N sends".
-- KEYS[1] the tenant's send counter (string), KEYS[2] the job's record (hash)
-- ARGV[1] the mail's recipients, ARGV[2] how long the counter lives after this send
--         (ms: the job TTL, past which no SES event can find the mail)
-- Each recipient takes one number; the job records its last one (send_seq).
-- Returns the job's send_seq.
local seq = redis.call('INCRBY', KEYS[1], tonumber(ARGV[1]))
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('HSET', KEYS[2], 'send_seq', seq)
end
return seq

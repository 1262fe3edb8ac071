-- A permanent bounce among a tenant's last N sends (numbered by send_seq.lua).
-- KEYS[1] the tenant's send counter (string), KEYS[2] its recent bounces (zset:
--         "<job id>:<i>" scored by the bounced mail's send number)
-- ARGV[1] the job id, ARGV[2] the mail's send number (0: unknown, counted as the
--         latest), ARGV[3] bounced recipients, ARGV[4] N, ARGV[5] how long the bounces
--         live after this one (ms: the job TTL, as the send counter)
-- Returns {bounces among the last N sends, sends so far}.
local now = tonumber(redis.call('GET', KEYS[1]) or '0')
local seq = tonumber(ARGV[2])
if seq <= 0 then
  seq = now
end
local n = tonumber(ARGV[4])
for i = 1, tonumber(ARGV[3]) do
  -- One member per bounced recipient of the job: a repeated event adds nothing.
  redis.call('ZADD', KEYS[2], seq, ARGV[1] .. ':' .. i)
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - n)
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[5]))
end
return {redis.call('ZCOUNT', KEYS[2], now - n + 1, '+inf'), now}

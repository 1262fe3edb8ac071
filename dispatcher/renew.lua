-- Jobs this replica still holds (a worker is busy with them): push their
-- leases a lease further, and their in-flight slots as far, where a slot ends
-- sooner (a claim gives it the lease's end plus the in-flight TTL, claim.lua;
-- an earlier version gave it the lease's end). A live
-- replica's claim must never be reaped and handed out twice; a dead replica
-- stops renewing, so its claims still come back after one lease.
-- KEYS[1] leases (zset)
-- ARGV[1] job key prefix, ARGV[2] in-flight key prefix, ARGV[3] lease ms, ARGV[4..] job ids
-- Returns how many leases were renewed (a job already handed off or reaped is skipped).
local leases = KEYS[1]
local job_prefix, inflight_prefix = ARGV[1], ARGV[2]
local t = redis.call('TIME')
local deadline = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[3])
local renewed = 0
for i = 4, #ARGV do
  local job_id = ARGV[i]
  if redis.call('ZADD', leases, 'XX', 'GT', 'CH', deadline, job_id) == 1 then
    renewed = renewed + 1
    local tenant = redis.call('HGET', job_prefix .. job_id, 'tenant')
    if tenant then
      redis.call('ZADD', inflight_prefix .. tenant, 'XX', 'GT', deadline, job_id)
    end
  end
end
return renewed

-- Give claimed jobs back to the head of their queues: a worker could not take
-- them, or the dispatcher is shutting down. Jobs whose lease is already gone
-- (reaped, handed off) are left alone.
-- KEYS[1..9] ring context (ring.lua), KEYS[10] leases (zset)
-- ARGV[1..3] ring context, ARGV[4] job key prefix, ARGV[5..] job ids in claim order
local ctx = ring_context(KEYS, ARGV)
local now = now_ms()
local count = 0
-- Last first: each goes to the head of its queue, so the first ends up first.
for i = #ARGV, 5, -1 do
  local job_id = ARGV[i]
  if redis.call('ZREM', KEYS[10], job_id) == 1 then
    return_to_queue(ctx, ARGV[4] .. job_id, job_id, now)
    count = count + 1
  end
end
if count > 0 then
  drop_lone_anchor(KEYS[10])
end
return count

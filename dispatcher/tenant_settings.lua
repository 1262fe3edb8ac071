-- Publish per-tenant weights and caps, exactly these: each hash replaced whole.
-- A script, not a MULTI: Redis refuses a whole MULTI once used_memory is over
-- maxmemory (noeviction), and a daemon must start on a full Redis to drain it.
-- The DEL comes first: it frees memory, and a script that has written may go on
-- writing (docs/design.md, "Redis memory").
-- KEYS[1] weights (hash: tenant -> weight), KEYS[2] caps (hash: tenant -> cap)
-- ARGV[1] the number N of weight pairs, then N tenant, weight pairs, then the
-- tenant, cap pairs
redis.call('DEL', KEYS[1], KEYS[2])
local n = tonumber(ARGV[1])
if n > 0 then
  redis.call('HSET', KEYS[1], unpack(ARGV, 2, 1 + 2 * n))
end
if #ARGV > 1 + 2 * n then
  redis.call('HSET', KEYS[2], unpack(ARGV, 2 + 2 * n, #ARGV))
end
return n

-- An operator resumes a paused tenant: it leaves the paused set and, if it
-- has waiting jobs and a free in-flight slot, rejoins the ring at once (and
-- wakes idle dispatchers); with no free slot it waits in the blocked set.
-- KEYS[1..9] ring context (ring.lua)
-- ARGV[1..3] ring context, ARGV[4] tenant
-- Returns 1 if the tenant was paused, else 0.
local ctx = ring_context(KEYS, ARGV)
local tenant = ARGV[4]
local was_paused = redis.call('SREM', ctx.paused, tenant)
activate(ctx, tenant, now_ms())
return was_paused

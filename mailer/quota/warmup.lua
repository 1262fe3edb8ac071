-- Tenants' places in their warm-up plans (mailer/quota/warmup.py), at the Redis server's time.
--
-- KEYS[1]  hash: tenant -> its place (JSON: plan, source, started_ms, step, entered_ms, held...)
-- KEYS[2]  set: tenants a default plan no longer starts for, and "~" once seeded
-- KEYS[3]  set: every tenant that ever enqueued (Keys.tenants)
-- ARGV[1]  operation, then its arguments:
--   seed                        put every tenant that ever enqueued in KEYS[2], once
--                               (the first time a default plan runs): returns 1 if it did
--   start TENANT PLAN           a tenant the sender meets: its place if it warms up; else,
--                               if it was never seen, it is now, and with PLAN ("": none)
--                               it starts that plan now (returns the place); false otherwise
--   set TENANT PLAN SOURCE      the tenant starts PLAN now (returns the place)
--   restart TENANT              the tenant's plan starts over now (its place; false if none)
--   skip TENANT                 the tenant's warm-up ends (1 if it had one)
--   cas TENANT OLD NEW          replace the place OLD by NEW ("": delete) if it is still OLD:
--                               1 if it was, 0 if another replica or an operator changed it

local places, known, tenants = KEYS[1], KEYS[2], KEYS[3]
local op, tenant = ARGV[1], ARGV[2]

local function now_ms()
    local time = redis.call("TIME")
    return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

-- A new place: the plan's first step, from now.
local function place(plan, source)
    local now = now_ms()
    return string.format(
        '{"plan":%s,"source":%s,"started_ms":%d,"step":0,"entered_ms":%d}',
        cjson.encode(plan), cjson.encode(source), now, now
    )
end

if op == "seed" then
    if redis.call("SISMEMBER", known, "~") == 1 then
        return 0
    end
    if redis.call("EXISTS", tenants) == 1 then
        redis.call("SUNIONSTORE", known, known, tenants)
    end
    redis.call("SADD", known, "~")
    return 1
end

if op == "start" then
    local current = redis.call("HGET", places, tenant)
    if current then
        return current
    end
    if redis.call("SADD", known, tenant) == 0 or ARGV[3] == "" then
        return false
    end
    local new = place(ARGV[3], "default")
    redis.call("HSET", places, tenant, new)
    return new
end

if op == "set" then
    local new = place(ARGV[3], ARGV[4])
    redis.call("HSET", places, tenant, new)
    redis.call("SADD", known, tenant)
    return new
end

if op == "restart" then
    local current = redis.call("HGET", places, tenant)
    if not current then
        return false
    end
    local old = cjson.decode(current)
    local new = place(old.plan, old.source)
    redis.call("HSET", places, tenant, new)
    return new
end

if op == "skip" then
    redis.call("SADD", known, tenant)
    return redis.call("HDEL", places, tenant)
end

if op == "cas" then
    if redis.call("HGET", places, tenant) ~= ARGV[3] then
        return 0
    end
    if ARGV[4] == "" then
        redis.call("HDEL", places, tenant)
    else
        redis.call("HSET", places, tenant, ARGV[4])
    end
    return 1
end

return redis.error_reply("warmup.lua: unknown operation " .. tostring(op))

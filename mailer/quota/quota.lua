-- Sliding-window quotas over bucketed hashes: acquire, peek, refund, usage.
--
-- KEYS[1..n]   one hash per window (Keys.quota): the global windows first, then
--              the tenant's; field = bucket index, value = units counted in it
-- ARGV[1]      operation: "acquire", "peek" (acquire without writing),
--              "refund", "restamp" or "usage"
-- ARGV[2]      time in ms: for acquire, peek and usage the moment to evaluate
--              at, "" for the server's TIME (anything else is a test hook);
--              for refund and restamp the at_ms of the grant
-- ARGV[3]      buckets per window (every caller must use the same value)
-- ARGV[4]      how many of the KEYS are global windows
-- ARGV[5..4+2n] for each key in order: window seconds, window limit
-- ARGV[5+2n..] acquire / peek: the costs of the mails, in order; a "fair"
--              acquire (below) puts the tenant id and its weight first
--              refund / restamp: the one cost to give back / to move
--
-- A fair acquire ("acquire_fair") also takes five more KEYS after the
-- windows, the share state of the global quota: start tags (zset), last
-- seen (zset), weights (hash), the tags of tenants contending (zset) and
-- "binding until" (string: ms, set when someone is refused for global room).
--
-- Returns
--   acquire / peek: {granted, retry_ms, blocked, now_ms}
--       retry_ms: ms until mail number granted+1 fits (0 if all granted,
--       -1 if it can never fit); blocked: 0 none, 1 global, 2 tenant,
--       3 share (the global quota has room, but this tenant is ahead of
--       its weighted share while others wait for it)
--   usage:  {now_ms, count of window 1, count of window 2, ...}
--   refund: {}
--   restamp: {the server time (ms) the units now count from}
--
-- Bucket math. A window of W ms is cut into buckets of width w = floor(W / B)
-- ms (at least 1); bucket i holds the units granted in [i*w, (i+1)*w). At time
-- t the window is the integer ms (t-W, t], whose oldest ms t-W+1 lies in bucket
-- lo = floor((t-W+1) / w). Counting every bucket >= lo counts every unit of the
-- window, plus at most the w-1 ms of bucket lo that precede it: never over the
-- limit, stingy by at most one bucket. Buckets below lo can never count again,
-- so they are deleted; a hash therefore holds at most ceil(W/w)+1 fields (B+1
-- when B divides W, as it does for whole seconds and the default B = 50).

local op = ARGV[1]
local fair_op = op == "acquire_fair"
if fair_op then
    op = "acquire"
end
local buckets = tonumber(ARGV[3])
local global_count = tonumber(ARGV[4])
-- A fair acquire passes its four share keys after the windows.
local window_count = #KEYS - (fair_op and 5 or 0)

local function server_now_ms()
    local time = redis.call("TIME")
    return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

local now
if ARGV[2] == "" then
    now = server_now_ms()
else
    now = tonumber(ARGV[2])
end

-- Lua 5.1 prints large numbers in exponent form; bucket fields must be exact.
local function field(index)
    return string.format("%d", index)
end

local windows = {}
for i = 1, window_count do
    local window_ms = tonumber(ARGV[3 + 2 * i]) * 1000
    local width = math.max(1, math.floor(window_ms / buckets))
    windows[i] = {
        key = KEYS[i],
        scope = (i <= global_count) and 1 or 2,
        window_ms = window_ms,
        limit = tonumber(ARGV[4 + 2 * i]),
        width = width,
        lo = math.floor((now - window_ms + 1) / width),
        current = math.floor(now / width),
    }
end
local rest = 5 + 2 * window_count

-- For refund and restamp, now is the grant's time: its units sit in that
-- moment's bucket, if the bucket still exists (it may have been pruned or
-- expired: then they no longer count anyway). Never below zero.
local function take_back(win, cost)
    local name = field(win.current)
    local held = tonumber(redis.call("HGET", win.key, name))
    if held then
        local left = math.max(0, held - cost)
        if left == 0 then
            redis.call("HDEL", win.key, name)
        else
            redis.call("HSET", win.key, name, field(left))
        end
    end
end

if op == "refund" then
    local cost = tonumber(ARGV[rest])
    for _, win in ipairs(windows) do
        take_back(win, cost)
    end
    return {}
end

if op == "restamp" then
    -- A send SES accepted: its units move from the grant's bucket to the
    -- moment the call returned. SES counts a mail when it arrives, which is
    -- somewhere between the two; counting it from the grant until a window
    -- after the return covers wherever it landed, so a slow call followed by
    -- a fast one cannot put two windows' worth of mail into one at SES.
    local cost = tonumber(ARGV[rest])
    local returned = server_now_ms()
    for _, win in ipairs(windows) do
        take_back(win, cost)
        local index = math.floor(returned / win.width)
        redis.call("HINCRBY", win.key, field(index), cost)
        local ttl = (index + 1) * win.width + win.window_ms - 1 - returned
        if redis.call("PTTL", win.key) < ttl then
            redis.call("PEXPIRE", win.key, ttl)
        end
    end
    return { returned }
end

-- Read a window's buckets that still count at `now`, as two parallel arrays
-- (bucket indices, units) in hash order: only a refusal needs them oldest
-- first (fits_at sorts them then); a grant needs no table per bucket. Also
-- the field names of buckets that never will count again. Buckets above
-- `current` (only if the clock went back) are kept and counted: the safe side.
local function load(win)
    local flat = redis.call("HGETALL", win.key)
    local indices, units, stale, total = {}, {}, {}, 0
    for j = 1, #flat, 2 do
        local index = tonumber(flat[j])
        if index < win.lo then
            stale[#stale + 1] = flat[j]
        else
            local n = tonumber(flat[j + 1])
            indices[#indices + 1] = index
            units[#units + 1] = n
            total = total + n
        end
    end
    return indices, units, stale, total
end

if op == "usage" then
    local result = { now }
    for i, win in ipairs(windows) do
        local _, _, _, total = load(win)
        result[i + 1] = total
    end
    return result
end

-- Weighted sharing of the global quota (start-time fair queuing). Each
-- tenant asking for the global quota carries a start tag: the units it was
-- granted divided by its weight. A tenant refused for want of global room
-- waits; while someone waits, a tenant more than one fair share of the
-- shortest global window ahead of the furthest-behind waiting tenant waits
-- a window too, so contenders get units in proportion to their weights,
-- whichever replica receives what. With nobody waiting, nobody is held back.
local fair = nil
if fair_op and global_count > 0 then
    local base = window_count
    fair = {
        tags = KEYS[base + 1], seen = KEYS[base + 2], weights = KEYS[base + 3], waiting = KEYS[base + 4],
        binding = KEYS[base + 5],
        tenant = ARGV[rest], weight = tonumber(ARGV[rest + 1]),
    }
    rest = rest + 2
    local ref = windows[1]
    for i = 2, global_count do
        if windows[i].window_ms < ref.window_ms then ref = windows[i] end
    end
    fair.ref = ref
    fair.memory_ms = math.max(2000, 2 * ref.window_ms)
    -- Forget tenants that stopped asking.
    local gone = redis.call("ZRANGEBYSCORE", fair.seen, "-inf", "(" .. (now - fair.memory_ms))
    for _, name in ipairs(gone) do
        for _, key in ipairs({ fair.tags, fair.seen, fair.waiting }) do redis.call("ZREM", key, name) end
        redis.call("HDEL", fair.weights, name)
    end

    -- Shares are enforced only while the global quota binds: someone was
    -- refused for want of global room lately. Otherwise nobody waits.
    fair.bound = tonumber(redis.call("GET", fair.binding) or "0") > now
    local own = tonumber(redis.call("ZSCORE", fair.tags, fair.tenant))
    local lowest = redis.call("ZRANGE", fair.tags, 0, 0, "WITHSCORES")
    -- A newcomer starts level with the furthest behind: no credit for idling.
    fair.tag = own or tonumber(lowest[2]) or 0
    -- The furthest-behind waiting tenant other than this one, if any.
    fair.floor = nil
    local behind = redis.call("ZRANGE", fair.waiting, 0, 1, "WITHSCORES")
    for j = 1, #behind, 2 do
        if behind[j] ~= fair.tenant and fair.floor == nil then fair.floor = tonumber(behind[j + 1]) end
    end
    if fair.floor then
        -- A tenant that was waiting keeps what it is owed; one that was not
        -- (it had nothing to send) gets no credit for the quiet time.
        if not redis.call("ZSCORE", fair.waiting, fair.tenant) then
            fair.tag = math.max(fair.tag, fair.floor)
        end
        local weight_sum = fair.weight
        local waiting = redis.call("ZRANGE", fair.waiting, 0, -1)
        for _, name in ipairs(waiting) do
            if name ~= fair.tenant then
                weight_sum = weight_sum + (tonumber(redis.call("HGET", fair.weights, name)) or 1)
            end
        end
        -- One fair share of the reference window, in tag units.
        fair.lead = ref.limit / weight_sum
    end
end

-- acquire / peek
for _, win in ipairs(windows) do
    local indices, units, stale, total = load(win)
    win.indices, win.units, win.total, win.added = indices, units, total, 0
    -- The current bucket is where grants go; give it an entry now so the
    -- retry computation below sees this call's own grants in order.
    local slot
    local newest = win.current
    for j, index in ipairs(indices) do
        if index == win.current then slot = j end
        if index > newest then newest = index end
    end
    if not slot then
        slot = #indices + 1
        indices[slot], units[slot] = win.current, 0
    end
    win.slot, win.newest = slot, newest
    if op == "acquire" then
        -- One field at a time: unpack() of a long list would hit Lua's C stack limit.
        for _, name in ipairs(stale) do
            redis.call("HDEL", win.key, name)
        end
    end
end

-- The earliest ms at which `cost` more units fit in `win`, given what it
-- holds: drop buckets oldest first until the rest leaves room. Dropping every
-- bucket up to index k takes lo >= k+1, i.e. t-W+1 >= (k+1)*w.
local function fits_at(win, cost)
    local indices, units = win.indices, win.units
    local order = {}
    for j = 1, #indices do order[j] = j end
    table.sort(order, function(a, b) return indices[a] < indices[b] end)
    local remaining = win.total
    for _, j in ipairs(order) do
        remaining = remaining - units[j]
        if remaining + cost <= win.limit then
            return (indices[j] + 1) * win.width + win.window_ms - 1
        end
    end
    -- Unreachable while cost <= limit: with every bucket dropped it fits.
    return now
end

local granted, retry_ms, blocked = 0, 0, 0
local stop_for_share = false
for c = rest, #ARGV do
    local cost = tonumber(ARGV[c])
    if fair and fair.floor and fair.bound and fair.tag - fair.floor > fair.lead then
        stop_for_share = true
        break
    end
    local fits = true
    for _, win in ipairs(windows) do
        if win.total + cost > win.limit then fits = false end
    end
    if fits then
        for _, win in ipairs(windows) do
            win.total = win.total + cost
            win.units[win.slot] = win.units[win.slot] + cost
            win.added = win.added + cost
        end
        granted = granted + 1
        if fair then fair.tag = fair.tag + cost / fair.weight end
    else
        -- Windows that fit now keep fitting (counts only fall without grants),
        -- so the mail fits once the latest of the refusing windows frees.
        -- On a tie the global scope is named: it pauses every tenant.
        local never, latest = false, now
        for _, win in ipairs(windows) do
            if cost > win.limit then
                if not never or win.scope < blocked then blocked = win.scope end
                never = true
            elseif not never and win.total + cost > win.limit then
                local at = fits_at(win, cost)
                if at > latest or (at == latest and win.scope < blocked) then
                    latest, blocked = at, win.scope
                end
            end
        end
        if never then retry_ms = -1 else retry_ms = latest - now end
        break
    end
end

if op == "acquire" then
    for _, win in ipairs(windows) do
        if win.added > 0 then
            redis.call("HINCRBY", win.key, field(win.current), win.added)
            -- Idle keys vanish once their newest bucket has left the window:
            -- the newest bucket k stops counting at t = (k+1)*w + W - 1.
            local ttl = (win.newest + 1) * win.width + win.window_ms - 1 - now
            redis.call("PEXPIRE", win.key, ttl)
        end
    end
end

if stop_for_share then
    blocked, retry_ms = 3, fair.ref.window_ms
end

if fair and op == "acquire" then
    if blocked == 2 then
        -- Held back by its own quota: it is not contending for the global one.
        for _, key in ipairs({ fair.tags, fair.seen, fair.waiting }) do redis.call("ZREM", key, fair.tenant) end
        redis.call("HDEL", fair.weights, fair.tenant)
    else
        redis.call("ZADD", fair.tags, fair.tag, fair.tenant)
        redis.call("ZADD", fair.seen, now, fair.tenant)
        redis.call("HSET", fair.weights, fair.tenant, fair.weight)
        -- Granted in full or not, a tenant that asks is contending: its backlog
        -- may sit in SQS, beyond what this batch brought. It stops once it has
        -- not asked for memory_ms (forgotten above).
        redis.call("ZADD", fair.waiting, fair.tag, fair.tenant)
        if blocked == 1 then
            redis.call("SET", fair.binding, now + fair.memory_ms, "PX", fair.memory_ms)
        end
        for _, key in ipairs({ fair.tags, fair.seen, fair.weights, fair.waiting }) do
            redis.call("PEXPIRE", key, fair.memory_ms)
        end
    end
end

return { granted, retry_ms, blocked, now }

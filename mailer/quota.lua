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
-- ARGV[5+2n..] acquire / peek: the costs of the mails, in order
--              refund / restamp: the one cost to give back / to move
--
-- Returns
--   acquire / peek: {granted, retry_ms, blocked, now_ms}
--       retry_ms: ms until mail number granted+1 fits (0 if all granted,
--       -1 if it can never fit); blocked: 0 none, 1 global, 2 tenant
--   usage:  {now_ms, count of window 1, count of window 2, ...}
--   refund, restamp: {}
--
-- Bucket math. A window of W ms is cut into buckets of width w = floor(W / B)
-- ms (at least 1); bucket i holds the units granted in [i*w, (i+1)*w). At time
-- t the window is the integer ms (t-W, t], whose oldest ms t-W+1 lies in bucket
-- lo = floor((t-W+1) / w). Counting every bucket >= lo counts every unit of the
-- window, plus at most the w-1 ms of bucket lo that precede it: never over the
-- limit, stingy by at most one bucket. Buckets below lo can never count again,
-- so they are deleted; a hash therefore holds at most ceil(W/w)+1 fields (B+1
-- when B divides W, as it does for whole seconds and the default B = 20).

local op = ARGV[1]
local buckets = tonumber(ARGV[3])
local global_count = tonumber(ARGV[4])
local window_count = #KEYS

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

if op == "refund" then
    -- now is the grant's time: its units sit in that moment's bucket, if the
    -- bucket still exists (it may have been pruned or expired: nothing to do).
    local cost = tonumber(ARGV[rest])
    for _, win in ipairs(windows) do
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
        local index = math.floor(returned / win.width)
        redis.call("HINCRBY", win.key, field(index), cost)
        local ttl = (index + 1) * win.width + win.window_ms - 1 - returned
        if redis.call("PTTL", win.key) < ttl then
            redis.call("PEXPIRE", win.key, ttl)
        end
    end
    return {}
end

-- Read a window's buckets that still count at `now`, oldest first, and the
-- field names of those that never will again. Buckets above `current` (only
-- if the clock went back) are kept and counted: the safe side.
local function load(win)
    local flat = redis.call("HGETALL", win.key)
    local live, stale, total = {}, {}, 0
    for j = 1, #flat, 2 do
        local index = tonumber(flat[j])
        local units = tonumber(flat[j + 1])
        if index < win.lo then
            stale[#stale + 1] = flat[j]
        else
            live[#live + 1] = { index = index, units = units }
            total = total + units
        end
    end
    table.sort(live, function(a, b) return a.index < b.index end)
    return live, stale, total
end

if op == "usage" then
    local result = { now }
    for i, win in ipairs(windows) do
        local _, _, total = load(win)
        result[i + 1] = total
    end
    return result
end

-- acquire / peek
for _, win in ipairs(windows) do
    local live, stale, total = load(win)
    win.live, win.total, win.added = live, total, 0
    -- The current bucket is where grants go; give it an entry now so the
    -- retry computation below sees this call's own grants in order.
    local slot
    for _, bucket in ipairs(live) do
        if bucket.index == win.current then slot = bucket end
    end
    if not slot then
        slot = { index = win.current, units = 0 }
        live[#live + 1] = slot
        table.sort(live, function(a, b) return a.index < b.index end)
    end
    win.slot = slot
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
    local remaining = win.total
    for _, bucket in ipairs(win.live) do
        remaining = remaining - bucket.units
        if remaining + cost <= win.limit then
            return (bucket.index + 1) * win.width + win.window_ms - 1
        end
    end
    -- Unreachable while cost <= limit: with every bucket dropped it fits.
    return now
end

local granted, retry_ms, blocked = 0, 0, 0
for c = rest, #ARGV do
    local cost = tonumber(ARGV[c])
    local fits = true
    for _, win in ipairs(windows) do
        if win.total + cost > win.limit then fits = false end
    end
    if fits then
        for _, win in ipairs(windows) do
            win.total = win.total + cost
            win.slot.units = win.slot.units + cost
            win.added = win.added + cost
        end
        granted = granted + 1
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
            local newest = win.live[#win.live].index
            local ttl = (newest + 1) * win.width + win.window_ms - 1 - now
            redis.call("PEXPIRE", win.key, ttl)
        end
    end
end

return { granted, retry_ms, blocked, now }

-- Sliding-window quotas over bucketed hashes: what the quota's scripts share.
-- Each operation is a script of its own (acquire.lua, peek.lua, refund.lua,
-- restamp.lua, usage.lua), which the engine (engine.py, quota_script) loads
-- with this file first; this file only defines, and reads its arguments.
--
-- KEYS[1..n]   one hash per window (Keys.quota): the global windows first, then
--              the tenant's; field = bucket index, value = units counted in it
-- ARGV[1]      the operation: "acquire", "acquire_fair" (acquire.lua), "peek",
--              "refund", "restamp" or "usage" (the others read it not: it names
--              the call in MONITOR and the slow log)
-- ARGV[2]      time in ms: for acquire, peek and usage the moment to evaluate
--              at, "" for the server's TIME (anything else is a test hook);
--              for refund and restamp the at_ms of the grant
-- ARGV[3]      buckets per window (every caller must use the same value)
-- ARGV[4]      how many of the KEYS are global windows
-- ARGV[5..4+2n] for each key in order: window seconds, window limit
-- ARGV[5+2n..] acquire / peek: the number of mails, then their costs in
--              order, the last cost given standing for every mail after it (a
--              batch of equal costs is two arguments, not one a mail: each
--              argument is a string Lua makes); a "fair" acquire (below) puts
--              the tenant id and its weight first
--              refund / restamp: the one cost to give back / to move
--
-- An acquire (plain or fair) takes one more KEY, last: its record
-- (Keys.quota_grant, named by the acquire's token). An acquire that counted
-- units keeps its answer there; asked again under the same token (its answer
-- was lost on the way back), it answers that again and counts nothing, its
-- retry_ms made what is left of it.
--
-- A fair acquire ("acquire_fair") also takes four more KEYS after the
-- windows, the share state of the global quota: start tags (zset: tenant ->
-- tag), contending until (zset: tenant -> ms), weights (hash: tenant ->
-- weight, plus "~sum", the sum over every contending tenant, and "~exp", when
-- tags, untils and weights expire) and refused (zset: tenant -> ms until
-- which it counts as refused for global room: its due time, plus DUE_SLACK_MS).
--
-- Returns
--   acquire / peek: {granted, retry_ms, blocked, now_ms, never, binding}
--       retry_ms: ms until mail number granted+1 fits (0 if all granted,
--       -1 if it can never fit); blocked: 0 none, 1 global, 2 tenant,
--       3 share (the global quota has room, but this tenant is ahead of
--       its weighted share while another is refused for global room);
--       never: the index (1-based, in KEYS order) of the window the mail
--       can never fit, 0 if none; binding: the index of the window that
--       refused the first refused mail (the one that frees latest; the
--       never-fitting one), 0 if none did (all granted, or a share refusal)
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
-- so they are deleted; a hash therefore holds at most ceil(W/w)+1 buckets (B+1
-- when B divides W, as it does for whole seconds and the default B = 50).
--
-- Running total. Besides its buckets a window's hash keeps three fields: "n",
-- the sum of every bucket field in it; "lo", an index no bucket field is below;
-- "hi", the newest bucket its TTL covers. So a grant reads a few fields
-- (HMGET) instead of every bucket: the count at t is n less the buckets from
-- "lo" up to lo(t), which are deleted as they leave (usually none, or a few).
-- The TTL covers AHEAD buckets more than the newest (a tenth of the window):
-- a busy key's TTL is set once every AHEAD buckets, not at every new one, and
-- an idle key outlives its last bucket by at most that.
-- Only a refusal reads every bucket (HGETALL), to say when the mail fits, and
-- puts "n" right from them if it ever differs. A hash without "n" has no
-- buckets: every write of a bucket writes "n" with it (no release wrote one
-- without), so it is an empty window, read by no further call.
--
-- Rates and budgets. A window shorter than a minute is a rate: a mail bigger
-- than its limit fits once the window holds nothing else, and goes alone,
-- counted in full (no window ever holds more than max(limit, largest mail)).
-- SES does the same: it accepts a 50-recipient mail at 14/second. A window
-- of a minute or more is a budget: a mail over its limit can never fit.

-- Numbers this script wrote, or its callers pass as numbers: tonumber() of a
-- string converts it twice (it checks, then converts: strtod each time), and
-- a call converts dozens. Arithmetic converts once. (false, a missing field,
-- gives nil, as tonumber does.)
local function num(s)
    if s then
        return s + 0
    end
end

local RATE_MS = 60000

local function server_now_ms()
    local time = redis.call("TIME")
    return num(time[1]) * 1000 + math.floor(num(time[2]) / 1000)
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

local buckets = num(ARGV[3])
local global_count = num(ARGV[4])

-- A window's stale buckets when none left it since the last call (most calls):
-- shared, never written, so that a call builds no list it does not need.
local NO_STALE = {}

-- The first window_count KEYS' windows, and the index of the first ARGV after
-- their lengths and limits.
local function read_windows(window_count)
    -- Every field a window gets is in its table from the start: one added later,
    -- past the table's room, would grow it (a rehash of every field).
    local windows = {}
    for i = 1, window_count do
        local window_ms = num(ARGV[3 + 2 * i]) * 1000
        local width = math.max(1, math.floor(window_ms / buckets))
        windows[i] = {
            key = KEYS[i],
            scope = (i <= global_count) and 1 or 2,
            window_ms = window_ms,
            limit = num(ARGV[4 + 2 * i]),
            width = width,
            lo = math.floor((now - window_ms + 1) / width),
            current = math.floor(now / width),
            rate = window_ms < RATE_MS,
            held = 0, total = 0, added = 0, stale = NO_STALE, current_field = false,
            -- The reply of the read below, when the caller made it already.
            got = false,
        }
    end
    return windows, 5 + 2 * window_count
end

-- HDEL a list of fields, a few at a time: unpack() of a long list would hit
-- Lua's C stack limit.
local function hdel(key, names)
    for j = 1, #names, 100 do
        redis.call("HDEL", key, unpack(names, j, math.min(#names, j + 99)))
    end
end

-- Every bucket of a hash (any index), its sum and its lowest and highest
-- index: for a hash without a running total, and for a refusal.
local function all_buckets(key)
    local flat = redis.call("HGETALL", key)
    local list, sum, low, high = {}, 0, nil, nil
    for j = 1, #flat, 2 do
        local index = tonumber(flat[j])
        if index then
            local units = num(flat[j + 1])
            list[#list + 1] = { index, units, flat[j] }
            sum = sum + units
            if low == nil or index < low then low = index end
            if high == nil or index > high then high = index end
        end
    end
    return list, sum, low, high
end

-- A window's count at `now`: win.total, win.held (units in the current
-- bucket), win.hi, and win.stale, the fields of the buckets below win.lo
-- (deleted when an acquire writes). A refusal's HGETALL is saved in win.list.
-- Buckets above `current` (only if the clock went back) are counted: the safe
-- side. Buckets that left the window since the last call are read by name
-- (the oldest, first in the hash, found at once: a listpack hash looks a field
-- up by scanning, so a field that is not there costs a full scan); if more
-- than GUESS left, every bucket is read (a key written that seldom holds few).
local GUESS = 8
local AHEAD = math.floor(buckets / 10)
local function count(win, room_for)
    win.current_field = win.current_field or field(win.current)
    local got = win.got or redis.call("HMGET", win.key, "n", "lo", "hi", win.current_field)
    local n, lo, hi = num(got[1]), num(got[2]), num(got[3])
    win.held, win.stale = num(got[4]) or 0, NO_STALE
    if room_for and n and lo and hi and n + room_for <= win.limit then
        -- A peek: the total with the buckets that left still in it leaves room
        -- already, so the count without them does too.
        win.total, win.hi = n, hi
        return
    end
    if n == nil or lo == nil or hi == nil then
        -- No key yet (an empty window): nothing to count.
        win.list, win.hi, win.fresh, win.stale, win.total = {}, nil, true, {}, 0
        return
    end
    if lo < win.lo - GUESS and hi >= win.lo then
        local list, sum, _, high = all_buckets(win.key)
        win.list, win.hi, win.fresh, win.stale = list, high, true, {}
        for _, b in ipairs(list) do
            if b[1] < win.lo then
                win.stale[#win.stale + 1] = b[3]
                sum = sum - b[2]
            end
        end
        win.total = sum
        return
    end
    win.hi = hi
    if lo >= win.lo then
        win.total, win.lo_kept = n, lo
    elseif hi < win.lo then
        -- Every bucket has left the window (the key outlived it: a test's clock).
        win.total, win.hi, win.held, win.wipe = 0, nil, 0, true
    else
        -- The buckets from lo up to the window's.
        local names = {}
        for index = lo, win.lo - 1 do names[#names + 1] = field(index) end
        local values = redis.call("HMGET", win.key, unpack(names))
        local stale = {}
        win.stale = stale
        for j, units in ipairs(values) do
            if units then
                n = n - num(units)
                stale[#stale + 1] = names[j]
            end
        end
        win.total, win.moved = n, true
    end
end

-- Give units back to the bucket of `index`, and any number to the bucket of
-- `to` (restamp), keeping the running total. Units whose bucket is gone (pruned
-- or expired) no longer count anyway: nothing is taken back for them, and
-- never below zero.
local function move(win, index, cost, to, now_ms)
    local got
    if to == nil or to == index then
        got = redis.call("HMGET", win.key, "n", "lo", "hi", field(index))
        got[5] = got[4]
    else
        got = redis.call("HMGET", win.key, "n", "lo", "hi", field(index), field(to))
    end
    local n, lo, hi = num(got[1]), num(got[2]), num(got[3])
    local held = num(got[4])
    local taken = held and math.min(held, cost) or 0
    if (to == nil and taken == 0) or (to == index and taken == cost) then
        return
    end
    -- No "n": no key, so no bucket to take from (an empty window).
    local fresh = n == nil or lo == nil or hi == nil
    if fresh then
        n, lo, hi = 0, nil, nil
    end
    local units = {}
    if held then units[index] = held - taken end
    if to then units[to] = (units[to] or num(got[5]) or 0) + cost end
    n = n - taken + (to and cost or 0)
    if n <= 0 then
        -- Nothing left in any bucket.
        redis.call("DEL", win.key)
        return
    end
    local args = { "n", n }
    local grows = to ~= nil and (hi == nil or to > hi)
    if grows then hi = to + AHEAD end
    if grows or fresh then args[#args + 1], args[#args + 2] = "hi", field(hi) end
    local low = lo
    if to ~= nil and (lo == nil or to < lo) then low = to end
    if fresh or low ~= lo then args[#args + 1], args[#args + 2] = "lo", field(low) end
    -- A bucket emptied here stays, at 0, until it leaves the window (an HDEL
    -- saved: it counts for nothing, and is deleted with the others then).
    for at, left in pairs(units) do
        args[#args + 1], args[#args + 2] = field(at), left
    end
    redis.call("HSET", win.key, unpack(args))
    if grows then
        -- Bucket k stops counting at t = (k+1)*w + W - 1.
        redis.call("PEXPIRE", win.key, (hi + 1) * win.width + win.window_ms - 1 - now_ms)
    end
end

-- The mails (ARGV[rest], their number, then their costs): how many, the costs'
-- sum, and a fair acquire's tag should every mail be granted: each cost given
-- read once (a conversion each), the tag summed as grants sum it.
local function asked_of(rest, fair)
    local mails, last = num(ARGV[rest]), #ARGV
    local asked, tagged, cost = 0, fair and fair.tag, 0
    for j = 1, mails do
        if rest + j <= last then cost = num(ARGV[rest + j]) end
        asked = asked + cost
        if tagged then tagged = tagged + cost / fair.weight end
    end
    return mails, asked, tagged
end

-- Which of the mails (ARGV[rest..], as asked_of reads them) fit, from the first: acquire and peek decide
-- alike (the acquire then writes what it granted). fair: an acquire's share state
-- (acquire.lua), or nil; peek: count without writing. Returns granted, retry_ms,
-- blocked, never_index, binding, and whether the share stopped it.
local function decide(windows, rest, fair, peek)
    -- Defined here, not at the top: only acquire and peek use them, and each
    -- closure the top makes costs every call of every quota script.
    -- Whether `cost` more units fit in `win` holding `total`: within the limit,
    -- or, for a rate, alone in an empty window.
    local function room(win, total, cost)
        return total + cost <= win.limit or (win.rate and total == 0)
    end

    -- The earliest ms at which `cost` more units fit in `win`, given what it
    -- holds (this call's grants included, in the current bucket): drop buckets
    -- oldest first until the rest leaves room. Dropping every bucket up to index
    -- k takes lo >= k+1, i.e. t-W+1 >= (k+1)*w. The buckets are read here, the
    -- one time a call needs them all; their sum is the count from now on, should
    -- the running total ever differ.
    local function fits_at(win, cost)
        local list = win.list or all_buckets(win.key)
        local indices, units, total, own = {}, {}, 0, false
        for _, b in ipairs(list) do
            if b[1] >= win.lo then
                local n = b[2]
                if b[1] == win.current then
                    n, own = n + win.added, true
                end
                indices[#indices + 1], units[#units + 1] = b[1], n
                total = total + n
            end
        end
        if not own then
            indices[#indices + 1], units[#units + 1] = win.current, win.added
            total = total + win.added
        end
        if total ~= win.total then
            win.total, win.fresh = total, true
        end
        local order = {}
        for j = 1, #indices do order[j] = j end
        table.sort(order, function(a, b) return indices[a] < indices[b] end)
        local remaining = total
        for _, j in ipairs(order) do
            remaining = remaining - units[j]
            if room(win, remaining, cost) then
                return (indices[j] + 1) * win.width + win.window_ms - 1
            end
        end
        -- Unreachable while the mail can fit: with every bucket dropped it does.
        return now
    end

    local mails, asked, tagged = asked_of(rest, fair)
    for _, win in ipairs(windows) do
        count(win, peek and asked or nil)
        win.added = 0
    end

    local granted, retry_ms, blocked, never_index, binding = 0, 0, 0, 0, 0
    local stop_for_share = false
    -- Units granted now: counted in every window, in the current bucket.
    local function grant(units)
        for _, win in ipairs(windows) do
            win.total = win.total + units
            win.added = win.added + units
        end
    end
    -- Most calls grant every mail they ask for. When the whole batch fits every
    -- window and no share is enforced, each mail would fit in turn: the batch is
    -- granted in one step (mail by mail, the checks were a fifth of a fair
    -- acquire's cost). The share tags still add up mail by mail, as below.
    local first = 1
    local whole = not (fair and fair.lead)
    for _, win in ipairs(windows) do
        if win.total + asked > win.limit then whole = false end
    end
    if whole then
        grant(asked)
        granted = mails
        if fair then fair.tag = tagged end
        first = mails + 1
    end
    local last, cost = #ARGV, 0
    for j = first, mails do
        if rest + j <= last then cost = num(ARGV[rest + j]) end
        if fair and fair.lead and fair.tag - fair.floor > fair.lead then
            stop_for_share = true
            break
        end
        local fits = true
        for _, win in ipairs(windows) do
            if not room(win, win.total, cost) then fits = false end
        end
        if fits then
            grant(cost)
            granted = granted + 1
            if fair then fair.tag = fair.tag + cost / fair.weight end
        else
            -- Windows that fit now keep fitting (counts only fall without grants),
            -- so the mail fits once the latest of the refusing windows frees.
            -- On a tie the global scope is named: it pauses every tenant.
            local never, latest = false, now
            for i, win in ipairs(windows) do
                if cost > win.limit and not win.rate then
                    if not never or win.scope < blocked then blocked, never_index, binding = win.scope, i, i end
                    never = true
                elseif not never and not room(win, win.total, cost) then
                    local at = fits_at(win, cost)
                    if at > latest or (at == latest and win.scope < blocked) then
                        latest, blocked, binding = at, win.scope, i
                    end
                end
            end
            if never then retry_ms = -1 else retry_ms = latest - now end
            break
        end
    end
    return granted, retry_ms, blocked, never_index, binding, stop_for_share
end

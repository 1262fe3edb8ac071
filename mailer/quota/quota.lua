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
--   acquire / peek: {granted, retry_ms, blocked, now_ms, never}
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

local op = ARGV[1]
local fair_op = op == "acquire_fair"
if fair_op then
    op = "acquire"
end
local buckets = num(ARGV[3])
local global_count = num(ARGV[4])
-- A fair acquire passes its four share keys after the windows, and an acquire its record last.
local record = op == "acquire" and KEYS[#KEYS] or nil
local window_count = #KEYS - (fair_op and 4 or 0) - (record and 1 or 0)
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

-- How long an acquire's answer is kept: longer than a sender takes to ask
-- again (its outage back-off, a message's visibility timeout).
local RECORD_MS = 300000
if record then
    local earlier = redis.call("GET", record)
    if earlier then
        local reply = {}
        for value in string.gmatch(earlier, "%S+") do reply[#reply + 1] = tonumber(value) end
        if reply[2] > 0 then
            reply[2] = math.max(1, reply[2] - (now - reply[4]))
        end
        return reply
    end
end

-- A window's stale buckets when none left it since the last call (most calls):
-- shared, never written, so that a call builds no list it does not need.
local NO_STALE = {}
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
        held = 0, total = 0, added = 0, stale = NO_STALE,
    }
end
local rest = 5 + 2 * window_count

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
    local got = redis.call("HMGET", win.key, "n", "lo", "hi", field(win.current))
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

if op == "refund" then
    local cost = num(ARGV[rest])
    for _, win in ipairs(windows) do
        move(win, win.current, cost, nil, now)
    end
    return {}
end

if op == "restamp" then
    -- A send SES accepted: its units move from the grant's bucket to the
    -- moment the call returned. SES counts a mail when it arrives, which is
    -- somewhere between the two; counting it from the grant until a window
    -- after the return covers wherever it landed, so a slow call followed by
    -- a fast one cannot put two windows' worth of mail into one at SES.
    local cost = num(ARGV[rest])
    local returned = server_now_ms()
    for _, win in ipairs(windows) do
        move(win, win.current, cost, math.floor(returned / win.width), returned)
    end
    return { returned }
end

if op == "usage" then
    local result = { now }
    for i, win in ipairs(windows) do
        count(win)
        result[i + 1] = win.total
    end
    return result
end

-- Weighted sharing of the global quota (start-time fair queuing). Each
-- tenant asking for the global quota carries a start tag: the units it was
-- granted divided by its weight. While another tenant is refused for want of
-- global room, a tenant more than one fair share of the shortest global
-- window ahead of the furthest-behind contending tenant waits, so
-- contenders get units in proportion to their weights, whichever replica
-- receives what. With nobody refused for room, nobody is held back.
--
-- Cost: O(log n) in the contending tenants. The furthest behind is the
-- lowest tag (ZRANGE 0 1), the weight sum a running total ("~sum"), and who
-- is refused for room the lowest "refused" score still ahead of now.
-- Tenants that stopped asking are forgotten a few at a time.
--
-- Work-conserving: a tenant ahead of its share waits only while another is
-- due back for room, and only until then; room nobody waits for goes to
-- whoever asks. A refused tenant comes back when its mail fits: the sender
-- times waits that short itself (fairpost.mailer.daemon.group, PRECISE_*), a
-- few ms late at most; DUE_SLACK_MS covers that lateness under load. One late
-- for longer (a long park, back in SQS's whole seconds) finds its room taken,
-- is refused again, and is first in line at the next moment room frees.
local DUE_SLACK_MS = 50
local fair = nil
if fair_op and global_count > 0 then
    local base = window_count
    fair = {
        tags = KEYS[base + 1], untils = KEYS[base + 2], weights = KEYS[base + 3], refused = KEYS[base + 4],
        tenant = ARGV[rest], weight = num(ARGV[rest + 1]),
        -- Set below. Listed here (nil for now), so that the table has room for
        -- them from the start: each added past its room would grow it, a
        -- rehash of every field.
        ref = nil, memory_ms = nil, forget = nil, read_weights = nil, had = nil, bound_until = nil,
        floor = nil, tag = nil, lead = nil, own_weight = nil, sum = nil, exp = nil,
    }
    rest = rest + 2
    local ref = windows[1]
    for i = 2, global_count do
        if windows[i].window_ms < ref.window_ms then ref = windows[i] end
    end
    fair.ref = ref
    -- How long a tenant that asked counts as contending (its backlog may sit
    -- in SQS, received again within moments), beyond any refusal's wait.
    -- Bounded: with a day window, "contending" must not mean "asked today".
    fair.memory_ms = math.min(60000, math.max(2000, 2 * ref.window_ms))

    local function forget(name)
        redis.call("ZREM", fair.tags, name)
        redis.call("ZREM", fair.untils, name)
        redis.call("ZREM", fair.refused, name)
        local w = num(redis.call("HGET", fair.weights, name))
        if w then
            redis.call("HDEL", fair.weights, name)
            redis.call("HINCRBY", fair.weights, "~sum", -w)
        end
    end
    fair.forget = forget
    -- The weights hash holds "~sum" for as long as it exists, and "~exp" (below).
    function fair.read_weights()
        local got = redis.call("HMGET", fair.weights, fair.tenant, "~sum", "~exp")
        fair.own_weight, fair.sum, fair.exp = num(got[1]) or 0, num(got[2]) or 0, num(got[3])
        fair.had[fair.weights] = got[2] ~= false
    end
    local function live(name)
        local untilms = num(redis.call("ZSCORE", fair.untils, name))
        return untilms ~= nil and untilms >= now
    end

    -- Forget a few of the tenants that stopped asking (amortized: each once).
    local FORGET = 8
    local gone = redis.call("ZRANGE", fair.untils, "-inf", "(" .. now, "BYSCORE", "LIMIT", 0, FORGET)
    for _, name in ipairs(gone) do forget(name) end

    local own = num(redis.call("ZSCORE", fair.tags, fair.tenant))
    if own and not live(fair.tenant) then
        forget(fair.tenant)
        own = nil
    end
    -- Whether each share key exists (then it has its TTL: each is given one by
    -- the call that creates it), for the TTLs written at the end; nil: unknown.
    -- Tags and untils hold the same tenants: they exist together.
    fair.had = {}
    -- The soonest another tenant refused for global room is due back, if any
    -- (its due time plus the slack): shares are enforced only until then.
    local function read_refused()
        local refused = redis.call("ZRANGE", fair.refused, 0, 1, "WITHSCORES")
        if #refused > 0 and num(refused[2]) <= now then
            -- Refusals whose wait is over no longer count.
            redis.call("ZREMRANGEBYSCORE", fair.refused, "-inf", now)
            refused = redis.call("ZRANGE", fair.refused, 0, 1, "WITHSCORES")
        end
        fair.had[fair.refused] = #refused > 0
        fair.bound_until = nil
        for j = 1, #refused, 2 do
            if refused[j] ~= fair.tenant and fair.bound_until == nil then
                fair.bound_until = num(refused[j + 1])
            end
        end
    end
    read_refused()
    -- The furthest-behind contending tenant other than this one, if any; one
    -- that stopped asking is forgotten on the way, a few per call at most (a
    -- crowd gone quiet at once is forgotten over the next calls, not by one).
    -- Not found within that bound: no share is enforced this time (the safe
    -- side: a share refusal needs a known floor). Needed for a newcomer's tag,
    -- for a share only while another is refused, and to forget more while a
    -- crowd gone quiet is forgotten: a contending tenant with none of these
    -- skips it (its own entries show the keys exist).
    fair.floor = nil
    local passed = nil
    if own == nil or fair.bound_until ~= nil or #gone == FORGET then
        local forgot = false
        for _ = 1, 16 do
            local low = redis.call("ZRANGE", fair.tags, 0, 1, "WITHSCORES")
            fair.had[fair.tags] = #low > 0
            local name, score = nil, nil
            for j = 1, #low, 2 do
                if low[j] ~= fair.tenant and name == nil then name, score = low[j], num(low[j + 1]) end
            end
            if name == nil then break end
            if live(name) then
                fair.floor = score
                break
            end
            passed = score
            forget(name)
            forgot = true
            fair.had[fair.tags] = nil
        end
        -- Forgotten tenants leave the refused set too.
        if forgot and fair.bound_until ~= nil then read_refused() end
    else
        fair.had[fair.tags] = true
    end
    fair.had[fair.untils] = fair.had[fair.tags]
    -- A newcomer starts level with the furthest behind: no credit for idling.
    fair.tag = own or fair.floor or passed or 0
    if fair.floor and fair.bound_until then
        fair.read_weights()
        local weight_sum = fair.sum - fair.own_weight + fair.weight
        -- One fair share of the reference window, in tag units.
        fair.lead = ref.limit / math.max(fair.weight, weight_sum)
    end
end

-- acquire / peek
local asked = 0
for c = rest, #ARGV do asked = asked + num(ARGV[c]) end
for _, win in ipairs(windows) do
    count(win, op == "peek" and asked or nil)
    win.added = 0
end

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
local first = rest
local whole = not (fair and fair.lead)
for _, win in ipairs(windows) do
    if win.total + asked > win.limit then whole = false end
end
if whole then
    grant(asked)
    granted = #ARGV - rest + 1
    if fair then
        for c = rest, #ARGV do fair.tag = fair.tag + num(ARGV[c]) / fair.weight end
    end
    first = #ARGV + 1
end
for c = first, #ARGV do
    local cost = num(ARGV[c])
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

-- Write what changed: this call's grants in the current bucket, the buckets
-- that left the window gone, and the running total with them.
if op == "acquire" then
    for _, win in ipairs(windows) do
        local key = win.key
        if win.total == 0 then
            -- Nothing counts any more (and nothing was granted): the hash goes.
            if win.wipe or win.moved or (win.list and #win.list > 0) then redis.call("DEL", key) end
        elseif win.added > 0 or win.fresh or win.moved or win.wipe then
            if win.wipe then
                redis.call("DEL", key)
            elseif #win.stale > 0 then
                hdel(key, win.stale)
            end
            local args = { "n", win.total }
            if win.added > 0 then
                args[#args + 1], args[#args + 2] = field(win.current), win.held + win.added
            end
            -- No bucket field is below lo: those below the window are gone, and
            -- the current bucket is in it (below a kept lo only if the clock went back).
            local lo = win.lo_kept or win.lo
            if win.added > 0 and win.current < lo then lo = win.current end
            if lo ~= win.lo_kept then
                args[#args + 1], args[#args + 2] = "lo", field(lo)
            end
            local newest = win.hi
            if win.added > 0 and (newest == nil or win.current > newest) then newest = win.current end
            local grows = newest ~= win.hi or win.fresh or win.wipe
            if grows then
                newest = newest + AHEAD
                args[#args + 1], args[#args + 2] = "hi", field(newest)
            end
            redis.call("HSET", key, unpack(args))
            if grows then
                -- Idle keys vanish once their newest bucket has left the window
                -- (AHEAD buckets later): bucket k stops counting at t = (k+1)*w + W - 1.
                redis.call("PEXPIRE", key, (newest + 1) * win.width + win.window_ms - 1 - now)
            end
        end
    end
end

if stop_for_share then
    -- Until the refused tenant is due back (then it is served or late, and the
    -- room is anyone's), and at most one reference window.
    blocked, retry_ms, binding = 3, math.max(1, math.min(fair.ref.window_ms, fair.bound_until - now)), 0
end

if fair and op == "acquire" then
    -- A tenant held back by its own quota keeps its tag: forgotten, it came
    -- back level with the furthest behind, however far ahead it was, and a
    -- tenant waiting for room never caught up with it.
    redis.call("ZADD", fair.tags, fair.tag, fair.tenant)
    if fair.own_weight == nil then fair.read_weights() end
    local weights = {}
    if fair.own_weight ~= fair.weight then
        weights = { fair.tenant, fair.weight, "~sum", fair.sum - fair.own_weight + fair.weight }
    end
    -- Granted in full or not, a tenant that asks is contending: its backlog
    -- may sit in SQS, beyond what this batch brought. One refused for room
    -- or its share is contending while it waits, plus the same memory; one
    -- its own quota holds, for the memory only (it may wait a day).
    local wait = (blocked ~= 0 and blocked ~= 2 and retry_ms > 0) and retry_ms or 0
    local untilms = now + wait + fair.memory_ms
    redis.call("ZADD", fair.untils, untilms, fair.tenant)
    -- Every key lives as long as its longest entry. GT keeps a longer TTL,
    -- but never sets one on a key without (no TTL counts as forever): a key
    -- this call created gets a plain PEXPIRE.
    local function extend(key, ttl, plain)
        local had = fair.had[key]
        if plain or had == false then
            redis.call("PEXPIRE", key, ttl)
        elseif redis.call("PEXPIRE", key, ttl, "GT") == 0 and had == nil and redis.call("PTTL", key) == -1 then
            redis.call("PEXPIRE", key, ttl)
        end
    end
    if blocked == 1 and retry_ms > 0 then
        -- Refused for global room: due back when it fits.
        local due = now + retry_ms + DUE_SLACK_MS
        redis.call("ZADD", fair.refused, due, fair.tenant)
        extend(fair.refused, due - now)
    elseif blocked == 0 and fair.had[fair.refused] then
        -- Granted in full: it waits for room no more. It may be back for the
        -- rest of its backlog at once, so it counts as refused for the
        -- slack, not for the rest of its old wait.
        redis.call("ZADD", fair.refused, "XX", "LT", now + DUE_SLACK_MS, fair.tenant)
    elseif blocked == 2 and fair.had[fair.refused] then
        -- Its own quota holds it now: it waits for room no more.
        redis.call("ZREM", fair.refused, fair.tenant)
    end
    -- The three keys written on every call expire together, the running sum
    -- with them, at "~exp" (in weights): a call that needs them longer moves
    -- it half a memory further, so most calls set no TTL at all.
    if fair.exp == nil or fair.exp < untilms then
        -- Each of the three expires at the old "~exp", if there was one.
        local known = fair.exp ~= nil
        fair.exp = untilms + math.floor(fair.memory_ms / 2)
        weights[#weights + 1], weights[#weights + 2] = "~exp", fair.exp
        redis.call("HSET", fair.weights, unpack(weights))
        for _, key in ipairs({ fair.tags, fair.untils, fair.weights }) do
            extend(key, fair.exp - now, known)
        end
    else
        if #weights > 0 then redis.call("HSET", fair.weights, unpack(weights)) end
        for _, key in ipairs({ fair.tags, fair.untils }) do
            -- Recreated by this call (its last tenant was forgotten): no TTL yet.
            local had = fair.had[key]
            if had == false or (had == nil and redis.call("PTTL", key) == -1) then
                redis.call("PEXPIRE", key, fair.exp - now)
            end
        end
    end
end

local reply = { granted, retry_ms, blocked, now, never_index, binding }
if record and granted > 0 then
    -- Units counted: a second run must not count them again. (Nothing counted:
    -- a second run answers afresh.)
    redis.call("SET", record, string.format("%d %d %d %d %d %d", unpack(reply)), "PX", RECORD_MS)
end
return reply

-- The quota's acquire (and its fair form, "acquire_fair"): windows.lua has the
-- arguments, the bucket math and the decision; this counts what it granted.
-- KEYS: the windows, then the four share keys (a fair acquire), then the
-- grant's record (Keys.quota_grant). ARGV[1]: "acquire" or "acquire_fair".

local fair_op = ARGV[1] == "acquire_fair"
-- A fair acquire passes its four share keys after the windows; the record is last.
local record = KEYS[#KEYS]
local window_count = #KEYS - (fair_op and 4 or 0) - 1

-- How long an acquire's answer is kept: longer than a sender takes to ask
-- again (its outage back-off, a message's visibility timeout).
local RECORD_MS = "300000"
local earlier = redis.call("GET", record)
if earlier then
    local reply = {}
    for value in string.gmatch(earlier, "%S+") do reply[#reply + 1] = tonumber(value) end
    if reply[2] > 0 then
        reply[2] = math.max(1, reply[2] - (now - reply[4]))
    end
    return reply
end

local windows, rest = read_windows(window_count)

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
    local FORGET, FORGET_TEXT = 8, "8"
    local gone = redis.call("ZRANGE", fair.untils, "-inf", string.format("(%d", now), "BYSCORE", "LIMIT", "0", FORGET_TEXT)
    for _, name in ipairs(gone) do forget(name) end

    local own = num(redis.call("ZSCORE", fair.tags, fair.tenant))
    -- Fewer gone than asked for: every tenant whose until passed was among them, and
    -- is forgotten (tags and untils hold the same tenants). Only when more may be
    -- gone is this tenant's own until read.
    if own and #gone == FORGET and not live(fair.tenant) then
        forget(fair.tenant)
        own = nil
    end
    -- Whether each share key exists (then it has its TTL: each is given one by
    -- the call that creates it), for the TTLs written at the end; nil: unknown.
    -- Tags and untils hold the same tenants: they exist together.
    -- Sized for its four keys from the start (nil here, set below): each added
    -- past its room would rehash it.
    fair.had = { [fair.tags] = nil, [fair.untils] = nil, [fair.weights] = nil, [fair.refused] = nil }
    -- The soonest another tenant refused for global room is due back, if any
    -- (its due time plus the slack): shares are enforced only until then.
    local function read_refused()
        local refused = redis.call("ZRANGE", fair.refused, "0", "1", "WITHSCORES")
        if #refused > 0 and num(refused[2]) <= now then
            -- Refusals whose wait is over no longer count.
            redis.call("ZREMRANGEBYSCORE", fair.refused, "-inf", now)
            refused = redis.call("ZRANGE", fair.refused, "0", "1", "WITHSCORES")
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
            local low = redis.call("ZRANGE", fair.tags, "0", "1", "WITHSCORES")
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

-- The usual call: no share is enforced, and every window's hash has its running
-- total, its oldest bucket still in the window and the current bucket under its
-- TTL, with room for the whole batch. Then the batch is granted with one read and
-- one write a window, and none of the bookkeeping below (decide, and the write
-- that follows it) does anything else: a third of the call's cost, without it.
-- Anything else (a window without room, buckets that left it, a new one) is
-- decided below, from the reads made here (which wrote nothing) and the rest.
local granted, retry_ms, blocked, never_index, binding, stop_for_share = 0, 0, 0, 0, 0, false
local fast = not (fair and fair.lead) and #ARGV > rest
if fast then
    local mails, asked, tagged = asked_of(rest, fair)
    local previous = nil
    for i = 1, window_count do
        local win = windows[i]
        local current = win.current
        -- Windows of one length (the global's and the tenant's) share the current
        -- bucket: its field made text once (a format each).
        local current_field
        if previous and previous.current == current then
            current_field = previous.current_field
        else
            current_field = field(current)
        end
        local got = redis.call("HMGET", win.key, "n", "lo", "hi", current_field)
        -- Kept for decide, should this window not allow it here: not read twice.
        win.got, win.current_field = got, current_field
        local n, lo, hi = num(got[1]), num(got[2]), num(got[3])
        if not (n and lo and hi and lo >= win.lo and current >= lo and current <= hi and n + asked <= win.limit) then
            fast = false
            break
        end
        win.total, win.held = n, num(got[4]) or 0
        previous = win
    end
    if fast then
        for i = 1, window_count do
            local win = windows[i]
            redis.call("HSET", win.key, "n", win.total + asked, win.current_field, win.held + asked)
        end
        granted = mails
        if fair then fair.tag = tagged end
    end
end
if not fast then
    granted, retry_ms, blocked, never_index, binding, stop_for_share = decide(windows, rest, fair, false)

    -- Write what changed: this call's grants in the current bucket, the buckets
    -- that left the window gone, and the running total with them.
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
            -- Room for the common write (the total and the current bucket) from the start.
            local args, nargs = { "n", win.total, false, false }, 2
            if win.added > 0 then
                args[3], args[4], nargs = win.current_field, win.held + win.added, 4
            end
            -- No bucket field is below lo: those below the window are gone, and
            -- the current bucket is in it (below a kept lo only if the clock went back).
            local lo = win.lo_kept or win.lo
            if win.added > 0 and win.current < lo then lo = win.current end
            if lo ~= win.lo_kept then
                args[nargs + 1], args[nargs + 2], nargs = "lo", field(lo), nargs + 2
            end
            local newest = win.hi
            if win.added > 0 and (newest == nil or win.current > newest) then newest = win.current end
            local grows = newest ~= win.hi or win.fresh or win.wipe
            if grows then
                newest = newest + AHEAD
                args[nargs + 1], args[nargs + 2], nargs = "hi", field(newest), nargs + 2
            end
            redis.call("HSET", key, unpack(args, 1, nargs))
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

if fair then
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
        -- Recreated by this call (its last tenant was forgotten): no TTL yet. (Tags
        -- and untils exist together: had says the same of both.)
        local had = fair.had[fair.tags]
        if had == false or (had == nil and redis.call("PTTL", fair.tags) == -1) then
            redis.call("PEXPIRE", fair.tags, fair.exp - now)
        end
        had = fair.had[fair.untils]
        if had == false or (had == nil and redis.call("PTTL", fair.untils) == -1) then
            redis.call("PEXPIRE", fair.untils, fair.exp - now)
        end
    end
end

local reply = { granted, retry_ms, blocked, now, never_index, binding }
if granted > 0 then
    -- Units counted: a second run must not count them again. (Nothing counted:
    -- a second run answers afresh.)
    -- Granted in full (most calls): two numbers to format, not six.
    local text
    if retry_ms == 0 and blocked == 0 and never_index == 0 and binding == 0 then
        text = string.format("%d 0 0 %d 0 0", granted, now)
    else
        text = string.format("%d %d %d %d %d %d", granted, retry_ms, blocked, now, never_index, binding)
    end
    redis.call("SET", record, text, "PX", RECORD_MS)
end
return reply

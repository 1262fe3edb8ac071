-- Enqueue jobs, all or nothing: each one's record and, at the tail of its
-- tenant's queue, its entry: its id and its payload (dispatcher/record.py) or,
-- when its send time is still to come, its id in the scheduled set and its
-- payload in a key of its own until then. One call for a whole batch
-- (send_many): every check is made before the first write, and the shebang
-- line (store.py) makes Redis refuse the call whole when it is out of memory,
-- instead of failing half-way.
-- KEYS[1..9] ring context (ring.lua), KEYS[10] all-tenants set, KEYS[11]
-- scheduled jobs (zset), then per job its hash
-- ARGV[1..3] ring context, ARGV[4] number of jobs, ARGV[5] what separates a queue
-- entry's id from its payload (no job id holds it), ARGV[6] the high-water mark
-- (a share of maxmemory; 0: none), ARGV[7] content key prefix, ARGV[8] payload key
-- prefix, then per job: id, tenant, priority, its queue entry (its id, ARGV[5],
-- its payload), kind, the number K of its options, K option, value pairs (each
-- only when the job has it: 'send_at', a send time in ms; 'idem', its
-- idempotency key, with 'idem_ttl', its TTL in seconds; 'content'), the number
-- N of its other record fields, then N field, value pairs
-- A job's other keys are built here, and only when it has them, and what most
-- jobs lack is not passed: every string a call passes is hashed and interned,
-- used or not (some 500 instructions each).
-- Returns, per job, {code, id}: {1, job id} written; {0, job id} a job with
-- this id exists already; {2, first job id} the idempotency key was used
-- already (by an earlier job, or by one earlier in this batch). Only 1 writes.
-- Above the high-water mark, the error 'FAIRPOST_FULL <used_memory> <maxmemory>'
-- and nothing written (docs/design.md, "Redis memory").
local high_water = ARGV[6] + 0
if high_water > 0 then
  -- Admission control: new jobs stop well before maxmemory, so that the daemon
  -- keeps room to record what it drains and a volatile-* Redis never evicts.
  -- INFO, not CONFIG: managed services refuse CONFIG.
  local info = redis.call('INFO', 'memory')
  -- Found plainly, then read where found: a pattern tried at every place of
  -- INFO's 1,500 characters cost as much as INFO itself.
  local function field(name)
    local at = string.find(info, name, 1, true)
    return at and tonumber(string.match(info, '^%d+', at + #name)) or 0
  end
  local limit = field('\nmaxmemory:')
  local used = field('\nused_memory:')
  if limit > 0 and used >= limit * high_water then
    return redis.error_reply('FAIRPOST_FULL ' .. used .. ' ' .. limit)
  end
end
local ctx = ring_context(KEYS, ARGV)
local tenants_key, scheduled, sep = KEYS[10], KEYS[11], ARGV[5]
local content_prefix, payload_prefix = ARGV[7], ARGV[8]
local n = tonumber(ARGV[4])
-- Per job, where its values start in ARGV (its hash: KEYS[11 + i]), where its
-- count of fields is, its options (a table only for a job that has any) and its
-- code; starts[n + 1] is one past the last job's. No table a job: a batch of a
-- hundred built a hundred, a tenth of the call's Lua work with the garbage
-- they left. Numbers are ARGV's strings made numbers by arithmetic: once,
-- where tonumber() converts twice; a '0' is told by comparing strings
-- (interned: one pointer), which converts none.
local starts, fields_at, options, codes = {}, {}, {}, {}
-- The options of a job that has none.
local NONE = {}
local function options_at(at, k)
  local o = {}
  for j = at, at + 2 * k - 1, 2 do
    o[ARGV[j]] = ARGV[j + 1]
  end
  return o
end

-- First every check, so that nothing is written unless the whole batch is decided.
local out = {}
local ids_seen, keys_seen = {}, {}
-- One EXISTS over every record first (a thousand at a time: one command's
-- arguments stay well inside Lua's stack): a batch of new ids, the usual one,
-- then asks for none of them one by one.
local any_exists = false
for from = 1, n, 1000 do
  if redis.call('EXISTS', unpack(KEYS, 11 + from, 11 + math.min(n, from + 999))) > 0 then
    any_exists = true
    break
  end
end
local a = 9
for i = 1, n do
  local id, at, idem_key = ARGV[a], a + 6, nil
  if ARGV[a + 5] ~= '0' then
    local k = ARGV[a + 5] + 0
    options[i] = options_at(at, k)
    idem_key = options[i].idem
    at = at + 2 * k
  end
  local first = nil
  if idem_key then
    first = keys_seen[idem_key] or redis.call('GET', idem_key)
  end
  local code, answer
  if first then
    code, answer = 2, first
  elseif ids_seen[id] or (any_exists and redis.call('EXISTS', KEYS[11 + i]) == 1) then
    code, answer = 0, id
  else
    code, answer = 1, id
    ids_seen[id] = true
    if idem_key then
      keys_seen[idem_key] = id
    end
  end
  out[i] = {code, answer}
  starts[i], fields_at[i], codes[i] = a, at, code
  a = at + 1 + 2 * ARGV[at]
end
starts[n + 1] = a

local now = now_ms()
local now_s = as_text(now)
-- Per tenant, in the order first seen: its new entries by priority, and how many.
local tenants, waiting = {}, {}
for i = 1, n do
  if codes[i] == 1 then
    local at, opts = starts[i], options[i] or NONE
    local id, tenant, priority, entry = ARGV[at], ARGV[at + 1], ARGV[at + 2], ARGV[at + 3]
    local send_at = opts.send_at
    -- A waiting job's payload rides in its queue entry, several to an 8 KB
    -- listpack node, rather than in a key of its own: 'inline' says so until
    -- the claim takes the entry (a cancelled job's entry may still hold its
    -- only copy: replay.lua). A scheduled job is in no queue: its payload has
    -- its key now, and its queue entry will be its id alone (promote.lua).
    local state, mark, value = 'queued', 'inline', '1'
    if send_at and send_at + 0 > now then
      state, mark, value = 'scheduled', 'send_at_ms', send_at
      redis.call('SET', payload_prefix .. id, string.sub(entry, #id + #sep + 1))
    end
    redis.call('HSET', KEYS[11 + i], 'tenant', tenant, 'priority', priority, 'state', state,
      'created_ms', now_s, 'attempts', '0', mark, value, 'kind', ARGV[at + 4],
      unpack(ARGV, fields_at[i] + 1, starts[i + 1] - 1))
    if opts.content then
      redis.call('SET', content_prefix .. id, opts.content)
    end
    if opts.idem then
      redis.call('SET', opts.idem, id, 'EX', opts.idem_ttl)
    end
    if state == 'scheduled' then
      redis.call('SADD', tenants_key, tenant)
      redis.call('ZADD', scheduled, send_at, id)
      -- The new earliest: wake an idle dispatcher, so that it waits for this one.
      if redis.call('ZRANGE', scheduled, 0, 0)[1] == id then
        wake_dispatchers(ctx, 's')
      end
    else
      local queues = waiting[tenant]
      if not queues then
        queues = {count = 0, order = {}, entries = {}}
        waiting[tenant] = queues
        tenants[#tenants + 1] = tenant
      end
      local entries = queues.entries[priority]
      if not entries then
        entries = {}
        queues.entries[priority] = entries
        queues.order[#queues.order + 1] = priority
      end
      entries[#entries + 1] = entry
      queues.count = queues.count + 1
    end
  end
end

-- The batch's entries go in one RPUSH a queue (a thousand at most: unpack's
-- stack), its tenants' counts move once a tenant and the total once a call,
-- and each tenant is activated once.
local total = 0
for _, tenant in ipairs(tenants) do
  local queues = waiting[tenant]
  for _, priority in ipairs(queues.order) do
    local entries = queues.entries[priority]
    for first = 1, #entries, 1000 do
      redis.call('RPUSH', queue_key(ctx, tenant, priority), unpack(entries, first, math.min(#entries, first + 999)))
    end
  end
  local n, applied = count_tenant_waiting(ctx, tenant, queues.count)
  total = total + applied
  if n == queues.count then
    -- New to the queues (known already if it had other jobs waiting).
    redis.call('SADD', tenants_key, tenant)
  end
  activate(ctx, tenant, now)
end
count_total_waiting(ctx, total)
return out

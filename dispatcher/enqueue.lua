-- Enqueue jobs, all or nothing: each one's record and, at the tail of its
-- tenant's queue, its entry: its id and its payload (dispatcher/record.py) or,
-- when its send time is still to come, its id in the scheduled set and its
-- payload in a key of its own until then. One call for a whole batch
-- (send_many): every check is made before the first write, and the shebang
-- line (store.py) makes Redis refuse the call whole when it is out of memory,
-- instead of failing half-way.
-- KEYS[1..9] ring context (ring.lua), KEYS[10] all-tenants set, KEYS[11]
-- scheduled jobs (zset), then per job: its hash, its content (string), its
-- payload (string: a scheduled job's only) and its idempotency key (string;
-- its hash again when it has none)
-- ARGV[1..3] ring context, ARGV[4] number of jobs, ARGV[5] what separates a queue
-- entry's id from its payload (no job id holds it), then per job: id, tenant,
-- priority, send time in ms (0: now), idempotency key TTL in seconds (0: no
-- key), the content ('': none), the payload, the number N of other record
-- fields, then N field, value pairs
-- Returns, per job, {code, id}: {1, job id} written; {0, job id} a job with
-- this id exists already; {2, first job id} the idempotency key was used
-- already (by an earlier job, or by one earlier in this batch). Only 1 writes.
local ctx = ring_context(KEYS, ARGV)
local tenants_key, scheduled, sep = KEYS[10], KEYS[11], ARGV[5]
local jobs = {}
local a = 6
for i = 1, tonumber(ARGV[4]) do
  local k = 11 + (i - 1) * 4
  local job = {
    key = KEYS[k + 1], content_key = KEYS[k + 2], payload_key = KEYS[k + 3], idem_key = KEYS[k + 4],
    id = ARGV[a], tenant = ARGV[a + 1], priority = ARGV[a + 2],
    send_at = tonumber(ARGV[a + 3]), idem_ttl = tonumber(ARGV[a + 4]), content = ARGV[a + 5],
    payload = ARGV[a + 6], first_field = a + 8, last_field = a + 7 + 2 * tonumber(ARGV[a + 7]),
  }
  a = job.last_field + 1
  jobs[#jobs + 1] = job
end

-- First every check, so that nothing is written unless the whole batch is decided.
local out = {}
local ids_seen, keys_seen = {}, {}
for i, job in ipairs(jobs) do
  local first = nil
  if job.idem_ttl > 0 then
    first = keys_seen[job.idem_key] or redis.call('GET', job.idem_key)
  end
  if first then
    job.code, job.answer = 2, first
  elseif ids_seen[job.id] or redis.call('EXISTS', job.key) == 1 then
    job.code, job.answer = 0, job.id
  else
    job.code, job.answer = 1, job.id
    ids_seen[job.id] = true
    if job.idem_ttl > 0 then
      keys_seen[job.idem_key] = job.id
    end
  end
  out[i] = {job.code, job.answer}
end

local now = now_ms()
local now_s = as_text(now)
-- Per tenant, in the order first seen: its new entries by priority, and how many.
local tenants, waiting = {}, {}
for _, job in ipairs(jobs) do
  if job.code == 1 then
    -- A waiting job's payload rides in its queue entry, several to an 8 KB
    -- listpack node, rather than in a key of its own: 'inline' says so until
    -- the claim takes the entry (a cancelled job's entry may still hold its
    -- only copy: replay.lua). A scheduled job is in no queue: its payload has
    -- its key now, and its queue entry will be its id alone (promote.lua).
    local state, mark, value = 'queued', 'inline', '1'
    if job.send_at > now then
      state, mark, value = 'scheduled', 'send_at_ms', job.send_at
      redis.call('SET', job.payload_key, job.payload)
    end
    redis.call('HSET', job.key, 'tenant', job.tenant, 'priority', job.priority, 'state', state,
      'created_ms', now_s, 'attempts', '0', mark, value, unpack(ARGV, job.first_field, job.last_field))
    if job.content ~= '' then
      redis.call('SET', job.content_key, job.content)
    end
    if job.idem_ttl > 0 then
      redis.call('SET', job.idem_key, job.id, 'EX', job.idem_ttl)
    end
    if state == 'scheduled' then
      redis.call('SADD', tenants_key, job.tenant)
      redis.call('ZADD', scheduled, job.send_at, job.id)
      -- The new earliest: wake an idle dispatcher, so that it waits for this one.
      if redis.call('ZRANGE', scheduled, 0, 0)[1] == job.id then
        wake_dispatchers(ctx, 's')
      end
    else
      local queues = waiting[job.tenant]
      if not queues then
        queues = {count = 0, order = {}, entries = {}}
        waiting[job.tenant] = queues
        tenants[#tenants + 1] = job.tenant
      end
      local entries = queues.entries[job.priority]
      if not entries then
        entries = {}
        queues.entries[job.priority] = entries
        queues.order[#queues.order + 1] = job.priority
      end
      entries[#entries + 1] = job.id .. sep .. job.payload
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

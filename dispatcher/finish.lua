-- Jobs ended (sent, dead, or a final state of the caller's own): record each
-- and free its in-flight slot. One call for a worker's whole batch
-- (store.finish_all): the slots are freed and each tenant re-activated once a
-- call, not once a job; and so are the keys a job no longer needs deleted, the
-- leases ended and the history's lines written (a bucket at a time).
-- KEYS[1..9] ring context (ring.lua), KEYS[10] leases (zset), KEYS[11] dead
-- letters (zset), KEYS[12] dispatched jobs (zset, dispatcher/reconcile.lua),
-- KEYS[13] the history's days map (history.lua), then per job: its hash, its content (string, may not exist), its payload
-- (string) and its B busy markers (Keys.busy_markers: a final job needs none,
-- so they go), and, last, the journal (stream) when there is one (journal.lua)
-- ARGV[1..3] ring context, ARGV[4] final state ('sent', 'dead' or the caller's own),
-- ARGV[5] seconds to keep the records (0: forever), ARGV[6] B, ARGV[7..10 + 3L] the
-- history (history.lua's history_context, ARGV[10] its L fields: a sent job's
-- record then stays whole for its detail seconds, and its line in the history
-- for ARGV[5]; given for a 'sent' call alone), ARGV[11 + 3L..] the journal (journal.lua), then per job: its id,
-- its hash when the call keeps history (history_add), the number N of fields to set, then N
-- field, value pairs, then its journal entry (a count M and M pairs)
-- A sent job gets sent_ms (Redis time, as every stored time). Each job changed
-- gets its journal entry; a job left as it was gets none.
-- Returns, per job: 1; 0 if the job was already sent (nothing changed); -1 if unknown.
local ctx = ring_context(KEYS, ARGV)
local leases, dead, dispatched = KEYS[10], KEYS[11], KEYS[12]
local final, keep = ARGV[4], tonumber(ARGV[5])
local sent, is_dead = final == 'sent', final == 'dead'
local now = now_ms()
local now_s = as_text(now)
-- Formatted once a call: a number passed to redis.call is formatted for each job.
local keep_s = as_text(keep)
local markers = tonumber(ARGV[6])
local history, at_journal = nil, 11 + 3 * ARGV[10]
if sent then
  history, at_journal = history_context(KEYS[13], ARGV, 7, now, keep)
end
local journal, a = journal_context(KEYS[#KEYS], ARGV, at_journal)
-- The record's fields a job's line in the history keeps and its journal entry
-- copies, with its tenant and state, read with one HMGET into `rec`: from 1 the
-- history's fields (history_line's values), from journal_at + 1 the journal's,
-- then the tenant and the state unless read already. Then made what they are
-- after the job's change before its line and entry copy them (as a read after
-- the change would): what its HSET wrote, in place.
local read_names = history and {unpack(history.layout.names)} or {}
local journal_at = #read_names
for i, name in ipairs(journal_copied_names(journal)) do
  read_names[journal_at + i] = name
end
-- A field's first place in rec; `also`: each other place of a field read twice
-- (the history's line and the journal's entry both keep it, say), then its
-- first: each is read once (a field's lookup scans the record), and each place
-- has its own copy (history_line changes its values in place).
local also, place = {}, {}
for i, name in ipairs(read_names) do
  local first = place[name]
  if first then
    also[#also + 1], also[#also + 2] = i, first
  else
    place[name] = i
  end
end
local n_also = #also
local at_finished, at_sent = place['finished_ms'], sent and place['sent_ms']
-- The finished_ms a line keeps is the call's time, whatever the record held:
-- the state, when read for this script alone, takes its place in the read (a
-- field fewer: a field's lookup scans the record, and the 17th of a reply grows
-- its table once more), and the time its place once the state is used.
local at_state = place['state']
if not at_state then
  if at_finished and n_also == 0 then
    at_state = at_finished
  else
    at_state = #read_names + 1
    place['state'] = at_state
  end
  read_names[at_state] = 'state'
end
local at_tenant = place['tenant']
if not at_tenant then
  at_tenant = #read_names + 1
  read_names[at_tenant] = 'tenant'
end
-- One table for every job's HSET, refilled from `fixed` + 1 with the caller's pairs.
local fields, fixed = {'state', final, 'finished_ms', now_s}, 4
if sent then
  fields[5], fields[6], fixed = 'sent_ms', now_s, 6
end
-- Keys to delete, leases to end, jobs no longer dispatched: one command each a
-- call (a few thousand at a time: one command's arguments stay well inside
-- Lua's stack).
-- Their tables are made with room for the call's jobs (the KEYS after the
-- first 13 are 3 + B a job, then the journal's).
local n_jobs = math.min(math.floor((#KEYS - 13) / (3 + markers)), 1000)
local doomed, n_doomed = sized_table(n_jobs * (2 + markers)), 0
local function drop_doomed()
  if n_doomed > 0 then
    redis.call('DEL', unpack(doomed, 1, n_doomed))
    doomed, n_doomed = {}, 0
  end
end
local unleased, undispatched = sized_table(n_jobs), sized_table(n_jobs)
local n_unleased, n_undispatched = 0, 0
local out, n_out = sized_table(n_jobs), 0
-- Per tenant, in the order first seen: the jobs whose slots to free.
local tenants, slots = {}, {}
local k = 13
-- Numbers are ARGV's strings made numbers by arithmetic (as enqueue.lua's):
-- tonumber() converts twice.
local n_argv = #ARGV
while a <= n_argv do
  local job_id, hash = ARGV[a], nil
  if history then
    a, hash = a + 1, ARGV[a + 1]
  end
  local n = ARGV[a + 1] + 0
  local first, last = a + 2, a + 1 + 2 * n
  local entry = last + 1
  a = entry + 1 + 2 * ARGV[entry]  -- journal_skip
  local job_key, content_key, payload_key = KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]
  -- The busy markers go whatever the job's state.
  for i = k + 4, k + 3 + markers do
    n_doomed = n_doomed + 1
    doomed[n_doomed] = KEYS[i]
  end
  k = k + 3 + markers
  local rec = redis.call('HMGET', job_key, unpack(read_names))
  local state, tenant = rec[at_state], rec[at_tenant]
  n_out = n_out + 1
  if not tenant then
    out[n_out] = -1
  else
    local held = slots[tenant]
    if not held then
      held = {}
      slots[tenant] = held
      tenants[#tenants + 1] = tenant
    end
    held[#held + 1] = job_id
    -- Only a claimed job holds a lease (a hand-off ends it, in the same script
    -- that marks the job dispatched) and only a dispatched job sits in the
    -- dispatched index (the reconciler forgets any other it finds there).
    if state == 'dispatched' then
      n_undispatched = n_undispatched + 1
      undispatched[n_undispatched] = job_id
    else
      n_unleased = n_unleased + 1
      unleased[n_unleased] = job_id
    end
    if state == 'sent' then
      out[n_out] = 0
    else
      local f = fixed
      for i = first, last do
        f = f + 1
        fields[f] = ARGV[i]
      end
      redis.call('HSET', job_key, unpack(fields, 1, f))
      if sent and state == 'dead' then
        -- Sent after all (a dead letter replayed, or one that was racing its
        -- worker): it is no dead letter any more.
        redis.call('ZREM', dead, job_id)
      end
      if is_dead then
        redis.call('ZADD', dead, now_s, job_id)
        if keep > 0 then
          -- Dead letters older than their records' TTL are gone: drop their ids too.
          redis.call('ZREMRANGEBYSCORE', dead, '-inf', now - keep * 1000)
          redis.call('EXPIRE', content_key, keep_s)
          redis.call('EXPIRE', payload_key, keep_s)
        end
      else
        -- A sent job keeps its metadata only.
        doomed[n_doomed + 1], doomed[n_doomed + 2] = content_key, payload_key
        n_doomed = n_doomed + 2
      end
      -- The fields just set, as the line and the journal are to keep them
      -- (finished_ms, sent_ms, ...): what a read after the change would give.
      rec[at_state] = final
      if at_finished then
        rec[at_finished] = now_s
      end
      if at_sent then
        rec[at_sent] = now_s
      end
      for i = first, last, 2 do
        local at = place[ARGV[i]]
        if at then
          rec[at] = ARGV[i + 1]
        end
      end
      for i = 1, n_also, 2 do
        rec[also[i]] = rec[also[i + 1]]
      end
      if history then
        history_add(history, job_id, hash, final, tenant, rec)
        redis.call('EXPIRE', job_key, history.detail)
      elseif keep > 0 then
        redis.call('EXPIRE', job_key, keep_s)
      end
      if journal then
        journal_append(journal, job_key, job_id, final, ARGV, entry, rec, journal_at, a <= n_argv)
      end
      out[n_out] = 1
    end
  end
  if n_doomed >= 4000 then
    drop_doomed()
  end
end
drop_doomed()
if n_unleased > 0 then
  zrem_jobs(leases, unleased, 1, n_unleased)
end
if n_undispatched > 0 then
  zrem_jobs(dispatched, undispatched, 1, n_undispatched)
end
for _, tenant in ipairs(tenants) do
  local _, held = release_slots(ctx, tenant, slots[tenant])
  activate(ctx, tenant, now, held)
end
journal_trim(journal, now)
history_write(history)
return out

-- Prepended (calls.script) to the scripts that end jobs (finish, cancel,
-- dead_letter) and to append.lua: the optional journal, a Redis stream to which
-- the script appends one entry for each job it changes, in the same atomic step
-- as the change (dispatcher/journal.py). Without a journal nothing is appended.
--
-- Its ARGV, where each script says: the most entries to keep (0: no journal;
-- trimmed with MAXLEN ~), the most age of an entry in ms (0: any; trimmed with
-- MINID ~), the number C of record fields to copy, then their names. Its key is
-- the script's last KEY, passed only with a journal.
--
-- Each job's entry in ARGV: a count M, then M field, value pairs given by the
-- caller (M may be 0). The entry appended is: job (the id), state (the state the
-- job was given, when the script gave one), each copied record field the record
-- has, then the given pairs. The stream's entry id is the entry's identity and
-- time (Redis time, ms).

local function journal_context(key, argv, at)
  local max_length, max_age, count = tonumber(argv[at]), tonumber(argv[at + 1]), tonumber(argv[at + 2])
  local copy = {unpack(argv, at + 3, at + 2 + count)}
  local journal = nil
  if max_length > 0 then
    -- max_length as text, formatted once: each append passes it to redis.call,
    -- which formats a number every time (a few thousand instructions).
    journal = {key = key, max_length = string.format('%d', max_length), max_age = max_age, copy = copy}
  end
  return journal, at + 3 + count
end

-- The ARGV index just after the entry given at `at` (its count and pairs).
local function journal_skip(argv, at)
  return at + 1 + 2 * argv[at]
end

-- The record fields the journal copies, to read with the script's own HMGET of
-- the record (journal_append's `values`); none without a journal.
local function journal_copied_names(journal)
  return journal and journal.copy or {}
end

-- One table for every entry of a call, refilled: a table built afresh for each
-- entry, and grown field by field, was most of the Lua a finish spent on it.
-- Made with room for an entry of 16 parts: a table grown a part at a time is
-- made anew at each power of two.
local journal_entry = {false, false, false, false, false, false, false, false,
  false, false, false, false, false, false, false, false}

-- Appends the job's entry. `values`, when given, holds the copied fields as the
-- record has them now, in journal.copy's order from values[offset + 1] (read by
-- the caller with a read of its own); otherwise they are read here. Trimming
-- by age is journal_trim's, once a call: every entry of a call has the same
-- time. By length, the append trims, unless `more` appends follow in the call:
-- then the last of them, or journal_trim, trims for all (what one trim after
-- the call's appends leaves is what a trim after each would: the stream only
-- grows meanwhile, and each trim drops whole nodes from its head).
local function journal_append(journal, job_key, job_id, state, argv, at, values, offset, more)
  if not journal then
    return
  end
  local entry, n = journal_entry, 2
  entry[1], entry[2] = 'job', job_id
  if state then
    entry[3], entry[4], n = 'state', state, 4
  end
  local names = journal.copy
  local n_names = #names
  if n_names > 0 then
    if not values then
      values, offset = redis.call('HMGET', job_key, unpack(names)), 0
    end
    for i = 1, n_names do
      local value = values[offset + i]
      if value then
        entry[n + 1], entry[n + 2], n = names[i], value, n + 2
      end
    end
  end
  -- To journal_skip(argv, at) - 1, without a function's call an entry.
  for i = at + 1, at + 2 * argv[at] do
    n = n + 1
    entry[n] = argv[i]
  end
  journal.appended, journal.untrimmed = true, more
  if more then
    return redis.call('XADD', journal.key, '*', unpack(entry, 1, n))
  end
  return redis.call('XADD', journal.key, 'MAXLEN', '~', journal.max_length, '*', unpack(entry, 1, n))
end

-- Entries older than the journal's most age go (MINID ~): once a call, after its
-- last append (entries are never older than the call's time `now`); and, when
-- its last append left it to this, those past its most entries (MAXLEN ~).
local function journal_trim(journal, now)
  if journal and journal.untrimmed then
    redis.call('XTRIM', journal.key, 'MAXLEN', '~', journal.max_length)
  end
  if journal and journal.appended and journal.max_age > 0 then
    redis.call('XTRIM', journal.key, 'MINID', '~', now - journal.max_age)
  end
end

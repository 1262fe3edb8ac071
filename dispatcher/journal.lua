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
  local copy = {}
  for i = 1, count do
    copy[i] = argv[at + 2 + i]
  end
  local journal = nil
  if max_length > 0 then
    journal = {key = key, max_length = max_length, max_age = max_age, copy = copy}
  end
  return journal, at + 3 + count
end

-- The ARGV index just after the entry given at `at` (its count and pairs).
local function journal_skip(argv, at)
  return at + 1 + 2 * tonumber(argv[at])
end

local function journal_append(journal, job_key, job_id, state, argv, at, now)
  if not journal then
    return
  end
  local entry = {'job', job_id}
  if state then
    entry[3], entry[4] = 'state', state
  end
  if #journal.copy > 0 then
    local values = redis.call('HMGET', job_key, unpack(journal.copy))
    for i, name in ipairs(journal.copy) do
      if values[i] then
        entry[#entry + 1] = name
        entry[#entry + 1] = values[i]
      end
    end
  end
  for i = at + 1, journal_skip(argv, at) - 1 do
    entry[#entry + 1] = argv[i]
  end
  local id = redis.call('XADD', journal.key, 'MAXLEN', '~', journal.max_length, '*', unpack(entry))
  if journal.max_age > 0 then
    redis.call('XTRIM', journal.key, 'MINID', '~', now - journal.max_age)
  end
  return id
end

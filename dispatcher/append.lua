-- Append one entry about a job to the journal (journal.lua) apart from a change
-- of its state: what the job's downstream reports about it later (a delivery's
-- events, say). The record's fields are copied as the journal says; a
-- job whose record has expired gets what the caller gives.
-- KEYS[1] the job's record (hash; may not exist), KEYS[2] the journal (stream)
-- ARGV[1..] the journal (journal.lua), then the job id, then the entry (M, then
-- M field, value pairs)
-- Returns the entry's id, or false without a journal.
local journal, at = journal_context(KEYS[2], ARGV, 1)
if not journal then
  return false
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local id = journal_append(journal, KEYS[1], ARGV[at], nil, ARGV, at + 1)
journal_trim(journal, now)
return id

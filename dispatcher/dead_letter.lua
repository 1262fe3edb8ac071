-- A dead letter for a job without a record (expired, lost, or an unreadable
-- SQS message that names none), written whole and scored by Redis time.
-- KEYS[1] the job's record (hash), KEYS[2] dead letters (zset), KEYS[3] the
-- journal (stream) when there is one (journal.lua)
-- ARGV[1] job id, ARGV[2] tenant, ARGV[3] reason, ARGV[4] the raw body,
-- ARGV[5] seconds to keep the record, ARGV[6..] the journal (journal.lua), then
-- the job's journal entry (a count M and M pairs)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'tenant', ARGV[2], 'kind', 'mail', 'state', 'dead', 'priority', 'normal',
  'created_ms', now, 'finished_ms', now, 'dead_reason', ARGV[3], 'last_error', ARGV[3],
  'raw_body', ARGV[4], 'attempts', 0)
redis.call('ZADD', KEYS[2], now, ARGV[1])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[5]))
local journal, entry = journal_context(KEYS[3], ARGV, 6)
journal_append(journal, KEYS[1], ARGV[1], 'dead', ARGV, entry, now)
return now

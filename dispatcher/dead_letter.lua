-- A dead letter for a job without a record (its downstream found it: expired,
-- lost, or a message that names none), written whole and scored by Redis time.
-- KEYS[1] the job's record (hash), KEYS[2] dead letters (zset), KEYS[3] the
-- journal (stream) when there is one (journal.lua)
-- ARGV[1] job id, ARGV[2] tenant, ARGV[3] kind, ARGV[4] reason, ARGV[5] seconds
-- to keep the record, ARGV[6] the number N of fields of the caller's own, then N
-- field, value pairs, then the journal (journal.lua), then the job's journal
-- entry (a count M and M pairs)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = tonumber(ARGV[6])
redis.call('HSET', KEYS[1], 'tenant', ARGV[2], 'kind', ARGV[3], 'state', 'dead', 'priority', 'normal',
  'created_ms', now, 'finished_ms', now, 'dead_reason', ARGV[4], 'last_error', ARGV[4], 'attempts', 0,
  unpack(ARGV, 7, 6 + 2 * n))
redis.call('ZADD', KEYS[2], now, ARGV[1])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[5]))
local journal, entry = journal_context(KEYS[3], ARGV, 7 + 2 * n)
journal_append(journal, KEYS[1], ARGV[1], 'dead', ARGV, entry)
journal_trim(journal, now)
return now

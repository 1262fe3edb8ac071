-- A finished job's line in the history (history.lua), for status() once its record
-- has expired. KEYS[1] the days map; ARGV[1] the buckets' prefix, ARGV[2] the job id.
-- Returns the line, or nil.
local _, line = history_find(KEYS[1], ARGV[1], ARGV[2])
return line

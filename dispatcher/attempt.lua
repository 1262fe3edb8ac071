-- A send of the job failed: count the attempt and keep the error. A script, not
-- two plain writes: a full Redis (noeviction) refuses plain writes, and lets a
-- script that has written finish (dispatcher/scripts.py).
-- KEYS[1] the job's record (hash)
-- ARGV[1] the error
-- Returns the attempts so far.
local attempts = redis.call('HINCRBY', KEYS[1], 'attempts', 1)
redis.call('HSET', KEYS[1], 'last_error', ARGV[1])
return attempts

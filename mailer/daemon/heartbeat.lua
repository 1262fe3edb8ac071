-- A replica's heartbeat: its note under a TTL, its place among the live replicas
-- until the TTL runs out, and the replicas whose time ran out dropped. A script,
-- not three commands: at maxmemory (noeviction) Redis refuses plain writes, and
-- lets a script that has written first finish (dispatcher/scripts.py), so that
-- a daemon draining a full Redis stays alive in every replica's eyes. What frees
-- memory goes first.
-- KEYS[1] the heartbeat (string), KEYS[2] the live replicas (zset: replica -> until ms)
-- ARGV[1] the note (JSON), ARGV[2] its TTL in seconds, ARGV[3] the replica,
-- ARGV[4] now in ms
local until_ms = ARGV[4] + ARGV[2] * 1000
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[4])
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
redis.call('ZADD', KEYS[2], until_ms, ARGV[3])
return 1

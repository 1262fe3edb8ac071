-- Layout 0 -> 1 (dispatcher/migrate.py): a record's legacy 'payload' field (a
-- pre-release layout) moves to its payload key, with the record's TTL. Safe to
-- run again on the same records: a moved field is gone, and an existing key is
-- never overwritten (the claim wrote it since, and it is the newer).
-- KEYS: per job, its record (hash) then its payload key (string)
-- Returns how many fields moved.
local moved = 0
for i = 1, #KEYS, 2 do
  local payload = redis.call('HGET', KEYS[i], 'payload')
  if payload then
    local ttl = redis.call('PTTL', KEYS[i])
    if redis.call('EXISTS', KEYS[i + 1]) == 0 then
      if ttl > 0 then
        redis.call('SET', KEYS[i + 1], payload, 'PX', ttl)
      else
        redis.call('SET', KEYS[i + 1], payload)
      end
    end
    redis.call('HDEL', KEYS[i], 'payload')
    moved = moved + 1
  end
end
return moved

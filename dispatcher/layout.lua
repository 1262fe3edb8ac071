-- The key layout's version (dispatcher/layout.py), stamped on a store with no data.
-- KEYS[1] the layout version (string), KEYS[2..] keys every store with data holds one of
-- ARGV[1] the layout this fairpost writes
-- Returns the version as stored ('' when there is none and the store has data:
-- written before versions, 0.1.0's "layout 0"); a store with no data is stamped
-- with ARGV[1] and that is returned.
local found = redis.call('GET', KEYS[1])
if found then
  return found
end
for i = 2, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    return ''
  end
end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]

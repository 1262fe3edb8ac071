-- Claim jobs for sending: two receivers of one SQS message (an emulator's
-- race, a visibility that ran out mid-send) must not both send it.
-- KEYS[1..n]    the jobs' records
-- KEYS[n+1..2n] the jobs' sending markers, in the same order
-- ARGV[1]       marker lifetime in ms (a sender that dies mid-send loses its
--               claim after this, as its SQS message comes back)
-- ARGV[2..n+1]  optional: each job's claimant, the marker's value; a marker its
--               claimant holds already is its own again (a claim tried again
--               after its answer was lost, or after a later step failed)
-- Returns, per job: 1 claimed (send it), 0 another sender holds it now,
-- 2 already final (sent, dead or suppressed: delete the message), 3 no record (purged,
-- expired, or never written: nothing says it may go, so drop the message)
local n = #KEYS / 2
local out = {}
for i = 1, n do
  local state = redis.call('HGET', KEYS[i], 'state')
  if not state then
    out[i] = 3
  elseif state == 'sent' or state == 'dead' or state == 'suppressed' then
    out[i] = 2
  elseif redis.call('SET', KEYS[n + i], ARGV[1 + i] or '1', 'NX', 'PX', ARGV[1]) then
    out[i] = 1
  elseif ARGV[1 + i] and redis.call('GET', KEYS[n + i]) == ARGV[1 + i] then
    redis.call('PEXPIRE', KEYS[n + i], ARGV[1])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out

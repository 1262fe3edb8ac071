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
-- Sized from the start for the usual group (a table grown one field at a time
-- rehashes at each power of two); the fields past n are cleared below.
local out = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
local life = ARGV[1]
for i = 1, n do
  local state = redis.call('HGET', KEYS[i], 'state')
  if not state then
    out[i] = 3
  elseif state == 'sent' or state == 'dead' or state == 'suppressed' then
    out[i] = 2
  else
    local claimant = ARGV[1 + i]
    local marker = KEYS[n + i]
    -- NX with GET: set if absent (then nil), else the holder, in one command (a
    -- bare SET NX answers a status, a table made for each job).
    local holder = redis.call('SET', marker, claimant or '1', 'NX', 'PX', life, 'GET')
    if not holder then
      out[i] = 1
    elseif claimant and holder == claimant then
      redis.call('PEXPIRE', marker, life)
      out[i] = 1
    else
      out[i] = 0
    end
  end
end
for i = n + 1, 10 do
  out[i] = nil
end
return out

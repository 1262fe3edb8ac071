-- The quota's restamp: a sent mail's units counted from when SES answered
-- (windows.lua). KEYS: the windows; ARGV[2]: the grant's at_ms; ARGV[rest]:
-- the cost. Returns {the server time (ms) the units now count from}.

local windows, rest = read_windows(#KEYS)
-- A send SES accepted: its units move from the grant's bucket to the
-- moment the call returned. SES counts a mail when it arrives, which is
-- somewhere between the two; counting it from the grant until a window
-- after the return covers wherever it landed, so a slow call followed by
-- a fast one cannot put two windows' worth of mail into one at SES.
local cost = num(ARGV[rest])
local returned = server_now_ms()
for _, win in ipairs(windows) do
    move(win, win.current, cost, math.floor(returned / win.width), returned)
end
return { returned }

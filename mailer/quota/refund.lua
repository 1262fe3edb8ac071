-- The quota's refund: a grant's units given back (windows.lua). KEYS: the
-- windows; ARGV[2]: the grant's at_ms; ARGV[rest]: the cost. Returns {}.

local windows, rest = read_windows(#KEYS)
local cost = num(ARGV[rest])
for _, win in ipairs(windows) do
    move(win, win.current, cost, nil, now)
end
return {}

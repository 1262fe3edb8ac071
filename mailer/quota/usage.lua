-- The quota's usage: the count of each window (windows.lua). KEYS: the
-- windows. Returns {now_ms, count of window 1, count of window 2, ...}.

local windows = read_windows(#KEYS)
local result = { now }
for i, win in ipairs(windows) do
    count(win)
    result[i + 1] = win.total
end
return result

-- The quota's peek: an acquire that writes nothing (windows.lua). KEYS: the
-- windows. Returns {granted, retry_ms, blocked, now_ms, never, binding}.

local windows, rest = read_windows(#KEYS)
local granted, retry_ms, blocked, never_index, binding = decide(windows, rest, nil, true)
return { granted, retry_ms, blocked, now, never_index, binding }

-- tick: a process's periodic look at the breaker. It moves an open breaker
-- whose cool-down is over to half-open, frees the places of probes whose
-- process died, and keeps the pause flags right. Returns result(...).
local now = nowMs()
local before = advance(now)
return result(before, now)

-- fence_read: when each of the given jobs of one queue was last taken
-- from a process that stopped answering (lua/recover_job.lua), against
-- the clock of the node that holds the set.
-- KEYS: 1 the queue's fenced set. ARGV: job ids.
-- Returns {now ms, then per id its recovery time ms or -1}.
local t = redis.call("TIME")
local out = {tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)}
for i, id in ipairs(ARGV) do
  local s = redis.call("ZSCORE", KEYS[1], id)
  out[i + 1] = s and tonumber(s) or -1
end
return out

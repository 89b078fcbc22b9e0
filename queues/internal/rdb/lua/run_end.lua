-- end: a job of the run came back from its handler: it succeeded, failed
-- for good, was cancelled, or goes back to its queue (a retry, a stop).
-- A job that already ended keeps its first end. In a cancelled run, a job
-- going back to its queue is cancelled instead.
-- ARGV: run ID, keep ms, job ID, state, tier, queue, reason.
-- Returns {changed (1/0), the steps due ("" for none)}.
local v = redis.call("HGET", jobsKey, ARGV[3])
if not v then return {0, ""} end
local state, tier = parse(v)
if terminal[state] then return {0, ""} end
local to = ARGV[4]
if to == "queued" and redis.call("HEXISTS", runKey, "cancelled") == 1 then to = "cancelled" end
move(ARGV[3], state, tier, to, ARGV[5], ARGV[6], ARGV[7])
return {1, settle(tonumber(ARGV[2]))}

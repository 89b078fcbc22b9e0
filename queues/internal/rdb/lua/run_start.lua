-- start: a job of the run is about to run (in tier, queue).
-- ARGV: run ID, keep ms, job ID, tier, queue.
-- Returns "run" (go ahead), "cancelled" (its run was cancelled: it ends
-- as cancelled and does not run), "succeeded" or "failed" (it already
-- ended, for example in a worker killed before asynq heard of it: it does
-- not run again), or "unknown" (not in the run, or the run's record is
-- gone: it runs as any job).
local v = redis.call("HGET", jobsKey, ARGV[3])
if not v then return "unknown" end
local state, tier, queue, reason = parse(v)
if terminal[state] then return state end
if redis.call("HEXISTS", runKey, "cancelled") == 1 then
  move(ARGV[3], state, tier, "cancelled", tier, queue, "cancelled with its run")
  settle(tonumber(ARGV[2]))
  return "cancelled"
end
move(ARGV[3], state, tier, "running", ARGV[4], ARGV[5], "")
return "run"

-- admit: may a job start? Asked by a process that does not know the
-- breaker to be closed. ARGV[8]: the job's member (job@queue).
-- Returns result(...) followed by "run" (closed), "probe" (half-open: the
-- job is one of the probes) or "wait" (open, or half-open with every probe
-- taken: the job goes back to its queue).
local member = ARGV[8]
local now = nowMs()
advance(now)
local st = current()
if st == "closed" then return result(now, "run") end
if st == "open" then return result(now, "wait") end
if not probeRoom(now) then
  pauseAll()
  return result(now, "wait")
end
redis.call("ZADD", probesKey, now + probeTtl, member)
if not probeRoom(now) then pauseAll() end
return result(now, "probe")

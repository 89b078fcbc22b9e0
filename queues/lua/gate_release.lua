-- release: free a job's slot (or, for a job that gave up waiting, its
-- place among the waiters); with an empty member, the keeper's tick, which
-- drops what processes that died left behind.
-- ARGV: configured size (an operator's resize wins: effectiveSize), member,
-- n, wake channel, strict ("1"/"0"), the start rate's interval ms and burst
-- (0: none), the steering ("reserved:maxWaitMs," per rank, or "": see
-- setSteering), lease TTL ms, the calling process.
--
-- Every free slot goes at once to the best waiters that may take it (take,
-- granting): their leases are written here, held by their processes, so
-- no further call is needed before they start. The grants to this
-- process are returned; those to other processes are published on the
-- wake channel ("g", then one "process<TAB>member" line each). When room
-- is left and jobs still wait (a rule held them back), "1" is published:
-- every waiter asks again. Settles the pause flags. Returns {count, the
-- members granted to the calling process...}.
local member, n, channel, strict = ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5] == "1"
local size = effectiveSize(n, ARGV[1])
setRate(ARGV[6], ARGV[7])
setSteering(ARGV[8], n)
local ttl, process = tonumber(ARGV[9]), ARGV[10]
local now = nowMs()
if member ~= "" then
  redis.call("ZREM", leases, member)
  redis.call("HDEL", holders, member)
  forgetWaiter(member)
else
  dropExpired(now)
end
local count = redis.call("ZCARD", leases)
local out, remote = {0}, {}
if count < size and redis.call("ZCARD", waiting) > 0 and not inGrace(now) then
  dropExpiredWaiters(now)
  local ranks = rankOf(n)
  -- Waiters in order, best first; GRANT_SCAN bounds the work. Without
  -- reservations, a waiter that may not go means none behind it may.
  local GRANT_SCAN = 32
  for _, w in ipairs(redis.call("ZRANGE", waiting, 0, GRANT_SCAN - 1)) do
    if count >= size then break end
    local proc, r = redis.call("HGET", waitprocs, w), memberRank(ranks, w)
    local taken = false
    if proc and r then
      local c
      taken, c = take(n, size, w, r, proc, ttl, strict, 0, now, true)
      if taken then
        count = c
        if proc == process then out[#out + 1] = w else remote[#remote + 1] = proc .. "\t" .. w end
      end
    end
    if not taken and not reserving then break end
  end
end
settle(n, size, count, strict, now)
if #remote > 0 then redis.call("PUBLISH", channel, "g\n" .. table.concat(remote, "\n")) end
if count < size and redis.call("ZCARD", waiting) > 0 then redis.call("PUBLISH", channel, "1") end
out[1] = count
return out

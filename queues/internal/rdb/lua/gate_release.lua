-- release: free a job's slot (or, for a job that gave up waiting, its
-- place among the waiters); with an empty member, the keeper's tick, which
-- drops what processes that died left behind and ranks the waiters by the
-- tier order in effect (reRankWaiters).
-- ARGV: configured size (an operator's resize wins: effectiveSize), member,
-- n, wake channel, strict ("1"/"0"), the start rate's interval ms and burst
-- (0: none), the steering ("reserved:maxWaitMs," per rank, or "": see
-- setSteering), lease TTL ms, the calling process.
-- A member is freed only where the calling process holds it (freeOwn).
-- Hands the free slots to the best waiters (grantFree), settles the pause
-- flags and announces. Returns {count, the members granted to the calling
-- process...}.
local member, n, channel, strict = ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5] == "1"
local size = effectiveSize(n, ARGV[1])
setRate(ARGV[6], ARGV[7])
setSteering(ARGV[8], n)
local ttl, process = tonumber(ARGV[9]), ARGV[10]
local now = nowMs()
if member ~= "" then
  freeOwn(member, process)
else
  dropExpired(n, now)
  reRankWaiters(n, strict)
  -- Places kept by a process of an earlier version, which set no mark:
  -- marked here (with the places' own expiry), so that every call sees
  -- them from the next one on.
  if placesMarked == false then
    local pttl = redis.call("PTTL", places)
    if pttl > 0 then
      redis.call("SET", placesMark, "1", "PX", pttl)
      placesLeft = nil
    end
  end
end
local count, mine, others = grantFree(n, size, card(leases), strict, ttl, process, now)
settle(n, size, count, strict, now)
announce(channel, size, count, others)
local out = {count}
for _, m in ipairs(mine) do out[#out + 1] = m end
return out

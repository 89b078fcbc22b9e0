-- release: free a job's slot; with an empty member, the keeper's tick,
-- which drops what processes that died left behind.
-- ARGV: configured size (an operator's resize wins: effectiveSize), member,
-- n, wake channel, strict ("1"/"0"), the start rate's interval ms and burst
-- (0: none), the steering ("reserved:maxWaitMs," per rank, or "": see
-- setSteering).
-- Settles the pause flags and, when the pool has room and jobs wait for
-- it, tells the waiters (PUBLISH). Returns the count.
local member, n, channel, strict = ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5] == "1"
local size = effectiveSize(n, ARGV[1])
setRate(ARGV[6], ARGV[7])
setSteering(ARGV[8], n)
local now = nowMs()
if member ~= "" then
  redis.call("ZREM", leases, member)
  redis.call("HDEL", holders, member)
else
  dropExpired(now)
end
local count = redis.call("ZCARD", leases)
settle(n, size, count, strict, now)
if count < size and redis.call("ZCARD", waiting) > 0 then redis.call("PUBLISH", channel, "1") end
return count

-- renew: extend the leases of the jobs this process runs, re-adding any
-- that lapsed (during a Redis outage longer than the lease, say): a job
-- that still runs holds its slot, whatever the count says.
-- ARGV: lease TTL ms, process, recovery grace ms (0: none), then the
-- members. After an outage (grace > 0), nothing new is admitted for the
-- grace, so that every process still running jobs re-adds them before
-- any slot is given out again. Returns the count.
local ttl, process, graceMs = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local now = nowMs()
for i = 4, #ARGV do
  redis.call("ZADD", leases, now + ttl, ARGV[i])
  redis.call("HSET", holders, ARGV[i], process)
end
if graceMs > 0 then
  local g = tonumber(redis.call("GET", grace) or "0")
  if now + graceMs > g then redis.call("SET", grace, tostring(now + graceMs), "PX", graceMs) end
end
return redis.call("ZCARD", leases)

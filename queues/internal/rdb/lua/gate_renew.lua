-- renew: extend the leases of the jobs this process runs. ARGV: lease TTL
-- ms, process, recovery grace ms (0: none), mode, then the members. Mode
-- "XX" only extends leases that exist (a normal renewal, which must never
-- bring back a slot a release has just freed); "ADD" also re-adds those
-- that lapsed (after a Redis outage longer than a lease): a job that still
-- runs holds its slot, whatever the count says. With a grace, nothing new
-- is admitted for that long, so that every process still running jobs
-- re-adds them before any slot is given out again. Returns the count.
local ttl, process, graceMs, mode = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]), ARGV[4]
local now = nowMs()
for i = 5, #ARGV do
  if mode == "ADD" then
    redis.call("ZADD", leases, now + ttl, ARGV[i])
    redis.call("HSET", holders, ARGV[i], process)
  else
    redis.call("ZADD", leases, "XX", now + ttl, ARGV[i])
  end
end
if graceMs > 0 then
  local g = tonumber(redis.call("GET", grace) or "0")
  if now + graceMs > g then redis.call("SET", grace, tostring(now + graceMs), "PX", graceMs) end
end
return redis.call("ZCARD", leases)

local leases, waiting, waitexp, holders = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now, size, member, n = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
if member ~= "" then
  redis.call("ZREM", leases, member)
  redis.call("HDEL", holders, member)
else
  -- The keeper's tick: drop what processes that died left behind.
  for _, m in ipairs(redis.call("ZRANGEBYSCORE", leases, "-inf", now)) do
    redis.call("ZREM", leases, m)
    redis.call("HDEL", holders, m)
  end
  local stale = redis.call("ZRANGEBYSCORE", waitexp, "-inf", now)
  for _, w in ipairs(stale) do
    redis.call("ZREM", waiting, w)
    redis.call("ZREM", waitexp, w)
  end
end
local count = redis.call("ZCARD", leases)
if count < size then
  for i = 1, n do
    if redis.call("GET", KEYS[4 + i]) == "compartment-gate" then redis.call("DEL", KEYS[4 + i]) end
  end
  if redis.call("ZCARD", waiting) > 0 then redis.call("PUBLISH", ARGV[5], "1") end
else
  for i = 1, n do redis.call("SET", KEYS[4 + i], "compartment-gate", "NX") end
end
return count

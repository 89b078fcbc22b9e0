-- announce: a worker process says how many of a cluster-scoped pool's jobs
-- it can run at once, for GateLeaseTTL, or (ttl 0) that it stops running
-- the pool. Processes whose word lapsed are dropped. KEYS: the processes'
-- capacities (hash), when each lapses (sorted set, Redis's clock in ms),
-- the size an operator set. ARGV: process, its capacity, ttl ms.
-- Returns {operator's size or 0, live processes, their capacity}.
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local process, capacity, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
if ttl > 0 then
  redis.call("HSET", KEYS[1], process, capacity)
  redis.call("ZADD", KEYS[2], now + ttl, process)
  redis.call("PEXPIRE", KEYS[1], 4 * ttl)
  redis.call("PEXPIRE", KEYS[2], 4 * ttl)
else
  redis.call("HDEL", KEYS[1], process)
  redis.call("ZREM", KEYS[2], process)
end
for _, p in ipairs(redis.call("ZRANGEBYSCORE", KEYS[2], "-inf", now)) do
  redis.call("HDEL", KEYS[1], p)
  redis.call("ZREM", KEYS[2], p)
end
local live = redis.call("ZRANGE", KEYS[2], 0, -1)
local sum = 0
for _, p in ipairs(live) do sum = sum + (tonumber(redis.call("HGET", KEYS[1], p) or "0") or 0) end
return {tonumber(redis.call("GET", KEYS[3]) or "0") or 0, #live, sum}

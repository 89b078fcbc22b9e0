-- counted: how many jobs of a pool with a circuit breaker have a failure
-- count, after dropping the entries whose count has expired. KEYS: 1 the
-- pool's counted set (see lua/breaker_count.lua).
local t = redis.call("TIME")
local nowMs = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", nowMs)
return redis.call("ZCARD", KEYS[1])

-- count: count one failure against a job of a pool with a circuit breaker.
-- KEYS: 1 the job's failure count, 2 the pool's counted set (the jobs that
-- have a count, scored by when it expires, ms in Redis's clock). ARGV: 1
-- the job (job@queue), 2 the count's lifetime in ms. The job enters the set
-- before its count is made, and both expire together, so the set is never
-- empty while a count exists (breaker.clearCounts relies on it). Returns
-- the job's count.
local t = redis.call("TIME")
local nowMs = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call("ZADD", KEYS[2], nowMs + ttl, ARGV[1])
redis.call("PEXPIRE", KEYS[2], ttl)
local n = redis.call("INCR", KEYS[1])
redis.call("PEXPIRE", KEYS[1], ttl)
return n

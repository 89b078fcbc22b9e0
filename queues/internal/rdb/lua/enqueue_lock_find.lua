-- For each job: take its enqueue lock (SET NX with a TTL, holding this
-- call's token) and, when taken, look for the job's hash in each of its
-- pool's queues. A job found in none is new: any failure count left under
-- its ID (in a pool with a circuit breaker) is a finished run's, which
-- the new run must not inherit, so it is deleted (see breaker.clearCounts).
-- KEYS, per job: its lock key, its k task keys in its pool's queues
-- (highest tier first), and when c > 0 the pool breaker's counted set and
-- c failure count keys. On a Redis Cluster one call holds the jobs of one
-- pool, whose keys share a slot.
-- ARGV: the lock TTL in ms, the token, then per job: k, c, and the c
-- members (job@queue) of the counted set, parallel to the count keys.
-- Returns per job "locked" (another client holds the lock), "new", or
-- "<i>:<state>" for the first queue i (1-based) that holds the job.
local ttl, token, out = ARGV[1], ARGV[2], {}
local ki, ai = 1, 3
while ai <= #ARGV do
  local k, c = tonumber(ARGV[ai]), tonumber(ARGV[ai + 1])
  if redis.call("SET", KEYS[ki], token, "NX", "PX", ttl) then
    local found = "new"
    for j = 1, k do
      local st = redis.call("HGET", KEYS[ki + j], "state")
      if st then
        found = j .. ":" .. st
        break
      end
    end
    if found == "new" and c > 0 then
      local counted = KEYS[ki + k + 1]
      for j = 1, c do
        redis.call("DEL", KEYS[ki + k + 1 + j])
        redis.call("ZREM", counted, ARGV[ai + 1 + j])
      end
    end
    out[#out + 1] = found
  else
    out[#out + 1] = "locked"
  end
  ki = ki + 1 + k
  if c > 0 then ki = ki + 1 + c end
  ai = ai + 2 + c
end
return out

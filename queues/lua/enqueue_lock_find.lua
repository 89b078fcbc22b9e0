-- For each job: take its enqueue lock (SET NX with a TTL, holding this
-- call's token) and, when taken, look for the job's hash in each of its
-- pool's queues. A job found in none is new: any failure count left under
-- its ID (in a pool with a circuit breaker) is a finished run's, which
-- the new run must not inherit, so it is deleted (see breaker.clearCounts).
-- ARGV: the lock TTL in ms, the token, then per job its lock key, the
-- number k of its pool's queues, and its k task keys (highest tier first),
-- then the number c of failure counts to clear when new, and when c > 0
-- the pool breaker's counted set and c pairs: a count key, its member
-- (job@queue) in that set.
-- Returns per job "locked" (another client holds the lock), "new", or
-- "<i>:<state>" for the first queue i (1-based) that holds the job.
local ttl, token, out = ARGV[1], ARGV[2], {}
local i = 3
while i <= #ARGV do
  local k = tonumber(ARGV[i + 1])
  local c = tonumber(ARGV[i + 2 + k])
  if redis.call("SET", ARGV[i], token, "NX", "PX", ttl) then
    local found = "new"
    for j = 1, k do
      local st = redis.call("HGET", ARGV[i + 1 + j], "state")
      if st then
        found = j .. ":" .. st
        break
      end
    end
    if found == "new" and c > 0 then
      local counted = ARGV[i + 3 + k]
      for j = 1, c do
        local at = i + 3 + k + 2 * j - 1
        redis.call("DEL", ARGV[at])
        redis.call("ZREM", counted, ARGV[at + 1])
      end
    end
    out[#out + 1] = found
  else
    out[#out + 1] = "locked"
  end
  i = i + 3 + k
  if c > 0 then i = i + 1 + 2 * c end
end
return out

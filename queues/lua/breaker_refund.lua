-- refund: give back one counted failure of each job whose failure tripped
-- the breaker (the outage's fault, not the job's), and bring its retry
-- forward to now: it waits in its queue, paused, for the close, rather than
-- coming back on its own backoff long after. KEYS: n failure count keys,
-- then the n jobs' asynq retry sets. ARGV: n, then the n job IDs. A count
-- never goes below zero; a job not waiting for a retry is left alone.
local n = tonumber(ARGV[1])
local t = redis.call("TIME")
for i = 1, n do
  local key = KEYS[i]
  local v = tonumber(redis.call("GET", key) or "0")
  if v > 1 then redis.call("DECR", key) elseif v == 1 then redis.call("DEL", key) end
  redis.call("ZADD", KEYS[n + i], "XX", tonumber(t[1]), ARGV[1 + i])
end
return 0

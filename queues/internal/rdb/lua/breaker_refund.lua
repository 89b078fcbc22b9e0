-- refund: give back one counted failure of each job whose failure tripped
-- the breaker (the outage's fault, not the job's), and bring its retry
-- forward to now: it waits in its queue, paused, for the close, rather than
-- coming back on its own backoff long after. KEYS: n failure count keys,
-- then the n jobs' asynq retry sets, then the pool's late set. ARGV: n, a
-- flag, the n job IDs, then the n members (job@queue). A count never goes
-- below zero. A job not in its retry set yet (its handler returned a
-- moment before the trip and asynq has not written the retry) goes into
-- the late set when the flag is 1, so that the next tick brings its retry
-- forward once asynq has written it (lua/breaker_late.lua).
local n = tonumber(ARGV[1])
local late = ARGV[2] == "1"
local t = redis.call("TIME")
local nowMs = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 1, n do
  local key = KEYS[i]
  local v = tonumber(redis.call("GET", key) or "0")
  if v > 1 then redis.call("DECR", key) elseif v == 1 then redis.call("DEL", key) end
  local id = ARGV[2 + i]
  if redis.call("ZSCORE", KEYS[n + i], id) then
    redis.call("ZADD", KEYS[n + i], "XX", tonumber(t[1]), id)
  elseif late then
    redis.call("ZADD", KEYS[2 * n + 1], "NX", nowMs, ARGV[2 + n + i])
  end
end
if late and redis.call("EXISTS", KEYS[2 * n + 1]) == 1 then redis.call("PEXPIRE", KEYS[2 * n + 1], 60000) end
return 0

-- force: an operator's command. ARGV[8]: "open" (open until closed or
-- reset), "close" (closed, and it does not trip until reset) or "reset"
-- (closed and counting again, backoff and counts cleared).
-- Returns result(...).
local action = ARGV[8]
local now = nowMs()
if action == "open" then
  redis.call("HSET", stateKey, "forced", "open")
  open("forced open by an operator", now, false, true)
  redis.call("HSET", stateKey, "calls", 0, "failures", 0, "slow", 0)
elseif action == "close" then
  redis.call("HSET", stateKey, "forced", "closed")
  close("forced closed by an operator", now)
  redis.call("HSET", stateKey, "calls", 0, "failures", 0, "slow", 0)
else
  redis.call("HDEL", stateKey, "forced")
  close("reset by an operator", now)
  redis.call("HSET", stateKey, "calls", 0, "failures", 0, "slow", 0)
end
return result(now)

-- resume: lift the operator's pauses of KEYS (asynq paused keys), leaving
-- the gate's (ARGV[1]) and a circuit breaker's (ARGV[2]): each lifts its
-- own. Returns how many it lifted.
local n = 0
for _, key in ipairs(KEYS) do
  local v = redis.call("GET", key)
  if v and v ~= ARGV[1] and v ~= ARGV[2] then redis.call("DEL", key); n = n + 1 end
end
return n

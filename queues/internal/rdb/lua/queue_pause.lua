-- pause: an operator pauses a queue (KEYS[1], its asynq paused key),
-- across every worker process, as asynq's own tools do: the key holds the
-- time (ARGV[3], Unix seconds). A pause the gate (ARGV[1]) or a circuit
-- breaker (ARGV[2]) set is replaced, since each lifts only its own and the
-- operator's must outlast both; an operator's pause stays as it is.
local v = redis.call("GET", KEYS[1])
if not v or v == ARGV[1] or v == ARGV[2] then redis.call("SET", KEYS[1], ARGV[3]) end
return 0

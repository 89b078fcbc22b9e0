-- clear: remove the breaker of a pool that now runs without one. KEYS:
-- 1..6 the breaker's keys (state, window, suspects, probes, late set,
-- counted set), deleted; then the paused key of each of the pool's queues,
-- deleted only where the breaker's mark (ARGV[1]) is set, so that an
-- operator's pause and the gate's stay. Returns how many pauses it lifted.
local lifted = 0
for i = 7, #KEYS do
  if redis.call("GET", KEYS[i]) == ARGV[1] then
    redis.call("DEL", KEYS[i])
    lifted = lifted + 1
  end
end
redis.call("DEL", KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6])
return lifted

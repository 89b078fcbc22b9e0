-- clear: lift the pauses the gate set (value "compartment-gate") on the
-- queues whose paused keys are KEYS; an operator's pause stays.
for _, key in ipairs(KEYS) do
  if redis.call("GET", key) == "compartment-gate" then redis.call("DEL", key) end
end
return 0

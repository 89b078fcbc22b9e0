-- adaptive_clear: drop a pool's adaptive limit (the pool is no longer
-- adaptive): its state and windows, and the size it wrote, unless an
-- operator's size is in effect, in one step so that an operator's resize
-- cannot fall between the read and the delete.
-- KEYS: 1 state, 2 windows, 3 size key.
local written = redis.call("HGET", KEYS[1], "written")
local size = redis.call("GET", KEYS[3])
if redis.call("HGET", KEYS[1], "operator") ~= "1" and size and size == written then
  redis.call("DEL", KEYS[3])
end
redis.call("DEL", KEYS[1], KEYS[2])
return 1

-- adaptive_override: an operator's size for an adaptive pool (ARGV[1] a
-- size), or its reset (ARGV[1] ""), in one step with the mark that keeps
-- the adaptive limit from writing the size meanwhile.
-- KEYS: 1 state, 2 size key, 3 change log. ARGV: 1 size or "", 2 log
-- length kept.
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[1] ~= "" then
  redis.call("SET", KEYS[2], ARGV[1])
  redis.call("HSET", KEYS[1], "operator", "1")
  redis.call("LPUSH", KEYS[3], now .. "|-|" .. ARGV[1] .. "|an operator resized the pool (the adaptive limit waits for a reset)")
else
  if redis.call("HGET", KEYS[1], "operator") == "1" then
    redis.call("LPUSH", KEYS[3], now .. "|-|-|an operator reset the size: the adaptive limit holds again")
  end
  redis.call("HDEL", KEYS[1], "operator")
  local limit = tonumber(redis.call("HGET", KEYS[1], "limit") or "")
  if limit then
    local to = math.floor(limit + 0.5)
    redis.call("SET", KEYS[2], to)
    redis.call("HSET", KEYS[1], "written", to)
  else
    redis.call("DEL", KEYS[2])
  end
end
redis.call("LTRIM", KEYS[3], 0, tonumber(ARGV[2]) - 1)
return 1

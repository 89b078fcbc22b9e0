-- unlock: release the enqueue locks KEYS that still hold this call's token
-- (ARGV[1]); a lock that expired and was taken by another client stays.
-- Returns how many locks it released.
local n = 0
for _, key in ipairs(KEYS) do
  if redis.call("GET", key) == ARGV[1] then
    redis.call("DEL", key)
    n = n + 1
  end
end
return n

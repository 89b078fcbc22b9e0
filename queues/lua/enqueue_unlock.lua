-- unlock: release the enqueue locks KEYS that still hold this call's token
-- (ARGV[1]); a lock that expired and was taken by another client stays.
for _, key in ipairs(KEYS) do
  if redis.call("GET", key) == ARGV[1] then redis.call("DEL", key) end
end
return 0

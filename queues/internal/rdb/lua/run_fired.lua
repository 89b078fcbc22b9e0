-- fired: a run's due steps were enqueued: note it and take the run off
-- the due set. ARGV: run ID.
local due = redis.call("HGET", runKey, "due")
if due then
  redis.call("HSET", runKey, "fired", due)
  redis.call("HDEL", runKey, "due")
end
redis.call("SREM", dueKey, ARGV[1])
return due or ""

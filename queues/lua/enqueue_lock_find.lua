-- For each job: take its enqueue lock (SET NX with a TTL, holding this
-- call's token) and, when taken, look for the job's hash in each of its
-- pool's queues.
-- ARGV: the lock TTL in ms, the token, then per job its lock key, the
-- number k of its pool's queues, and its k task keys (highest tier first).
-- Returns per job "locked" (another client holds the lock), "new", or
-- "<i>:<state>" for the first queue i (1-based) that holds the job.
local ttl, token, out = ARGV[1], ARGV[2], {}
local i = 3
while i <= #ARGV do
  local k = tonumber(ARGV[i + 1])
  if redis.call("SET", ARGV[i], token, "NX", "PX", ttl) then
    local found = "new"
    for j = 1, k do
      local st = redis.call("HGET", ARGV[i + 1 + j], "state")
      if st then
        found = j .. ":" .. st
        break
      end
    end
    out[#out + 1] = found
  else
    out[#out + 1] = "locked"
  end
  i = i + 2 + k
end
return out

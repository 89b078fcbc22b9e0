-- leases_unrenewed: the running jobs of a pool's queues whose asynq lease
-- went unrenewed for at least ARGV[1] ms, as far as Redis's clock can
-- tell (asynq writes a lease as the renewing worker's clock plus 30 s, in
-- whole seconds, and renews it every 5 s): for status, which shows the
-- jobs of a worker that stopped answering until they are taken back.
-- KEYS: the lease sets of the pool's queues. ARGV: 1 how long (ms).
-- Returns {now ms, then per job: its queue's index (from 1), its id, its
-- lease's expiry (s)}.
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cutoff = math.floor((now + 30000 - tonumber(ARGV[1])) / 1000)
local out = {now}
for i, key in ipairs(KEYS) do
  local l = redis.call("ZRANGEBYSCORE", key, "-inf", cutoff, "WITHSCORES")
  for j = 1, #l, 2 do
    out[#out + 1] = i
    out[#out + 1] = l[j]
    out[#out + 1] = tonumber(l[j + 1])
  end
end
return out

-- add: create a run (on its first call) and add jobs to it, each queued,
-- before they are enqueued, so that a job that starts at once finds its
-- place. A sealed run takes no more jobs.
-- ARGV: run ID, created (ms, the caller's clock; "0": Redis's), F, then F
-- label field/value pairs (set on the first call only), then per job: its
-- ID, tier and queue.
-- Returns {"ok", then per job 1 (added) or 0 (already in the run: it is
-- not added twice)}, or {"sealed"}.
if redis.call("HGET", runKey, "sealed") == "1" then return {"sealed"} end
local f = tonumber(ARGV[3])
if redis.call("EXISTS", runKey) == 0 then
  local created = tonumber(ARGV[2])
  if created == 0 then created = nowMs() end
  redis.call("HSET", runKey, "created", created)
  for i = 4, 3 + 2 * f, 2 do redis.call("HSET", runKey, ARGV[i], ARGV[i + 1]) end
  redis.call("ZADD", indexKey, created, ARGV[1])
end
local out = {"ok"}
for i = 4 + 2 * f, #ARGV - 2, 3 do
  if redis.call("HEXISTS", jobsKey, ARGV[i]) == 0 then
    move(ARGV[i], nil, nil, "queued", ARGV[i + 1], ARGV[i + 2], "")
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out

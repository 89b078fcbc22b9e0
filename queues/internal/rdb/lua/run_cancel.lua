-- cancel: cancel a run. Its queued jobs are cancelled here, in one step,
-- so that none of them starts after this returns (start reads the mark);
-- its running jobs end as cancelled when their handlers return.
-- ARGV: run ID, keep ms.
-- Returns {"missing"}, {"ended", ended ms}, {"already"}, or {"cancelled",
-- running count, then per queued job cancelled: its ID and queue}.
if redis.call("EXISTS", runKey) == 0 then return {"missing"} end
local ended = redis.call("HGET", runKey, "ended")
if ended then return {"ended", ended} end
if redis.call("HEXISTS", runKey, "cancelled") == 1 then return {"already"} end
redis.call("HSET", runKey, "cancelled", nowMs())
local out = {"cancelled", total("running")}
local all = redis.call("HGETALL", jobsKey)
for i = 1, #all, 2 do
  local state, tier, queue = parse(all[i + 1])
  if state == "queued" then
    move(all[i], state, tier, "cancelled", tier, queue, "cancelled with its run")
    out[#out + 1] = all[i]
    out[#out + 1] = queue
  end
end
-- A run cancelled before it was sealed takes no more jobs either.
redis.call("HSET", runKey, "sealed", "1")
settle(tonumber(ARGV[2]))
return out

-- drop: what became of jobs added to a run that were not enqueued: each
-- is refused (at the door) or dropped from the run (another job held its
-- ID, or the enqueue failed before it). Only a job still queued changes.
-- ARGV: run ID, keep ms, then per job: its ID and "refused" or "drop".
-- Returns the steps due ("" for none).
for i = 3, #ARGV - 1, 2 do
  local v = redis.call("HGET", jobsKey, ARGV[i])
  if v then
    local state, tier, queue = parse(v)
    if state == "queued" then
      if ARGV[i + 1] == "refused" then
        move(ARGV[i], state, tier, "refused", tier, queue, "refused at the door")
      else
        move(ARGV[i], state, tier, nil)
      end
    end
  end
end
return settle(tonumber(ARGV[2]))

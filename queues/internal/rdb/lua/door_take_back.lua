-- take back: remove jobs a batch wrote at the door that are still waiting,
-- when a later pool of the same batch refused it (a Redis Cluster admits a
-- batch's pools one after the other; see Client.admitEach). A job already
-- started, finished or gone stays.
-- KEYS, per job: its task hash, its queue's pending list and scheduled set.
-- ARGV: the job IDs, parallel to KEYS' triples.
-- Returns per job 1 if it was taken back, 0 if it stays.
local out = {}
for i = 1, #ARGV do
  local task, pending, scheduled = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local st = redis.call("HGET", task, "state")
  if st == "pending" and redis.call("LREM", pending, 0, ARGV[i]) > 0 then
    redis.call("DEL", task)
    out[i] = 1
  elseif st == "scheduled" and redis.call("ZREM", scheduled, ARGV[i]) > 0 then
    redis.call("DEL", task)
    out[i] = 1
  else
    out[i] = 0
  end
end
return out

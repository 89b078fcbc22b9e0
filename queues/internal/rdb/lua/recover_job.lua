-- recover_job: put back at the head of its queue a job whose worker
-- process stopped answering: its asynq lease still holds the expiry the
-- caller saw it hold for recover_after (nobody renewed it since) and, in a
-- cluster-scoped pool, its slot lease (if any) has lapsed. One atomic step,
-- as asynq's own Requeue (LREM active, ZREM lease, RPUSH pending: asynq
-- dequeues from the right, so the job is next), so that asynq's recoverer,
-- which also starts with LREM active, and the other processes' recoveries
-- take the job back at most once between them. No retry is used up: the
-- task's retry count is not touched. The job is noted in the queue's
-- fenced set, so the process, should it wake up, finishes nothing of it.
-- KEYS: 1 active, 2 lease, 3 pending, 4 the task, 5 fenced, 6 the gate's
-- leases, 7 the gate's holders.
-- ARGV: 1 id, 2 the lease expiry seen, 3 the gate member (<id>@<queue>),
-- 4 "1" for a cluster-scoped pool, 5 how long fenced entries are kept (ms).
-- Returns {1, now ms, the slot's holder or ""} when the job went back;
-- {0} when it is not there or its lease moved (renewed, finished, or
-- recovered by someone else); {-1} while its slot lease is still live.
local id, seen, member, gated, keep = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4] == "1", tonumber(ARGV[5])
local score = redis.call("ZSCORE", KEYS[2], id)
if not score or tonumber(score) ~= seen then return {0} end
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local holder = ""
if gated then
  local slot = redis.call("ZSCORE", KEYS[6], member)
  if slot and tonumber(slot) > now then return {-1} end
  holder = redis.call("HGET", KEYS[7], member) or ""
  if slot then
    redis.call("ZREM", KEYS[6], member)
    redis.call("HDEL", KEYS[7], member)
  end
end
if redis.call("LREM", KEYS[1], 0, id) == 0 then return {0} end
redis.call("ZREM", KEYS[2], id)
redis.call("RPUSH", KEYS[3], id)
redis.call("HSET", KEYS[4], "state", "pending")
redis.call("ZADD", KEYS[5], now, id)
redis.call("ZREMRANGEBYSCORE", KEYS[5], "-inf", now - keep)
redis.call("PEXPIRE", KEYS[5], keep)
return {1, now, holder}

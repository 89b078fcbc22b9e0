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
-- In a cluster-scoped pool the job also gets a place kept for it at the
-- head of its tier in the line of jobs waiting for a slot (the gate's
-- places, which lua/gate_lib.lua's take reads when the job, dequeued
-- again, asks: it holds nobody back, and counts for no pause, before), and
-- a pause the gate set on its queue is lifted, so that a worker with a
-- free hand dequeues it now; the gate settles the pause again at its next
-- call.
-- KEYS: 1 active, 2 lease, 3 pending, 4 the task, 5 fenced, 6 the gate's
-- leases, 7 the gate's holders, 8 the waiting line, 9 the gate's places,
-- 10 the queue's pause key, 11 the places' mark (set while places may be
-- kept: the gate looks at them only then).
-- ARGV: 1 id, 2 the lease expiry seen, 3 the gate member (<id>@<queue>),
-- 4 "1" for a cluster-scoped pool, 5 how long fenced entries are kept
-- (ms), 6 the job's place in the waiting line (its tier's rank x 1e13 and
-- an early time), 7 how long that place is kept (ms), 8 the holder that
-- marks a kept slot and 9 how long it is kept (ms): gate_lib.lua's KEPT
-- and KEEP_MS.
-- Returns {1, now ms, the slot's holder or ""} when the job went back;
-- {0} when it is not there or its lease moved (renewed, finished, or
-- recovered by someone else); {-1} while its slot lease is still live.
local id, seen, member, gated, keep = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4] == "1", tonumber(ARGV[5])
local score = redis.call("ZSCORE", KEYS[2], id)
if not score or tonumber(score) ~= seen then return {0} end
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local holder, slot = "", nil
if gated then
  slot = redis.call("ZSCORE", KEYS[6], member)
  if slot and tonumber(slot) > now then return {-1} end
end
if redis.call("LREM", KEYS[1], 0, id) == 0 then return {0} end
if slot then
  -- The lapsed slot (the gate does not free it while asynq leases the
  -- job: gate_lib.lua, dropExpired) becomes the slot kept for the job
  -- once it is dequeued again (gate_lib.lua, keepSlots and take): no
  -- waiter takes it in between.
  holder = redis.call("HGET", KEYS[7], member) or ""
  redis.call("ZADD", KEYS[6], now + tonumber(ARGV[9]), member)
  redis.call("HSET", KEYS[7], member, ARGV[8])
end
redis.call("ZREM", KEYS[2], id)
redis.call("RPUSH", KEYS[3], id)
redis.call("HSET", KEYS[4], "state", "pending")
redis.call("ZADD", KEYS[5], now, id)
redis.call("ZREMRANGEBYSCORE", KEYS[5], "-inf", now - keep)
redis.call("PEXPIRE", KEYS[5], keep)
if gated then
  -- A job that was running goes before one its process held ahead of a
  -- slot (still in the waiting line, not fresh): 1e9 (s) behind it, still
  -- ahead of any job that asked (whose place counts in ms).
  local place = tonumber(ARGV[6])
  if redis.call("ZSCORE", KEYS[8], member) then place = place + 1e9 end
  redis.call("HSET", KEYS[9], member, place)
  redis.call("PEXPIRE", KEYS[9], tonumber(ARGV[7]))
  redis.call("SET", KEYS[11], "1", "PX", tonumber(ARGV[7]))
  if redis.call("GET", KEYS[10]) == "compartment-gate" then redis.call("DEL", KEYS[10]) end
end
return {1, now, holder}

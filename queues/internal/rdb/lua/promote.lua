-- promote: move one waiting job (pending, scheduled or waiting for a
-- retry) from its tier's queue to another tier's queue of the same pool, in
-- one step: asynq's dequeue (pending -> active) and every other script see
-- the job in exactly one queue, before or after, never in both or none.
--
-- KEYS: 1 the job's task hash in its queue, 2 its task hash in the target
-- queue, 3-5 the source queue's pending list, scheduled set and retry set,
-- 6-8 the target queue's, 9-10 the job's failure count key in the source
-- and in the target queue, 11 the pool breaker's suspects set, 12 its late
-- set, 13 the pool breaker's set of jobs with a failure count; with a
-- unique lock (ARGV[6] = "1"), 14-15 the lock's key in the source and in
-- the target queue. Every key is the pool's: on a Redis Cluster they share
-- its slot. (asynq's set of queue names, global, is written by the caller
-- in a call of its own.)
-- ARGV: 1 job ID, 2 SHA-1 (hex) of the message the caller read, 3 the
-- message rewritten for the target queue, 4 the job's breaker member in
-- the source queue (id@queue), 5 in the target queue, 6 "1" when the
-- message holds a unique lock.
--
-- Returns {"moved", state} (state: the state it was moved in, kept),
-- {"state", state} (active, completed, archived, aggregating: not moved),
-- {"changed"} (the message is not the one the caller read: read again),
-- {"gone"} (no job in the source queue any more: look again), or
-- {"conflict", why} (nothing changed; why says what is in the way).
local src, dst = KEYS[1], KEYS[2]
local id, sha, msg = ARGV[1], ARGV[2], ARGV[3]

local st = redis.call("HGET", src, "state")
if not st then return {"gone"} end
if st ~= "pending" and st ~= "scheduled" and st ~= "retry" then
  return {"state", st}
end
local cur = redis.call("HGET", src, "msg")
if not cur or redis.sha1hex(cur) ~= sha then return {"changed"} end
if redis.call("EXISTS", dst) == 1 then
  return {"conflict", "a job with the same ID is already in the target queue"}
end

local srcList, dstList
if st == "pending" then
  srcList, dstList = KEYS[3], KEYS[6]
elseif st == "scheduled" then
  srcList, dstList = KEYS[4], KEYS[7]
else
  srcList, dstList = KEYS[5], KEYS[8]
end
local score = nil
if st ~= "pending" then
  score = redis.call("ZSCORE", srcList, id)
  if not score then return {"conflict", "the job's hash says " .. st .. " but it is not in that set"} end
end

-- asynq's unique lock (a job enqueued with asynq.Unique) names the queue:
-- it moves with the job when this job holds it.
local moveLock = false
if ARGV[6] == "1" and redis.call("GET", KEYS[14]) == id then
  if redis.call("EXISTS", KEYS[15]) == 1 then
    return {"conflict", "a job with the same type and payload holds the unique lock in the target queue"}
  end
  moveLock = true
end

-- Every check passed. The LREM is the last check and the first write.
if st == "pending" then
  if redis.call("LREM", srcList, -1, id) == 0 then
    return {"conflict", "the job's hash says pending but it is not in the pending list"}
  end
else
  redis.call("ZREM", srcList, id)
end
redis.call("RENAME", src, dst)
redis.call("HSET", dst, "msg", msg)
if moveLock then
  redis.call("RENAME", KEYS[14], KEYS[15])
end
if ARGV[6] == "1" and redis.call("HEXISTS", dst, "unique_key") == 1 then
  redis.call("HSET", dst, "unique_key", KEYS[15])
end
if st == "pending" then
  -- The tail of the target's pending list (asynq pushes new jobs on the
  -- left and dequeues from the right). Its wait in the new tier counts from
  -- now, by Redis's clock, so the list stays ordered by pending_since.
  local t = redis.call("TIME")
  redis.call("HSET", dst, "pending_since", t[1] .. string.format("%06d", tonumber(t[2])) .. "000")
  redis.call("LPUSH", dstList, id)
else
  -- Same due time: asynq's forwarder moves it to the target's pending list
  -- when it is due.
  redis.call("ZADD", dstList, score, id)
end

-- The failures counted against the job follow it; a stale count left in
-- the target queue under the same ID is not this job's.
if redis.call("EXISTS", KEYS[9]) == 1 then
  redis.call("RENAME", KEYS[9], KEYS[10])
else
  redis.call("DEL", KEYS[10])
end

-- The breaker knows a failed job as id@queue: a trip gives its failure
-- back and brings its retry forward in the queue it is in now, and its
-- count is found under the queue it is in now.
for _, set in ipairs({KEYS[11], KEYS[12], KEYS[13]}) do
  local s = redis.call("ZSCORE", set, ARGV[4])
  if s then
    redis.call("ZREM", set, ARGV[4])
    redis.call("ZADD", set, s, ARGV[5])
  end
end

return {"moved", st}

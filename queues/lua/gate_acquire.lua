-- acquire: may this job take one of the pool's slots?
-- ARGV: configured size (an operator's resize wins: effectiveSize), member, rank (1 = highest tier), n, process, lease TTL ms,
-- strict ("1"/"0"), then the n queue names, then the start rate's interval
-- ms and burst (0: none), then the steering ("reserved:maxWaitMs," per
-- rank, or "": see setSteering), then when the job was first ready to run
-- (ms, by the enqueuing process's clock; 0: unknown).
-- Returns {1, count, 0} when the slot was taken, {0, count, ms} when the
-- caller must wait (it is then a waiter, ranked by tier, then by when it
-- first asked); ms > 0 is when the start rate allows its start.
local member, rank, n = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local size = effectiveSize(n, ARGV[1])
local process, ttl, strict = ARGV[5], tonumber(ARGV[6]), ARGV[7] == "1"
setRate(ARGV[8 + n], ARGV[9 + n])
setSteering(ARGV[10 + n], n)
local now = nowMs()

-- A job that already holds its slot in this process (its earlier call took
-- it, but the reply was lost: a failover, a dropped connection) keeps it:
-- asking again must not make it wait behind its own lease. Another
-- process's lease under the same member (a copy of the job that asynq's
-- recoverer handed out while the first still runs) does not count: that
-- copy asks as any other job.
if redis.call("HGET", holders, member) == process and redis.call("ZSCORE", leases, member) then
  redis.call("ZADD", leases, now + ttl, member)
  redis.call("HSET", holders, member, process)
  if redis.call("ZREM", waiting, member) == 1 then redis.call("ZREM", waitexp, member) end
  return {1, redis.call("ZCARD", leases), 0}
end

local count = redis.call("ZCARD", leases)
if count >= size then
  -- Full, or holding leases of a process that died: drop expired ones.
  dropExpired(now)
  count = redis.call("ZCARD", leases)
end
-- A job asks as the top tier (rank 0) once it is aged: marked by the
-- starvation guard (agedTier), or waited past its tier's maximum wait,
-- counted from when it was first ready (ARGV) or, when that is unknown,
-- from when it first asked. An aged waiter is ranked among the aged by
-- that time; a waiter keeps the best rank it has had.
local readyAt = tonumber(ARGV[11 + n]) or 0
local prev = tonumber(redis.call("ZSCORE", waiting, member) or "-1")
local score = prev >= 0 and prev or (rank * 1e13 + now)
if aging and score >= 1e13 then
  local since = readyAt > 0 and readyAt or (score - rank * 1e13)
  local a = redis.call("ZSCORE", agedKey(n), member)
  if (a and tonumber(a) > now) or (maxWait[rank] > 0 and now - since > maxWait[rank]) then
    score = math.min(since, now)
  end
end
local myRank = math.floor(score / 1e13)
local ok = count < size and not inGrace(now)
-- Reservations: a job may take a slot only while the free slots exceed
-- what its tier must leave to the tiers above it.
local need, ranks = nil, nil
if ok and reserving then
  need, ranks = needs(n, size), rankOf(n)
  ok = size - count > need[rank]
end
if ok and redis.call("ZCARD", waiting) > 0 then
  dropExpiredWaiters(now)
  if need then
    -- The best waiter that may take a free slot now goes first: one a
    -- reservation holds back does not hold back the tiers it serves.
    local ws = redis.call("ZRANGE", waiting, 0, -1, "WITHSCORES")
    for j = 1, #ws, 2 do
      local r = memberRank(ranks, ws[j])
      if ws[j] == member or not r or size - count > need[r] then
        if ws[j] ~= member and tonumber(ws[j + 1]) < score then ok = false end
        break
      end
    end
  else
    local best = redis.call("ZRANGE", waiting, 0, 0, "WITHSCORES")
    if best[1] and best[1] ~= member and tonumber(best[2]) < score then ok = false end
  end
end
if ok then
  -- A job of a higher tier that was taken from its queue but has not asked
  -- yet goes first: it sits in asynq's active list with a fresh asynq lease
  -- (renewed in the last 5 s, so not left behind by a dead process), holds
  -- no slot and is no waiter. An aged job counts as the top tier.
  local nowS = math.floor(now / 1000)
  local function dequeuedNotAsked(i, id)
    local m = id .. "@" .. queueName(n, i)
    if m == member or redis.call("ZSCORE", leases, m) or redis.call("ZSCORE", waiting, m) then return false end
    return tonumber(redis.call("ZSCORE", asynqLeaseKey(n, i), id) or "0") > nowS + 24
  end
  for i = 1, myRank - 1 do
    for _, id in ipairs(redis.call("LRANGE", activeKey(n, i), 0, -1)) do
      if dequeuedNotAsked(i, id) then
        ok = false
        break
      end
    end
    if not ok then break end
  end
  -- Nor does any job go ahead of a job marked aged that is about to be
  -- dequeued: the head of its tier's queue, which the gate keeps open for
  -- it (not paused by an operator or a breaker), when a reservation does
  -- not hold it back. Otherwise jobs already waiting would take every slot
  -- that frees before any process dequeues it. A mark whose job is neither
  -- (deleted, moved) holds nothing back.
  if ok and aging and myRank > 0 then
    ranks = ranks or rankOf(n)
    for _, m in ipairs(redis.call("ZRANGEBYSCORE", agedKey(n), now, "+inf")) do
      local id, r = string.match(m, "^(.*)@[^@]*$"), memberRank(ranks, m)
      if id and r then
        local p = redis.call("GET", pausedKey(n, r))
        if dequeuedNotAsked(r, id) or ((not p or p == MARK) and (not need or size - count > need[r])
            and redis.call("LINDEX", pendingKey(n, r), -1) == id) then
          ok = false
          break
        end
      end
    end
  end
end
-- A job of a tier with a maximum wait that is not aged yet does not go
-- ahead of a higher tier's pending jobs: while an aged job's queue is the
-- only one open, other processes may dequeue the next jobs of its tier in
-- the same instant; they wait until they are aged themselves (or the
-- higher tiers run dry) instead of starting ahead of their turn.
if ok and aging and myRank > 0 and maxWait[rank] > 0 and firstPending(n, rank - 1) then ok = false end
local wait = 0
if ok then
  wait = rateWait(n, now)
  ok = wait == 0
end
if ok then
  rateTake(n, now)
  redis.call("ZADD", leases, now + ttl, member)
  redis.call("HSET", holders, member, process)
  if redis.call("ZREM", waiting, member) == 1 then redis.call("ZREM", waitexp, member) end
  if aging then redis.call("ZREM", agedKey(n), member) end
  count = count + 1
  settle(n, size, count, strict, now)
  -- Jobs that waited behind this aged one may go now if room is left.
  if myRank == 0 and count < size and redis.call("ZCARD", waiting) > 0 then
    redis.call("PUBLISH", leases .. ":freed", "1")
  end
  return {1, count, 0}
end
redis.call("ZADD", waiting, score, member)
redis.call("ZADD", waitexp, now + ttl, member)
-- A waiter keeps its aged rank in its score.
if aging then redis.call("ZREM", agedKey(n), member) end
settle(n, size, count, strict, now)
return {0, count, wait}

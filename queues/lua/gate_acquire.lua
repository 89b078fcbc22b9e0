-- acquire: may this job take one of the pool's slots?
-- ARGV: size, member, rank (1 = highest tier), n, process, lease TTL ms,
-- strict ("1"/"0"), then the n queue names, then the start rate's interval
-- ms and burst (0: none), then the steering ("reserved:maxWaitMs," per
-- rank, or "": see setSteering).
-- Returns {1, count, 0} when the slot was taken, {0, count, ms} when the
-- caller must wait (it is then a waiter, ranked by tier, then by when it
-- first asked); ms > 0 is when the start rate allows its start.
local size, member, rank, n = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local process, ttl, strict = ARGV[5], tonumber(ARGV[6]), ARGV[7] == "1"
setRate(ARGV[8 + n], ARGV[9 + n])
setSteering(ARGV[10 + n], n)
local now = nowMs()

local count = redis.call("ZCARD", leases)
if count >= size then
  -- Full, or holding leases of a process that died: drop expired ones.
  dropExpired(now)
  count = redis.call("ZCARD", leases)
end
-- A job marked aged by the starvation guard (agedTier) asks as the top
-- tier (rank 0); a waiter keeps the rank it first asked with.
local myRank = rank
if aging then
  local a = redis.call("ZSCORE", agedKey(n), member)
  if a and tonumber(a) > now then myRank = 0 end
end
local score = tonumber(redis.call("ZSCORE", waiting, member) or (myRank * 1e13 + now))
myRank = math.floor(score / 1e13)
local ok = count < size and not inGrace(now)
-- Reservations: a job may take a slot only while the free slots exceed
-- what its tier must leave to the tiers above it.
local need, ranks = nil, nil
if ok and reserving then
  need, ranks = needs(n), rankOf(n)
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
  if ok and aging and myRank > 0 then
    ranks = ranks or rankOf(n)
    for _, m in ipairs(redis.call("ZRANGEBYSCORE", agedKey(n), now, "+inf")) do
      local id, r = string.match(m, "^(.*)@[^@]*$"), memberRank(ranks, m)
      if id and r and dequeuedNotAsked(r, id) then
        ok = false
        break
      end
    end
  end
end
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
  return {1, count, 0}
end
redis.call("ZADD", waiting, score, member)
redis.call("ZADD", waitexp, now + ttl, member)
-- A waiter keeps its aged rank in its score.
if aging then redis.call("ZREM", agedKey(n), member) end
settle(n, size, count, strict, now)
return {0, count, wait}

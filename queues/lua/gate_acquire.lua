-- acquire: may this job take one of the pool's slots?
-- ARGV: configured size (an operator's resize wins: effectiveSize), member, rank (1 = highest tier), n, process, lease TTL ms,
-- strict ("1"/"0"), then the n queue names, then the start rate's interval
-- ms and burst (0: none).
-- Returns {1, count, 0} when the slot was taken, {0, count, ms} when the
-- caller must wait (it is then a waiter, ranked by tier, then by when it
-- first asked); ms > 0 is when the start rate allows its start.
local member, rank, n = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local size = effectiveSize(n, ARGV[1])
local process, ttl, strict = ARGV[5], tonumber(ARGV[6]), ARGV[7] == "1"
setRate(ARGV[8 + n], ARGV[9 + n])
local now = nowMs()

local count = redis.call("ZCARD", leases)
if count >= size then
  -- Full, or holding leases of a process that died: drop expired ones.
  dropExpired(now)
  count = redis.call("ZCARD", leases)
end
local score = tonumber(redis.call("ZSCORE", waiting, member) or (rank * 1e13 + now))
local ok = count < size and not inGrace(now)
if ok and redis.call("ZCARD", waiting) > 0 then
  dropExpiredWaiters(now)
  local best = redis.call("ZRANGE", waiting, 0, 0, "WITHSCORES")
  if best[1] and best[1] ~= member and tonumber(best[2]) < score then ok = false end
end
if ok then
  -- A job of a higher tier that was taken from its queue but has not asked
  -- yet goes first: it sits in asynq's active list with a fresh asynq lease
  -- (renewed in the last 5 s, so not left behind by a dead process), holds
  -- no slot and is no waiter.
  local nowS = math.floor(now / 1000)
  for i = 1, rank - 1 do
    local q = ARGV[7 + i]
    for _, id in ipairs(redis.call("LRANGE", activeKey(n, i), 0, -1)) do
      local m = id .. "@" .. q
      if not redis.call("ZSCORE", leases, m) and not redis.call("ZSCORE", waiting, m) then
        local exp = tonumber(redis.call("ZSCORE", asynqLeaseKey(n, i), id) or "0")
        if exp > nowS + 24 then
          ok = false
          break
        end
      end
    end
    if not ok then break end
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
  count = count + 1
  settle(n, size, count, strict, now)
  return {1, count, 0}
end
redis.call("ZADD", waiting, score, member)
redis.call("ZADD", waitexp, now + ttl, member)
settle(n, size, count, strict, now)
return {0, count, wait}

-- Shared by the gate's scripts (prepended to each). KEYS, with n queues:
--   1-5            leases, waiting, waitexp, holders, grace
--   6 .. 5+4n      per queue (highest tier first): its paused key, pending
--                  list, active list and asynq lease set (four blocks of n)
--   6+4n           the start rate's state (its theoretical arrival time)
--   7+4n           the pool's size set by an operator (Client.Resize)
--   8+4n           the aged marks (steering, see below)
-- New keys go at the end, after these.
--
-- The scripts also read the hash of a tier's oldest pending jobs
-- (asynq:{<queue>}:t:<id>, derived from the pending key) for the
-- starvation guard: the only keys they touch that are not in KEYS.
local leases, waiting, waitexp, holders, grace = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local MARK = "compartment-gate"

-- Every time is Redis's own clock, in milliseconds: no worker's clock
-- matters.
local function nowMs()
  local t = redis.call("TIME")
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function pausedKey(n, i) return KEYS[5 + i] end
local function pendingKey(n, i) return KEYS[5 + n + i] end
local function activeKey(n, i) return KEYS[5 + 2 * n + i] end
local function asynqLeaseKey(n, i) return KEYS[5 + 3 * n + i] end

local function startRateKey(n) return KEYS[6 + 4 * n] end
local function sizeKey(n) return KEYS[7 + 4 * n] end

-- effectiveSize returns the pool's size in effect: the one an operator set
-- (Client.Resize), read here at every call so that every process follows
-- it at once, or else the configured size the caller passes.
local function effectiveSize(n, configured)
  local v = tonumber(redis.call("GET", sizeKey(n)) or "")
  if v and v >= 1 then return v end
  return tonumber(configured)
end
local function agedKey(n) return KEYS[8 + 4 * n] end

-- firstPending returns the highest rank, down to last, whose queue has
-- pending jobs and is not paused by an operator or a breaker (their jobs
-- do not count), or nil.
local function firstPending(n, last)
  for i = 1, last do
    local p = redis.call("GET", pausedKey(n, i))
    if (not p or p == MARK) and redis.call("LLEN", pendingKey(n, i)) > 0 then return i end
  end
  return nil
end

-- queueName returns the queue of rank i, read from its paused key
-- (asynq:{<queue>}:paused).
local function queueName(n, i) return string.match(pausedKey(n, i), "^asynq:{(.*)}:paused$") end

-- The pool's start rate: rateInterval ms between starts on average, up to
-- rateBurst at once (0: no start rate). Each script sets them (setRate)
-- before it settles.
local rateInterval, rateBurst = 0, 0
local function setRate(interval, burst)
  rateInterval, rateBurst = tonumber(interval), tonumber(burst)
end

-- rateWait returns how many ms until the start rate allows a start (0:
-- now), by the generic cell rate algorithm.
local function rateWait(n, now)
  if rateBurst == 0 then return 0 end
  local tat = tonumber(redis.call("GET", startRateKey(n)) or "0")
  return math.max(0, math.ceil(math.max(tat, now) + rateInterval - rateBurst * rateInterval - now))
end

-- rateTake takes a start. A start that comes a little after it was due
-- (the waiting job's timer, the round trip) keeps its due time, up to a
-- quarter interval or 10 ms: otherwise every start would push the next
-- one back by its lateness, and the rate would fall short of the limit.
-- A start after a longer pause counts from now, so none comes early.
local function rateTake(n, now)
  if rateBurst == 0 then return end
  local tat = tonumber(redis.call("GET", startRateKey(n)) or "0")
  local due = tat
  if now - tat > math.min(rateInterval / 4, 10) then due = now end
  local nt = due + rateInterval
  redis.call("SET", startRateKey(n), string.format("%.3f", nt), "PX", math.ceil(nt - now) + 1000)
end

local function dropExpiredWaiters(now)
  for _, w in ipairs(redis.call("ZRANGEBYSCORE", waitexp, "-inf", now)) do
    redis.call("ZREM", waiting, w)
    redis.call("ZREM", waitexp, w)
  end
end

local function inGrace(now)
  local g = tonumber(redis.call("GET", grace) or "0")
  return g > now
end

-- Steering (docs/STEERING.md): per rank (1 = highest tier) the slots
-- reserved for that tier and the tiers above it, and the tier's maximum
-- wait in ms (0: none). Each script sets them (setSteering) before it
-- settles; "" (no reservation, no wait limit) costs nothing.
local reserved, maxWait = {}, {}
local reserving, aging = false, false
local function setSteering(s, n)
  for i = 1, n do reserved[i], maxWait[i] = 0, 0 end
  local i = 0
  for r, w in string.gmatch(s or "", "(%d+):(%d+)") do
    i = i + 1
    reserved[i], maxWait[i] = tonumber(r), tonumber(w)
    if reserved[i] > 0 then reserving = true end
    if maxWait[i] > 0 then aging = true end
  end
end

-- rankOf maps each queue of the pool to its rank.
local function rankOf(n)
  local m = {}
  for i = 1, n do m[queueName(n, i)] = i end
  return m
end

-- memberRank returns the rank of a lease or waiter member (<id>@<queue>).
local function memberRank(ranks, m)
  return ranks[string.match(m, "@([^@]*)$") or ""]
end

-- needs returns, per rank i, how many slots must stay free after a job of
-- rank i takes one, so that every reservation holds: for each tier T above
-- i, the slots reserved for T and the tiers above it that the jobs of T
-- and the tiers above it do not use now (the largest of these). A
-- reservation for T covers T and every tier above it: a higher tier's job
-- may run in it. A job of rank i may take a slot only while the free slots
-- exceed needs[i]. Counts the leases per tier: O(size). No tier must
-- leave more than size - 1 free: an operator's resize (or another
-- process's config) may leave fewer slots than the reservations, and the
-- lowest tiers must still get one.
local function needs(n, size)
  local ranks, run = rankOf(n), {}
  for i = 1, n do run[i] = 0 end
  for _, m in ipairs(redis.call("ZRANGE", leases, 0, -1)) do
    local r = memberRank(ranks, m)
    if r then run[r] = run[r] + 1 end
  end
  local need, worst, res, used = {}, 0, 0, 0
  for i = 1, n do
    need[i] = worst
    res, used = res + reserved[i], used + run[i]
    worst = math.min(math.max(worst, res - used), size - 1)
  end
  return need
end

-- oldestPending returns when the oldest pending job of rank i became
-- pending, in ms (asynq's pending_since, in ns, written by the process
-- that enqueued or forwarded it), or nil. A job put back at the head by a
-- worker's shutdown has no stamp: the next ones are looked at, up to
-- AGED_SCAN.
local AGED_SCAN = 8
local function oldestPending(n, i)
  local pk = pendingKey(n, i)
  local prefix = string.sub(pk, 1, #pk - #"pending") .. "t:"
  for j = 1, AGED_SCAN do
    local id = redis.call("LINDEX", pk, -j)
    if not id then return nil end
    local ns = redis.call("HGET", prefix .. id, "pending_since")
    if ns then return math.floor(tonumber(ns) / 1e6) end
  end
  return nil
end

-- agedTier returns the rank of the tier to serve before every other
-- because its oldest pending job waited past the tier's maximum wait, or
-- nil. Among several, the one whose limit passed first goes first. A tier
-- an operator paused does not count, nor one that may not take a free
-- slot now (need: the reservations). It marks that tier's next job (the
-- head of its pending list, which asynq dequeues next) as aged for
-- AGED_TTL ms, refreshed by every settle while it stays aged, so that the
-- job keeps its place when it asks for a slot after being dequeued.
local AGED_TTL = 15000
local function agedTier(n, free, need, now)
  redis.call("ZREMRANGEBYSCORE", agedKey(n), "-inf", now)
  local best, bestDue = nil, nil
  for i = 1, n do
    if maxWait[i] > 0 and free > (need and need[i] or 0) then
      local p = redis.call("GET", pausedKey(n, i))
      if not p or p == MARK then
        local since = oldestPending(n, i)
        if since and now - since > maxWait[i] and (not bestDue or since + maxWait[i] < bestDue) then
          best, bestDue = i, since + maxWait[i]
        end
      end
    end
  end
  if best then
    local head = redis.call("LINDEX", pendingKey(n, best), -1)
    if head then redis.call("ZADD", agedKey(n), now + AGED_TTL, head .. "@" .. queueName(n, best)) end
  end
  return best
end

-- settle sets the pause flags of the pool's queues for the slots in use:
-- all paused while the pool is full or a recovery grace runs; otherwise,
-- with strict tiers, open down to the highest tier that has pending jobs
-- and paused below it, so that no process can take a lower tier's job while
-- a higher tier's waits; with weighted tiers, all open. A queue an operator
-- paused by hand (any other value) is never touched, and its pending jobs
-- do not count. With a start rate, all are also paused while RATE_READY
-- jobs that were taken wait for their start: they take the next starts,
-- and more taken now would only wait behind them. Keeping that many ready
-- (rather than none) lets each start happen at its due time even when
-- the next job is taken a poll interval late, so starts keep to the rate.
--
-- Steering: with reservations, a tier stays paused while the free slots
-- do not exceed what it must leave to the tiers above (needs), so only the
-- reserved tiers' queues stay open when only reserved room is left; with
-- a maximum wait (strict tiers only), a tier whose oldest job waited past
-- it is the only queue open (agedTier), so that job is dequeued next.
local RATE_READY = 2
local function settle(n, size, count, strict, now)
  local k, only = n, nil
  if rateBurst > 0 then dropExpiredWaiters(now) end
  if count >= size or inGrace(now) or (rateBurst > 0 and redis.call("ZCARD", waiting) >= RATE_READY) then
    k = 0
  else
    local need = reserving and needs(n, size) or nil
    if aging and strict then only = agedTier(n, size - count, need, now) end
    if strict then k = firstPending(n, n) or n end
    if need then
      for i = 1, k do
        if size - count <= need[i] then
          k = i - 1
          break
        end
      end
    end
  end
  for i = 1, n do
    local key = pausedKey(n, i)
    if (only and i == only) or (not only and i <= k) then
      if redis.call("GET", key) == MARK then redis.call("DEL", key) end
    else
      redis.call("SET", key, MARK, "NX")
    end
  end
end

local function dropExpired(now)
  for _, m in ipairs(redis.call("ZRANGEBYSCORE", leases, "-inf", now)) do
    redis.call("ZREM", leases, m)
    redis.call("HDEL", holders, m)
  end
  dropExpiredWaiters(now)
end

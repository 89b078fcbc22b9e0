-- Shared by the gate's scripts (prepended to each). KEYS, with n queues:
--   1-5            leases, waiting, waitexp, holders, grace
--   6 .. 5+4n      per queue (highest tier first): its paused key, pending
--                  list, active list and asynq lease set (four blocks of n)
--   6+4n           the start rate's state (its theoretical arrival time)
--   7+4n           the pool's size set by an operator (Client.Resize)
-- New keys go at the end, after these.
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
local RATE_READY = 2
local function settle(n, size, count, strict, now)
  local k = n
  if rateBurst > 0 then dropExpiredWaiters(now) end
  if count >= size or inGrace(now) or (rateBurst > 0 and redis.call("ZCARD", waiting) >= RATE_READY) then
    k = 0
  elseif strict then
    for i = 1, n do
      local p = redis.call("GET", pausedKey(n, i))
      if (not p or p == MARK) and redis.call("LLEN", pendingKey(n, i)) > 0 then
        k = i
        break
      end
    end
  end
  for i = 1, n do
    local key = pausedKey(n, i)
    if i <= k then
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

-- Shared by the gate's scripts (prepended to each). KEYS: leases, waiting,
-- waitexp, holders, grace, then per queue (highest tier first) its paused
-- key, pending list, active list and asynq lease set.
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
-- do not count.
local function settle(n, size, count, strict, now)
  local k = n
  if count >= size or inGrace(now) then
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
  for _, w in ipairs(redis.call("ZRANGEBYSCORE", waitexp, "-inf", now)) do
    redis.call("ZREM", waiting, w)
    redis.call("ZREM", waitexp, w)
  end
end

-- Shared by the breaker's scripts (prepended to each). KEYS: state (hash),
-- window (hash of counts per time bucket), suspects (sorted set of the
-- jobs whose failures are in the window), probes (sorted set of the probe
-- jobs running, scored by expiry), then the paused key of each of the
-- pool's queues. ARGV[1..7]: failure ratio, min calls, window ms, cool-down
-- ms, max cool-down ms, probes, probe lease ms; each script's own
-- arguments follow.
local stateKey, windowKey, suspectsKey, probesKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local MARK, GATE_MARK = "compartment-breaker", "compartment-gate"
local ratio, minCalls, windowMs = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local coolMs, maxCoolMs, probes, probeTtl = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local BUCKETS = 10

-- Every time is Redis's own clock, in milliseconds.
local function nowMs()
  local t = redis.call("TIME")
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function field(f) return redis.call("HGET", stateKey, f) end
local function current() return field("state") or "closed" end

-- pauseAll pauses every queue of the pool with the breaker's mark. A queue
-- the gate paused takes the breaker's mark (the gate never lifts it); one
-- an operator paused keeps the operator's value.
local function pauseAll()
  for i = 5, #KEYS do
    local v = redis.call("GET", KEYS[i])
    if not v or v == GATE_MARK then redis.call("SET", KEYS[i], MARK) end
  end
end

-- unpauseAll lifts the breaker's own pauses, and only those.
local function unpauseAll()
  for i = 5, #KEYS do
    if redis.call("GET", KEYS[i]) == MARK then redis.call("DEL", KEYS[i]) end
  end
end

local function bucketMs() return math.max(1, math.floor(windowMs / BUCKETS)) end

-- sums returns the calls, failures and slow calls in the window; with
-- prune it drops the buckets older than the window (and malformed fields).
local function sums(now, prune)
  local cur = math.floor(now / bucketMs())
  local c, f, s = 0, 0, 0
  local all = redis.call("HGETALL", windowKey)
  for i = 1, #all, 2 do
    local b, kind = string.match(all[i], "^(%d+):(%a)$")
    b = tonumber(b)
    if not b or b <= cur - BUCKETS then
      if prune then redis.call("HDEL", windowKey, all[i]) end
    else
      local v = tonumber(all[i + 1])
      if kind == "c" then c = c + v elseif kind == "f" then f = f + v else s = s + v end
    end
  end
  return c, f, s
end

-- changes are the changes of state this call made, in order: from, to,
-- why, for each (one call can make two: open to half-open, then on).
local changes = {}

local function setState(to, why, now)
  local from = current()
  redis.call("HSET", stateKey, "state", to, "since", now, "why", why)
  if from ~= to then
    changes[#changes + 1] = from
    changes[#changes + 1] = to
    changes[#changes + 1] = why
  end
  return from
end

-- open trips the breaker (reopen: after a failed probe, with a longer
-- cool-down, doubled per reopen up to the cap). until < 0 keeps it open
-- until an operator closes or resets it.
local function open(why, now, reopen, forever)
  local trips = 1
  if reopen then trips = tonumber(field("trips") or "0") + 1 end
  local cool = coolMs
  for _ = 2, trips do
    cool = cool * 2
    if cool >= maxCoolMs then break end
  end
  cool = math.min(cool, maxCoolMs)
  local untilMs = now + cool
  if forever then untilMs = -1 end
  local from = setState("open", why, now)
  redis.call("HSET", stateKey, "until", untilMs, "cool_down", cool, "trips", trips, "probes_ok", 0)
  -- Probes still running (a reopen after another probe failed) keep their
  -- places: the next half-open counts them, so that never more than
  -- `probes` probe jobs run at once, however long one takes.
  redis.call("DEL", windowKey, suspectsKey)
  pauseAll()
  return from
end

local function close(why, now)
  local from = setState("closed", why, now)
  redis.call("HSET", stateKey, "until", 0, "trips", 0, "probes_ok", 0)
  redis.call("DEL", probesKey, windowKey, suspectsKey)
  unpauseAll()
  return from
end

local function halfOpen(now)
  local from = setState("half-open", "cool-down over", now)
  redis.call("HSET", stateKey, "probes_ok", 0)
  unpauseAll()
  return from
end

-- probeRoom says whether another probe may start: probes running plus
-- probes that succeeded stay within the configured number.
local function probeRoom(now)
  redis.call("ZREMRANGEBYSCORE", probesKey, "-inf", now)
  return redis.call("ZCARD", probesKey) + tonumber(field("probes_ok") or "0") < probes
end

-- advance moves an open breaker whose cool-down is over to half-open and
-- keeps the pause flags right for the state.
local function advance(now)
  local st = current()
  if st == "open" then
    local untilMs = tonumber(field("until") or "0")
    if untilMs >= 0 and now >= untilMs then
      halfOpen(now)
      return
    end
    pauseAll()
  elseif st == "half-open" then
    if probeRoom(now) then unpauseAll() else pauseAll() end
  end
end

-- result is what every script returns: state, why, ms left of the
-- cool-down (open; -1 until an operator acts), Redis's clock (ms), the
-- number of changes this call made, each change's from, to and why, then
-- script-specific values.
local function result(now, ...)
  local st = current()
  local left = 0
  if st == "open" then
    local u = tonumber(field("until") or "0")
    if u < 0 then left = -1 else left = math.max(0, u - now) end
  end
  local out = {st, field("why") or "", left, now, #changes / 3}
  for _, v in ipairs(changes) do out[#out + 1] = v end
  for _, v in ipairs({...}) do out[#out + 1] = v end
  return out
end

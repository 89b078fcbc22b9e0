-- adaptive_tick: one worker process's tick of a pool's adaptive limit. It
-- adds what the process saw since its last tick (jobs ended, the time they
-- worked and the time they waited for their dependencies) to the window
-- of Redis's clock it falls in, and, when the window before is closed and
-- nobody decided on it yet, decides the limit from it: the first process
-- to tick in a window decides for the one before, so one decision is made
-- per window whatever the number of processes, and each process only ever
-- adds to the window it is in.
--
-- KEYS: 1 state (hash: limit, baseline, decided, operator, reason, at,
--       changes, written: the size this limit last wrote),
--       2 windows (hash: "<window>:n|work|wait" -> sums),
--       3 the pool's size key (what the gate reads), 4 the change log
--       (list, newest first), 5 the gate's leases.
-- ARGV: 1 jobs ended, 2 their work (ms), 3 their dependency wait (ms),
--       4 window (ms), 5 min, 6 max, 7 configured size, 8 tolerance,
--       9 log length kept, 10 entries' keep (ms).
--
-- Reply: {limit, changed (0/1), from, reason, baseline (µs), sample (µs),
--         operator (0/1)}.
local state, windows, sizeKey, logKey, leases = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local n, work, wait = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local span, lo, hi, configured = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local tolerance, keepLog, keep = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])

local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local w = math.floor(now / span)

if n > 0 then
  redis.call("HINCRBY", windows, w .. ":n", n)
  redis.call("HINCRBYFLOAT", windows, w .. ":work", work)
  redis.call("HINCRBYFLOAT", windows, w .. ":wait", wait)
end
redis.call("PEXPIRE", windows, keep)

local s = redis.call("HMGET", state, "limit", "baseline", "decided", "operator", "reason", "written")
-- Clamped at every tick: a reload may have narrowed the bounds.
local limit = math.min(hi, math.max(lo, tonumber(s[1]) or configured))
local baseline = tonumber(s[2])
local decided = tonumber(s[3]) or -1
local operator = s[4] == "1"
local reason = s[5] or ""
local size = redis.call("GET", sizeKey)
local function logOperator(what)
  redis.call("LPUSH", logKey, now .. "|-|-|" .. what)
  redis.call("LTRIM", logKey, 0, keepLog - 1)
end
if not operator and size and size ~= s[6] then
  -- A size this limit did not write: an operator's, set before the pool
  -- became adaptive or by a process whose config does not make it so.
  -- It stays until a reset.
  operator = true
  redis.call("HSET", state, "operator", "1")
  logOperator("an operator's size was set outside the adaptive limit: the limit waits for a reset")
elseif operator and not size then
  -- The operator's size was taken away by a process that does not know
  -- the pool is adaptive: a reset.
  operator = false
  redis.call("HDEL", state, "operator")
  logOperator("an operator reset the size: the adaptive limit holds again")
end
local from = math.floor(limit + 0.5)
local changed = 0
local sample = 0

local function fmt(ms)
  if ms >= 10 then return string.format("%dms", math.floor(ms + 0.5)) end
  return string.format("%.1fms", ms)
end

if decided < w - 1 then
  local prev = w - 1
  -- The windows since the last decision, up to the one before this: a
  -- window no process ticked in to decide is counted with the next.
  local v = {0, 0, 0}
  for x = math.max(decided + 1, w - 10), prev do
    local got = redis.call("HMGET", windows, x .. ":n", x .. ":work", x .. ":wait")
    for i = 1, 3 do v[i] = v[i] + (tonumber(got[i]) or 0) end
    redis.call("HDEL", windows, x .. ":n", x .. ":work", x .. ":wait")
  end
  if redis.call("HLEN", windows) > 30 then
    -- Windows older than the ten looked at (after a long pause): drop
    -- all but this one.
    local cur = redis.call("HMGET", windows, w .. ":n", w .. ":work", w .. ":wait")
    redis.call("DEL", windows)
    if cur[1] then
      redis.call("HSET", windows, w .. ":n", cur[1], w .. ":work", cur[2] or "0", w .. ":wait", cur[3] or "0")
      redis.call("PEXPIRE", windows, keep)
    end
  end
  local jobs = v[1]
  local next = limit
  if jobs > 0 then
    local avgWork = v[2] / jobs
    local avgWait = v[3] / jobs
    sample = avgWork + avgWait
    if not baseline then
      baseline = sample
    elseif sample < baseline then
      baseline = (baseline + sample) / 2
    else
      -- A baseline follows a lasting change slowly: 1% a window.
      baseline = math.min(baseline * 1.01, sample)
    end
    local gradient = math.max(0.5, math.min(1, tolerance * baseline / math.max(sample, 0.001)))
    -- Busy: the slots held now, or the slots the window's jobs kept busy
    -- on average, whichever is more.
    local busy = math.max(redis.call("ZCOUNT", leases, now, "+inf"),
      (v[2] + v[3]) / (span * math.max(1, prev - math.max(decided + 1, w - 10) + 1)))
    if gradient < 1 then
      next = math.max(lo, limit * gradient)
      reason = string.format("jobs took %s against a baseline of %s", fmt(sample), fmt(baseline))
    elseif avgWait > 0.25 * sample then
      next = math.max(lo, limit * 0.75)
      reason = string.format("jobs waited %s of their %s for their dependencies", fmt(avgWait), fmt(sample))
    elseif limit < hi and busy + 1 >= math.floor(limit + 0.5) then
      next = math.min(hi, limit + math.max(1, math.sqrt(limit)))
      reason = string.format("jobs took %s, within %.2gx their baseline of %s, and the pool was full", fmt(sample), tolerance, fmt(baseline))
    end
  end
  limit = math.min(hi, math.max(lo, next))
  redis.call("HSET", state, "limit", tostring(limit), "decided", prev)
  if baseline then redis.call("HSET", state, "baseline", tostring(baseline)) end
  local to = math.floor(limit + 0.5)
  if to ~= from then
    changed = 1
    redis.call("HSET", state, "reason", reason, "at", now)
    redis.call("HINCRBY", state, "changes", 1)
    redis.call("LPUSH", logKey, now .. "|" .. from .. "|" .. to .. "|" .. reason)
    redis.call("LTRIM", logKey, 0, keepLog - 1)
  end
end

local to = math.floor(limit + 0.5)
if not operator and size ~= tostring(to) then
  redis.call("SET", sizeKey, to)
  redis.call("HSET", state, "written", to)
end
return {to, changed, from, reason, math.floor((baseline or 0) * 1000), math.floor(sample * 1000), operator and 1 or 0}

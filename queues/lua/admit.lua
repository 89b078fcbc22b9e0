-- admit: the gatekeeper's check of a batch and, when it passes, the
-- batch's jobs written into their queues, in one step: nothing of a
-- refused batch is written, and no other enqueue can come between the
-- check and the write. Times are Redis's clock, in milliseconds.
--
-- KEYS[1]: asynq's set of all queue names. Then, in the order of ARGV:
--   per pool check: its waiters (sorted set) and waiter data (hash), then
--     per tier (highest first) its pending list, scheduled and retry sets;
--   per rate check: its state key (the theoretical arrival time);
--   per job: its task hash and the list (pending) or set (scheduled) it
--     goes to, and, for a job replacing a finished one, the finished one's
--     task hash and the set (completed or archived) that holds it.
-- ARGV: wait ("1": stay registered as a waiter when the backlog refuses),
-- token (this request's waiter name), waiter TTL ms, P, R, J; then
--   per pool check: T, then T x (limit, need);
--   per rate check: interval ms, burst, need;
--   per job: id, message, process-at (Unix seconds; "0": now), queue,
--     replace ("1": it replaces a finished job).
-- Returns {"ok", per job 1 (written) or 0 (its ID was taken meanwhile)},
-- {"backlog", pool check, backlog, per tier room and need}, or
-- {"rate", rate check, ms until it would pass}.
local wait, token, waitTTL = ARGV[1] == "1", ARGV[2], tonumber(ARGV[3])
local P, R, J = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- asynq's pending_since, in Unix nanoseconds: built as text, since a Lua
-- number cannot hold it exactly.
local nowNs = t[1] .. string.format("%06d", tonumber(t[2])) .. "000"

local ai, ki = 7, 2
local pools = {}
for p = 1, P do
  local pc = {waiters = KEYS[ki], data = KEYS[ki + 1], limits = {}, needs = {}, lists = {}}
  ki = ki + 2
  local n = tonumber(ARGV[ai])
  ai = ai + 1
  for i = 1, n do
    pc.limits[i], pc.needs[i] = tonumber(ARGV[ai]), tonumber(ARGV[ai + 1])
    ai = ai + 2
    pc.lists[i] = {KEYS[ki], KEYS[ki + 1], KEYS[ki + 2]}
    ki = ki + 3
  end
  pools[p] = pc
end
local rates = {}
for r = 1, R do
  rates[r] = {key = KEYS[ki], interval = tonumber(ARGV[ai]), burst = tonumber(ARGV[ai + 1]), need = tonumber(ARGV[ai + 2])}
  ki = ki + 1
  ai = ai + 3
end

-- fits: with backlog b, can every tier take its need? Higher tiers are
-- admitted first, so a tier's room is its limit less the backlog and less
-- the request's jobs of higher tiers.
local function fits(b, limits, needs)
  local higher = 0
  for i = 1, #limits do
    if needs[i] > 0 and b + higher + needs[i] > limits[i] then return false end
    higher = higher + needs[i]
  end
  return true
end

local function total(needs)
  local s = 0
  for _, v in ipairs(needs) do s = s + v end
  return s
end

-- A waiter's data: "<expiry ms>|<need>,<need>,...".
local function parseWaiter(s)
  local exp, rest = string.match(s, "^(%d+)|(.*)$")
  local needs = {}
  for v in string.gmatch(rest or "", "%d+") do needs[#needs + 1] = tonumber(v) end
  return tonumber(exp or "0"), needs
end

for p, pc in ipairs(pools) do
  local b = 0
  for _, l in ipairs(pc.lists) do
    b = b + redis.call("LLEN", l[1]) + redis.call("ZCARD", l[2]) + redis.call("ZCARD", l[3])
  end
  -- Requests waiting since before this one, first come first served: each
  -- that fits takes its room first.
  local room = b
  if redis.call("EXISTS", pc.waiters) == 1 then
    local mine = redis.call("ZSCORE", pc.waiters, token)
    local myScore = mine and tonumber(mine) or math.huge
    local ws = redis.call("ZRANGE", pc.waiters, 0, -1, "WITHSCORES")
    for j = 1, #ws, 2 do
      local w, score = ws[j], tonumber(ws[j + 1])
      local d = redis.call("HGET", pc.data, w)
      local exp, needs = 0, {}
      if d then exp, needs = parseWaiter(d) end
      if exp <= now then
        redis.call("ZREM", pc.waiters, w)
        redis.call("HDEL", pc.data, w)
      elseif w ~= token and score < myScore and #needs == #pc.limits and fits(room, pc.limits, needs) then
        room = room + total(needs)
      end
    end
  end
  if not fits(room, pc.limits, pc.needs) then
    if wait then
      redis.call("ZADD", pc.waiters, "NX", now, token)
      redis.call("HSET", pc.data, token, (now + waitTTL) .. "|" .. table.concat(pc.needs, ","))
    end
    local out = {"backlog", p, b}
    local higher = 0
    for i = 1, #pc.limits do
      out[#out + 1] = math.max(0, pc.limits[i] - room - higher)
      out[#out + 1] = pc.needs[i]
      higher = higher + pc.needs[i]
    end
    return out
  end
end

local tats = {}
for r, rc in ipairs(rates) do
  local tat = tonumber(redis.call("GET", rc.key) or "0")
  local nt = math.max(tat, now) + rc.need * rc.interval
  local allowAt = nt - rc.burst * rc.interval
  if allowAt > now then
    return {"rate", r, math.ceil(allowAt - now)}
  end
  tats[r] = nt
end

for r, rc in ipairs(rates) do
  redis.call("SET", rc.key, string.format("%.3f", tats[r]), "PX", math.ceil(tats[r] - now) + 1000)
end
for _, pc in ipairs(pools) do
  if redis.call("ZREM", pc.waiters, token) == 1 then redis.call("HDEL", pc.data, token) end
end

local out = {"ok"}
local published = {}
for j = 1, J do
  local taskKey, listKey = KEYS[ki], KEYS[ki + 1]
  ki = ki + 2
  local id, msg, at, queue, replace = ARGV[ai], ARGV[ai + 1], ARGV[ai + 2], ARGV[ai + 3], ARGV[ai + 4] == "1"
  ai = ai + 5
  if replace then
    local oldTask, oldSet = KEYS[ki], KEYS[ki + 1]
    ki = ki + 2
    local st = redis.call("HGET", oldTask, "state")
    if st == "completed" or st == "archived" then
      redis.call("ZREM", oldSet, id)
      redis.call("DEL", oldTask)
    end
  end
  if redis.call("EXISTS", taskKey) == 1 then
    out[#out + 1] = 0
  else
    if not published[queue] then
      redis.call("SADD", KEYS[1], queue)
      published[queue] = true
    end
    if at == "0" then
      redis.call("HSET", taskKey, "msg", msg, "state", "pending", "pending_since", nowNs)
      redis.call("LPUSH", listKey, id)
    else
      redis.call("HSET", taskKey, "msg", msg, "state", "scheduled")
      redis.call("ZADD", listKey, at, id)
    end
    out[#out + 1] = 1
  end
end
return out

-- admit: the gatekeeper's check of one or more enqueue requests and, for
-- each that passes, its jobs written into their queues, in one step: no
-- other enqueue comes between a check and its write, and nothing of a
-- refused request is written. Requests are taken in order, each on its
-- own (all of its jobs or none), each seeing the ones before it.
--
-- KEYS[1]: asynq's set of all queue names. Then, in the order of ARGV:
--   per pool check: its waiters (sorted set) and waiter data (hash), then
--     per tier (highest first) its pending list, scheduled and retry sets;
--   per rate check: its state key (the theoretical arrival time, ms);
--   per request, per job: its task hash and the list (pending) or set
--     (scheduled) it goes to, and, for a job replacing a finished one, the
--     finished one's task hash and the set (completed or archived) that
--     holds it.
-- ARGV: P, R, Q, wait ("1": a request refused for the backlog stays in
-- line as a waiter; only with Q = 1), token (that waiter's name), waiter
-- TTL ms, pending_since (Unix ns); then
--   per pool check: waits ("1" if its line may hold waiters), T, then T
--     limits (highest tier first);
--   per rate check: interval ms, burst;
--   per request: J, then per pool check T needs, then per rate check its
--     need, then per job: id, message, process-at (Unix seconds; "0":
--     now), publish (the queue name, to add to asynq's set, or ""),
--     replace ("1": it replaces a finished job).
-- Returns one reply per request: {"ok", per job 1 (written) or 0 (its ID
-- was taken meanwhile)}, {"backlog", pool check, backlog, per tier room
-- and need}, or {"rate", rate check, ms until it would pass}.
local P, R, Q = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local wait, token, waitTTL, pendingSince = ARGV[4] == "1", ARGV[5], tonumber(ARGV[6]), ARGV[7]
local now = nil
local function clock()
  if not now then
    local t = redis.call("TIME")
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now
end

local ai, ki = 8, 2
local pools = {}
for p = 1, P do
  local pc = {waiters = KEYS[ki], data = KEYS[ki + 1], waits = ARGV[ai] == "1", limits = {}, lists = {}}
  ki = ki + 2
  local n = tonumber(ARGV[ai + 1])
  ai = ai + 2
  for i = 1, n do
    pc.limits[i] = tonumber(ARGV[ai])
    ai = ai + 1
    pc.lists[i] = {KEYS[ki], KEYS[ki + 1], KEYS[ki + 2]}
    ki = ki + 3
  end
  pools[p] = pc
end
local rates = {}
for r = 1, R do
  rates[r] = {key = KEYS[ki], interval = tonumber(ARGV[ai]), burst = tonumber(ARGV[ai + 1])}
  ki = ki + 1
  ai = ai + 2
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

-- backlog counts a pool's jobs pending, scheduled or waiting for a retry,
-- once per call; admitted requests add theirs.
local function backlog(pc)
  if not pc.b then
    local b = 0
    for _, l in ipairs(pc.lists) do
      b = b + redis.call("LLEN", l[1]) + redis.call("ZCARD", l[2]) + redis.call("ZCARD", l[3])
    end
    pc.b = b
  end
  return pc.b
end

-- ahead returns the room taken by requests waiting in line before this
-- one (first come first served among those that fit), dropping waiters
-- whose producer stopped asking.
local function ahead(pc, b)
  if not pc.waits or redis.call("EXISTS", pc.waiters) == 0 then return 0 end
  local now = clock()
  local mine = redis.call("ZSCORE", pc.waiters, token)
  local myScore = mine and tonumber(mine) or math.huge
  local taken = 0
  local ws = redis.call("ZRANGE", pc.waiters, 0, -1, "WITHSCORES")
  for j = 1, #ws, 2 do
    local w, score = ws[j], tonumber(ws[j + 1])
    local d = redis.call("HGET", pc.data, w)
    local exp, needs = 0, {}
    if d then exp, needs = parseWaiter(d) end
    if exp <= now then
      redis.call("ZREM", pc.waiters, w)
      redis.call("HDEL", pc.data, w)
    elseif w ~= token and score < myScore and #needs == #pc.limits and fits(b + taken, pc.limits, needs) then
      taken = taken + total(needs)
    end
  end
  return taken
end

local replies = {}
local published = {}
for q = 1, Q do
  local J = tonumber(ARGV[ai])
  ai = ai + 1
  local needs = {}
  for p = 1, P do
    needs[p] = {}
    for i = 1, #pools[p].limits do
      needs[p][i] = tonumber(ARGV[ai])
      ai = ai + 1
    end
  end
  local rneeds = {}
  for r = 1, R do
    rneeds[r] = tonumber(ARGV[ai])
    ai = ai + 1
  end
  local reply = nil
  for p, pc in ipairs(pools) do
    if total(needs[p]) > 0 then
      local b = backlog(pc)
      local room = b + ahead(pc, b)
      if not fits(room, pc.limits, needs[p]) then
        if wait then
          redis.call("ZADD", pc.waiters, "NX", clock(), token)
          redis.call("HSET", pc.data, token, (clock() + waitTTL) .. "|" .. table.concat(needs[p], ","))
        end
        reply = {"backlog", p, b}
        local higher = 0
        for i = 1, #pc.limits do
          reply[#reply + 1] = math.max(0, pc.limits[i] - room - higher)
          reply[#reply + 1] = needs[p][i]
          higher = higher + needs[p][i]
        end
        break
      end
    end
  end
  local tats = {}
  if not reply then
    for r, rc in ipairs(rates) do
      if rneeds[r] > 0 then
        local now = clock()
        if not rc.tat then rc.tat = tonumber(redis.call("GET", rc.key) or "0") end
        local nt = math.max(rc.tat, now) + rneeds[r] * rc.interval
        local allowAt = nt - rc.burst * rc.interval
        if allowAt > now then
          reply = {"rate", r, math.ceil(allowAt - now)}
          break
        end
        tats[r] = nt
      end
    end
  end
  if reply then
    -- Skip this request's jobs.
    for _ = 1, J do
      local replace = ARGV[ai + 4] == "1"
      ai = ai + 5
      ki = ki + 2
      if replace then ki = ki + 2 end
    end
  else
    for r, nt in pairs(tats) do
      rates[r].tat = nt
      rates[r].dirty = true
    end
    for p, pc in ipairs(pools) do
      local n = total(needs[p])
      if n > 0 then
        pc.b = pc.b + n
        if wait and redis.call("ZREM", pc.waiters, token) == 1 then redis.call("HDEL", pc.data, token) end
      end
    end
    reply = {"ok"}
    for _ = 1, J do
      local taskKey, listKey = KEYS[ki], KEYS[ki + 1]
      ki = ki + 2
      local id, msg, at, publish, replace = ARGV[ai], ARGV[ai + 1], ARGV[ai + 2], ARGV[ai + 3], ARGV[ai + 4] == "1"
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
        reply[#reply + 1] = 0
      else
        if publish ~= "" and not published[publish] then
          redis.call("SADD", KEYS[1], publish)
          published[publish] = true
        end
        if at == "0" then
          redis.call("HSET", taskKey, "msg", msg, "state", "pending", "pending_since", pendingSince)
          redis.call("LPUSH", listKey, id)
        else
          redis.call("HSET", taskKey, "msg", msg, "state", "scheduled")
          redis.call("ZADD", listKey, at, id)
        end
        reply[#reply + 1] = 1
      end
    end
  end
  replies[q] = reply
end

for _, rc in ipairs(rates) do
  if rc.dirty then
    redis.call("SET", rc.key, string.format("%.3f", rc.tat), "PX", math.ceil(rc.tat - clock()) + 1000)
  end
end
return replies

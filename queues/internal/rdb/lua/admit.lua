-- admit: the door's check of one or more enqueue requests and, for
-- each that passes, its jobs written into their queues, in one step: no
-- other enqueue comes between a check and its write, and nothing of a
-- refused request is written. Requests are taken in order, each on its
-- own (all of its jobs or none), each seeing the ones before it.
--
-- Each pool with a door keeps one hash of state (its door state):
--   "est"      an upper bound of its backlog: the jobs pending, scheduled,
--              waiting for a retry or running at its last exact count,
--              plus every job admitted since (running ones count because
--              they can come back as retries without passing the door);
--   "counted"  when that count was made (Redis's clock, ms);
--   "tat:..."  the theoretical arrival time (ms) of each of the pool's own
--              enqueue rates (the pool's, its job types').
-- A request that fits under the bound is admitted without counting. One
-- that does not, or any request while the bound is older than the recount
-- interval or requests wait in line, is decided on an exact count: a
-- refusal is always an exact count's.
--
-- The script runs on every enqueue to a pool with a door, and Lua is slow
-- next to Redis's commands (a table or a number parsed costs about as
-- much as an EXISTS): it reads its arguments where they are rather than
-- copying them into tables, and reads the count keys only to count.
--
-- KEYS[1]: asynq's set of all queue names (on a Redis Cluster, where no
-- job publishes its queue here because the caller listed every queue
-- beforehand, a key of the call's pool instead: the set has a slot of its
-- own). Then, in the order of ARGV:
--   per door state: its hash;
--   per pool check whose line may hold waiters: its waiters (sorted set)
--     and waiter data (hash);
--   per rate check with a key of its own (a caller key's rate, which
--     expires once recovered): that key;
--   per request, per job: its task hash and the list (pending) or set
--     (scheduled) it goes to, and, for a job replacing a finished one, the
--     finished one's task hash and the set (completed or archived) that
--     holds it.
-- ARGV: S, P, R, Q, wait ("1": a request refused for the backlog stays in
-- line as a waiter; only with Q = 1), token (that waiter's name), waiter
-- TTL ms, pending_since (Unix ns), recount interval ms; then
--   per door state: F, then F fields to read ("est" and "counted" first
--     when the call checks the pool's backlog);
--   per pool check: its door state (1..S), waits ("1" if its line may hold
--     waiters), T, then T limits (highest tier first), then its tiers'
--     count keys, space-separated: per tier (highest first) asynq's
--     pending list, scheduled set, retry set and active list. An exact
--     count reads them; they are the only keys the script touches that
--     are not in KEYS: most calls need no count, and four keys per tier
--     on every call would cost more than the count saves. (They are the
--     pool's: on a Redis Cluster they share its slot.)
--   per rate check: its door state (1..S; 0: a key of its own), the
--     position of its field in that state's fields (only with a state),
--     interval ms, burst;
--   per request: J; per pool check N, then N pairs of tier (1..T, highest
--     first, ascending) and need; M, then M pairs of rate check and need;
--     then per job: id, message, process-at (Unix seconds; "0": now),
--     publish (the queue name, to add to asynq's set, or ""), replace
--     ("1": it replaces a finished job).
-- Returns one reply per request: {"ok", per job 1 (written) or 0 (its ID
-- was taken meanwhile)}, {"backlog", pool check, backlog, per tier room
-- and need}, or {"rate", rate check, ms until it would pass}.
local call, tonumber, A, K = redis.call, tonumber, ARGV, KEYS
local S, P, R, Q = tonumber(A[1]), tonumber(A[2]), tonumber(A[3]), tonumber(A[4])
local wait, token = A[5] == "1", A[6]
local now, nowUs = nil, nil
local function clock()
  if not now then
    local t = call("TIME")
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    nowUs = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return now
end
-- clockUs is the same instant in microseconds: the waiting line's order,
-- so that requests that join in the same millisecond keep their order
-- (a script runs for longer than a microsecond).
local function clockUs()
  clock()
  return nowUs
end

local published = {}
-- writeJob writes the job whose arguments start at A[ai] into its task
-- hash and list (pending) or set (scheduled), unless its ID is taken:
-- returns 1 if written, 0 if not.
local function writeJob(taskKey, listKey, ai)
  if call("EXISTS", taskKey) == 1 then return 0 end
  local id, at, publish = A[ai], A[ai + 2], A[ai + 3]
  if publish ~= "" and not published[publish] then
    call("SADD", K[1], publish)
    published[publish] = true
  end
  if at == "0" then
    call("HSET", taskKey, "msg", A[ai + 1], "state", "pending", "pending_since", A[8])
    call("LPUSH", listKey, id)
  else
    call("HSET", taskKey, "msg", A[ai + 1], "state", "scheduled")
    call("ZADD", listKey, at, id)
  end
  return 1
end

-- The lean path: one job, one door state (its pool's), every rate in it,
-- and the bound fresh with room for the job: decided without the tables
-- of the general path below. When any of that does not hold, or a rate
-- refuses, it has written nothing and the general path decides. (Most
-- such jobs never get here: lua/admit_fast.lua takes them. This serves
-- the ones it leaves, such as the first job of a queue or a scheduled
-- one.)
if S == 1 and Q == 1 and P <= 1 and not wait then
  local f = tonumber(A[10])
  local ai, ki = 11 + f, 3
  local T, limits, waits
  if P == 1 then
    waits, T, limits = A[ai + 1] == "1", tonumber(A[ai + 2]), ai + 3
    ai = ai + 4 + T
    if waits then ki = ki + 2 end
  end
  local rates, ok = ai, true
  for _ = 1, R do
    if A[ai] == "0" then ok = false; break end -- a key of its own
    ai = ai + 4
  end
  local tier, q = 0, ai + 1
  if ok and A[ai] == "1" then
    if P == 1 then
      tier = tonumber(A[q + 1])
      q = q + 3
    end
    local m = tonumber(A[q])
    local rp = q + 1
    q = q + 1 + 2 * m
    if A[q + 4] == "0" then -- not a replacement
      local vals = call("HMGET", K[2], unpack(A, 11, 10 + f))
      local t = clock()
      local est
      if P == 1 then
        local at
        est, at = tonumber(vals[1] or ""), tonumber(vals[2] or "")
        ok = est and at and t >= at and t - at < tonumber(A[9]) and est + 1 <= tonumber(A[limits + tier - 1])
          and not (waits and call("EXISTS", K[3]) == 1)
      end
      local set = {}
      for i = 1, ok and m or 0 do
        local r = rates + 4 * (tonumber(A[rp + 2 * i - 2]) - 1)
        local pos, interval = tonumber(A[r + 1]), tonumber(A[r + 2])
        local nt = math.max(tonumber(vals[pos] or "0") or 0, t) + interval
        if nt - tonumber(A[r + 3]) * interval > t then
          ok = false
          break
        end
        set[#set + 1] = A[10 + pos]
        set[#set + 1] = string.format("%.3f", nt)
      end
      if ok then
        local w = writeJob(K[ki], K[ki + 1], q)
        if P == 1 then
          set[#set + 1] = "est"
          set[#set + 1] = est + 1
        end
        if #set > 0 then call("HSET", K[2], unpack(set)) end
        return {{"ok", w}}
      end
    end
  end
end

-- Door states: read each once.
local ai, ki = 10, 2
local states = {}
for s = 1, S do
  local f = tonumber(A[ai])
  local st = {key = K[ki], fields = ai + 1}
  if f > 0 then st.vals = call("HMGET", st.key, unpack(A, ai + 1, ai + f)) end
  states[s] = st
  ki = ki + 1
  ai = ai + 1 + f
end

local pools = {}
for p = 1, P do
  local T = tonumber(A[ai + 2])
  local pc = {st = states[tonumber(A[ai])], waits = A[ai + 1] == "1", T = T, limits = ai + 3, counts = A[ai + 3 + T], keys = ki}
  if pc.waits then ki = ki + 2 end
  ai = ai + 4 + T
  pools[p] = pc
end
local rates = {}
for r = 1, R do
  local s = tonumber(A[ai])
  local rc
  if s > 0 then
    rc = {st = states[s], pos = tonumber(A[ai + 1])}
    ai = ai + 2
  else
    rc = {key = K[ki]}
    ki = ki + 1
    ai = ai + 1
  end
  rc.interval, rc.burst = tonumber(A[ai]), tonumber(A[ai + 1])
  ai = ai + 2
  rates[r] = rc
end

-- fits: with backlog b, can every tier of the request (needs: tier, need,
-- ...; higher tiers first) take its need? Higher tiers are admitted
-- first, so a tier's room is its limit less the backlog and less the
-- request's jobs of higher tiers.
local function fits(pc, b, needs)
  local higher = 0
  for i = 1, #needs, 2 do
    local need = needs[i + 1]
    if b + higher + need > tonumber(A[pc.limits + needs[i] - 1]) then return false end
    higher = higher + need
  end
  return true
end

-- recount counts a pool's backlog exactly (pc.b; admitted requests add
-- theirs) and its running jobs (pc.active), once per call.
local function recount(pc)
  local b, a = 0, 0
  for pending, scheduled, retry, active in string.gmatch(pc.counts, "(%S+) (%S+) (%S+) (%S+)") do
    b = b + call("LLEN", pending) + call("ZCARD", scheduled) + call("ZCARD", retry)
    a = a + call("LLEN", active)
  end
  pc.b, pc.active, pc.exact, pc.counted = b, a, true, clock()
end

-- backlog returns the pool's backlog for a request: the stored bound
-- while it is fresh, the request fits under it and nobody waits in line;
-- else an exact count.
local function backlog(pc, needs)
  if not pc.b then
    local est, at = tonumber(pc.st.vals[1] or ""), tonumber(pc.st.vals[2] or "")
    if est and at and clock() >= at and now - at < tonumber(A[9])
        and not (pc.waits and call("EXISTS", K[pc.keys]) == 1) then
      pc.b, pc.active = est, 0
    else
      recount(pc)
    end
  end
  if not pc.exact and not fits(pc, pc.b, needs) then recount(pc) end
  return pc.b
end

-- A waiter's data: "<expiry ms>|<need>,<need>,..." (one need per tier).
local function parseWaiter(s)
  local exp, rest = string.match(s, "^(%d+)|(.*)$")
  local needs = {}
  local i = 0
  for v in string.gmatch(rest or "", "%d+") do
    i = i + 1
    if v ~= "0" then
      needs[#needs + 1] = i
      needs[#needs + 1] = tonumber(v)
    end
  end
  return tonumber(exp or "0"), needs, i
end

-- ahead returns the room taken by requests waiting in line before this
-- one (first come first served among those that fit), dropping waiters
-- whose producer stopped asking. Only on an exact count: the bound is used
-- only while nobody waits. A request's place is when it joined, in
-- microseconds; two with the same score are ordered as the line holds
-- them (by member), so each sees the other on the same side.
local function ahead(pc, b)
  local waiters, data = K[pc.keys], K[pc.keys + 1]
  if not pc.exact or not pc.waits or call("EXISTS", waiters) == 0 then return 0 end
  local now = clock()
  local mine = call("ZSCORE", waiters, token)
  local myScore = mine and tonumber(mine) or math.huge
  local taken = 0
  local ws = call("ZRANGE", waiters, 0, -1, "WITHSCORES")
  for j = 1, #ws, 2 do
    local w, score = ws[j], tonumber(ws[j + 1])
    local d = call("HGET", data, w)
    local exp, needs, T = 0, {}, 0
    if d then exp, needs, T = parseWaiter(d) end
    if exp <= now then
      call("ZREM", waiters, w)
      call("HDEL", data, w)
    elseif w ~= token and (score < myScore or (score == myScore and w < token))
        and T == pc.T and fits(pc, b + taken, needs) then
      for i = 2, #needs, 2 do taken = taken + needs[i] end
    end
  end
  return taken
end

-- refusal is the reply for a request refused by pool check p with
-- backlog b and room (backlog and waiters ahead): per tier room and need.
local function refusal(p, pc, b, room, needs)
  local per = {}
  for i = 1, #needs, 2 do per[needs[i]] = needs[i + 1] end
  local reply = {"backlog", p, b}
  local higher, line = 0, {}
  for i = 1, pc.T do
    local need = per[i] or 0
    reply[#reply + 1] = math.max(0, tonumber(A[pc.limits + i - 1]) - room - higher)
    reply[#reply + 1] = need
    line[i] = need
    higher = higher + need
  end
  if wait and pc.waits then
    call("ZADD", K[pc.keys], "NX", clockUs(), token)
    call("HSET", K[pc.keys + 1], token, (clock() + tonumber(A[7])) .. "|" .. table.concat(line, ","))
  end
  return reply
end

local replies = {}
for q = 1, Q do
  local J = tonumber(A[ai])
  ai = ai + 1
  local needs = {}
  local counts = {}
  for p = 1, P do
    local n = tonumber(A[ai])
    local t = {}
    local c = 0
    for i = 1, 2 * n do
      t[i] = tonumber(A[ai + i])
      if i % 2 == 0 then c = c + t[i] end
    end
    needs[p], counts[p] = t, c
    ai = ai + 1 + 2 * n
  end
  local m = tonumber(A[ai])
  local rneeds = ai -- pairs of rate check and need, from rneeds + 1
  ai = ai + 1 + 2 * m

  local reply = nil
  for p, pc in ipairs(pools) do
    if counts[p] > 0 then
      local b = backlog(pc, needs[p])
      local room = b + ahead(pc, b)
      if not fits(pc, room, needs[p]) then
        reply = refusal(p, pc, b, room, needs[p])
        break
      end
    end
  end
  local tats = {}
  if not reply then
    for i = 1, m do
      local r, need = tonumber(A[rneeds + 2 * i - 1]), tonumber(A[rneeds + 2 * i])
      local rc = rates[r]
      local now = clock()
      if not rc.tat then
        local v
        if rc.st then v = rc.st.vals[rc.pos] else v = call("GET", rc.key) end
        rc.tat = tonumber(v or "0") or 0
      end
      local nt = math.max(rc.tat, now) + need * rc.interval
      local allowAt = nt - rc.burst * rc.interval
      if allowAt > now then
        reply = {"rate", r, math.ceil(allowAt - now)}
        break
      end
      tats[r] = nt
    end
  end
  if reply then
    -- Skip this request's jobs.
    for _ = 1, J do
      ki = ki + 2
      if A[ai + 4] == "1" then ki = ki + 2 end
      ai = ai + 5
    end
  else
    for r, nt in pairs(tats) do
      rates[r].tat = nt
      rates[r].dirty = true
    end
    for p, pc in ipairs(pools) do
      if counts[p] > 0 then
        pc.b = pc.b + counts[p]
        pc.dirty = true
        if wait and pc.waits and call("ZREM", K[pc.keys], token) == 1 then call("HDEL", K[pc.keys + 1], token) end
      end
    end
    reply = {"ok"}
    for _ = 1, J do
      local taskKey, listKey = K[ki], K[ki + 1]
      ki = ki + 2
      local id = A[ai]
      if A[ai + 4] == "1" then
        local oldTask, oldSet = K[ki], K[ki + 1]
        ki = ki + 2
        local st = call("HGET", oldTask, "state")
        if st == "completed" or st == "archived" then
          call("ZREM", oldSet, id)
          call("DEL", oldTask)
        end
      end
      reply[#reply + 1] = writeJob(taskKey, listKey, ai)
      ai = ai + 5
    end
  end
  replies[q] = reply
end

-- The bounds and rates of admitted requests, one write per door state. A
-- job whose ID was taken meanwhile still counts in the bound: it stays an
-- upper bound.
for _, pc in ipairs(pools) do
  if pc.dirty then
    local set = pc.st.set or {}
    set[#set + 1] = "est"
    set[#set + 1] = pc.b + pc.active
    if pc.counted then
      set[#set + 1] = "counted"
      set[#set + 1] = pc.counted
    end
    pc.st.set = set
  end
end
for _, rc in ipairs(rates) do
  if rc.dirty then
    local v = string.format("%.3f", rc.tat)
    if rc.st then
      local set = rc.st.set or {}
      set[#set + 1] = A[rc.st.fields + rc.pos - 1]
      set[#set + 1] = v
      rc.st.set = set
    else
      call("SET", rc.key, v, "PX", math.ceil(rc.tat - clock()) + 1000)
    end
  end
end
for _, st in ipairs(states) do
  if st.set then call("HSET", st.key, unpack(st.set)) end
end
return replies

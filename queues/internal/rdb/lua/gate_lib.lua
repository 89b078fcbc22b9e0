-- Shared by the gate's entry points (step, release, renew: library.go
-- loads them as one function library, or runs each as a script with this
-- in front). KEYS, with n queues:
--   1-5            leases, waiting, waitexp, holders, grace
--   6 .. 5+4n      per queue (highest tier first): its paused key, pending
--                  list, active list and asynq lease set (four blocks of n)
--   6+4n           the start rate's state (its theoretical arrival time)
--   7+4n           the pool's size set by an operator (Client.Resize)
--   8+4n           the aged marks (steering, see below)
--   9+4n           set while places may be kept (below), with their expiry
--   10+4n          the places kept for jobs taken back from a worker that
--                  stopped answering (hash: member -> place; see take)
--   11+4n          the workers given back for them (sorted set: member
--                  given back -> until when it counts; see handBack)
--   12+4n          the waiters' processes (hash: waiter member -> process),
--                  so that a freed slot can be handed to a waiter (grant)
-- New keys go at the end, after these: the last one is always the
-- waiters' processes.
--
-- The scripts also read the hash of a tier's oldest pending jobs
-- (asynq:{<queue>}:t:<id>, derived from the pending key) for the
-- starvation guard: the only keys they touch that are not in KEYS.
--
-- A call's KEYS and ARGV, and the keys named after them, are set by begin
-- (at the end) at the start of every call, with the rest of the state a
-- call keeps: a loaded library's locals outlive the call.
local KEYS, ARGV
local leases, waiting, waitexp, holders, grace, waitprocs, handbacks, places, placesMark

-- placesKept says how many places are kept for jobs taken back from a
-- worker that stopped answering: read once per call, at the first need,
-- and again after take used one up. Nearly always none: then the places'
-- mark, read with the size (effectiveSize), is not there, and the places
-- cost no read at all.
local placesLeft = nil
local function placesKept()
  if placesLeft == nil then placesLeft = redis.call("HLEN", places) end
  return placesLeft
end
local function usePlace(member)
  redis.call("HDEL", places, member)
  placesLeft = nil
end
local MARK = "compartment-gate"

-- What one call reads more than once is read once and kept for the rest of
-- the call, and the call's own writes keep it true: the number of leases
-- and of waiters (card; every write to those two sets in this library goes
-- through addTo and remFrom; renew writes leases itself but never reads
-- the counts), the end of a recovery grace, and each queue's pause flag
-- (pausedVal, written only by settle here). A call runs alone, so nothing
-- else changes them meanwhile. effectiveSize reads the size, the grace,
-- the places' mark and the flags in one MGET. Each of these was read three
-- to six times per call before (docs/BENCHMARKS.md, section 10, "What a
-- job costs Redis").
local cards = {} -- set key -> its number of members, once read
local graceUntil = nil
local placesMarked = nil -- whether effectiveSize found the places' mark
local pausedVals = {}
local function card(set)
  local c = cards[set]
  if c == nil then
    c = redis.call("ZCARD", set)
    cards[set] = c
  end
  return c
end
local function addTo(set, score, member)
  local added = redis.call("ZADD", set, score, member)
  if cards[set] then cards[set] = cards[set] + added end
end
local function remFrom(set, member)
  local gone = redis.call("ZREM", set, member)
  if cards[set] then cards[set] = cards[set] - gone end
  return gone
end

-- Every time is Redis's own clock, in milliseconds: no worker's clock
-- matters.
local function nowMs()
  local t = redis.call("TIME")
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- splitMember returns a member's (<id>@<queue>) job id and queue.
local function splitMember(m) return string.match(m, "^(.*)@([^@]*)$") end

local function pausedKey(n, i) return KEYS[5 + i] end

-- pausedVal returns the pause flag of the queue of rank i (false: none),
-- read once per call.
local function pausedVal(n, i)
  local v = pausedVals[i]
  if v == nil then
    v = redis.call("GET", pausedKey(n, i))
    pausedVals[i] = v
  end
  return v
end
local function pendingKey(n, i) return KEYS[5 + n + i] end
local function activeKey(n, i) return KEYS[5 + 2 * n + i] end
local function asynqLeaseKey(n, i) return KEYS[5 + 3 * n + i] end

-- taskKey is the hash of job id in the queue of rank i (derived from its
-- pending key: the one key the scripts touch that is not in KEYS).
local function taskKey(n, i, id)
  local pk = pendingKey(n, i)
  return string.sub(pk, 1, #pk - #"pending") .. "t:" .. id
end

local function startRateKey(n) return KEYS[6 + 4 * n] end
local function sizeKey(n) return KEYS[7 + 4 * n] end

-- effectiveSize returns the pool's size in effect: the one an operator set
-- (Client.Resize), read here at every call so that every process follows
-- it at once, or else the configured size the caller passes.
local function effectiveSize(n, configured)
  local keys = {sizeKey(n), grace, placesMark}
  for i = 1, n do keys[#keys + 1] = pausedKey(n, i) end
  local vals = redis.call("MGET", unpack(keys))
  graceUntil = tonumber(vals[2] or "0") or 0
  placesMarked = vals[3] and true or false
  if not placesMarked then placesLeft = 0 end
  for i = 1, n do pausedVals[i] = vals[3 + i] end
  local v = tonumber(vals[1] or "")
  if v and v >= 1 then return v end
  return tonumber(configured)
end
local function agedKey(n) return KEYS[8 + 4 * n] end

-- firstPending returns the highest rank, down to last, whose queue has
-- pending jobs and is not paused by an operator or a breaker (their jobs
-- do not count), or nil; with open, nor paused by the gate (pendingAbove
-- says why).
local function firstPending(n, last, open)
  for i = 1, last do
    local p = pausedVal(n, i)
    if (not p or (p == MARK and not open)) and redis.call("LLEN", pendingKey(n, i)) > 0 then return i end
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

-- forgetWaiter takes member out of the waiters, if it is one.
local function forgetWaiter(member)
  if card(waiting) == 0 then return end
  if remFrom(waiting, member) == 1 then
    redis.call("ZREM", waitexp, member)
    redis.call("HDEL", waitprocs, member)
  end
end

-- freeOwn frees member's slot and its place among the waiters, only where
-- process holds them: a late release (one held back, or sent after a
-- failed call) must never free the slot of a copy of the same job that
-- another process runs now, nor that copy's place in line. ran: the
-- caller knows member waits nowhere in line (it held its slot).
local function freeOwn(member, process, ran)
  if redis.call("HGET", holders, member) == process then
    remFrom(leases, member)
    redis.call("HDEL", holders, member)
  end
  if not ran and card(waiting) > 0 and redis.call("HGET", waitprocs, member) == process then forgetWaiter(member) end
end

-- dropExpiredWaiters and dropExpired look once per call (at its one
-- time, now): what the call adds expires later. The one thing the call
-- may change that dropExpired looked at is whether a lapsed lease's job
-- waits in line (it frees such a lease): keptLapsed holds the leases it
-- kept only because their job did not wait, and take, when it puts one of
-- them in line, has dropExpired look again (as it did at every refused
-- ask before).
local waitersDroppedAt, leasesDroppedAt = nil, nil
local keptLapsed = {}
local function dropExpiredWaiters(now)
  if waitersDroppedAt == now then return end
  waitersDroppedAt = now
  for _, w in ipairs(redis.call("ZRANGEBYSCORE", waitexp, "-inf", now)) do
    remFrom(waiting, w)
    redis.call("ZREM", waitexp, w)
    redis.call("HDEL", waitprocs, w)
  end
end

local function inGrace(now)
  if graceUntil == nil then graceUntil = tonumber(redis.call("GET", grace) or "0") or 0 end
  return graceUntil > now
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
-- lowest tiers must still get one. more (or nil) adds, per rank, jobs
-- counted as running besides the leases (pendingAbove).
local function needs(n, size, more)
  local ranks, run = rankOf(n), {}
  for i = 1, n do run[i] = 0 end
  for _, m in ipairs(redis.call("ZRANGE", leases, 0, -1)) do
    local r = memberRank(ranks, m)
    if r then run[r] = run[r] + 1 end
  end
  local need, worst, res, used = {}, 0, 0, 0
  for i = 1, n do
    need[i] = worst
    res, used = res + reserved[i], used + run[i] + (more and more[i] or 0)
    worst = math.min(math.max(worst, res - used), size - 1)
  end
  return need
end

-- pendingAbove says whether the open queues of rank 1 to last hold more
-- pending jobs than the free slots left once one more is taken could
-- hold: jobs some worker may dequeue next, taking slots tier by tier. With
-- reservations a tier's jobs take only the slots beyond what it must leave
-- to the tiers above it (needs, counting the pending jobs of those tiers
-- as running: each uses up part of their reservation). A queue paused by
-- anyone, the gate included (a full pool with steering or a start rate, a
-- recovery grace, an aged tier served alone), is not dequeued from until a
-- later call opens it, so its jobs hold nobody back.
local PENDING_PATIENCE = 1000
local function pendingAbove(n, last, free, size)
  local pending, total = {}, 0
  for i = 1, n do pending[i] = 0 end
  for i = 1, last do
    if not pausedVal(n, i) then
      pending[i] = redis.call("LLEN", pendingKey(n, i))
      total = total + pending[i]
      if total >= free then return true end
    end
  end
  if not reserving or total == 0 then return false end
  local need, left = needs(n, size, pending), free - 1
  for i = 1, last do
    if pending[i] > left - need[i] then return true end
    left = left - pending[i]
  end
  return false
end

-- oldestPending returns when the oldest pending job of rank i became
-- pending, in ms (asynq's pending_since, in ns, written by the process
-- that enqueued or forwarded it), or nil. A job put back at the head by a
-- worker's shutdown has no stamp: the next ones are looked at, up to
-- AGED_SCAN.
local AGED_SCAN = 8
local function oldestPending(n, i)
  local pk = pendingKey(n, i)
  for j = 1, AGED_SCAN do
    local id = redis.call("LINDEX", pk, -j)
    if not id then return nil end
    local ns = redis.call("HGET", taskKey(n, i, id), "pending_since")
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
      local p = pausedVal(n, i)
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
--
-- A full pool keeps its queues open while fewer than WAIT_AHEAD times
-- its size of jobs wait for a slot: those jobs are in some process's
-- hand when a slot frees, and the release hands it to the best of them at
-- once (see take and gate_release.lua), while a process that found its
-- queue paused would sleep (asynq's poll interval) before it looked
-- again. Each process holds no more of the pool's jobs than its asynq
-- concurrency, which has room for half as many again as it runs
-- (PoolConfig.lookAhead): three processes fill at most 3.5 times the
-- size, below the bound, so their loops wait for a worker of their own
-- rather than sleep on a paused queue. A pool with steering
-- (reservations, maximum waits) or a start rate pauses as soon as it is
-- full, as before: its rules need the free slots to be seen.
local RATE_READY = 2
local WAIT_AHEAD = 4
local function settle(n, size, count, strict, now)
  local k, only = n, nil
  if rateBurst > 0 then dropExpiredWaiters(now) end
  -- Many jobs waiting pause the queues, except while a job taken back
  -- from a worker that stopped answering (places) has yet to be dequeued
  -- again: it is at the head of its queue, and a slot is kept for it.
  if (count >= size and (reserving or aging or rateBurst > 0 or
      (card(waiting) >= WAIT_AHEAD * size and placesKept() == 0)))
      or inGrace(now) or (rateBurst > 0 and card(waiting) >= RATE_READY) then
    k = 0
  else
    local need = reserving and needs(n, size) or nil
    if aging and strict then only = agedTier(n, size - count, need, now) end
    -- The last tier is open whether or not it has pending jobs.
    if strict then k = firstPending(n, n - 1) or n end
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
    local key, v = pausedKey(n, i), pausedVal(n, i)
    if (only and i == only) or (not only and i <= k) then
      if v == MARK then
        redis.call("DEL", key)
        pausedVals[i] = false
      end
    elseif not v then
      redis.call("SET", key, MARK)
      pausedVals[i] = MARK
    end
  end
end

-- dropExpired frees the slots whose lease lapsed, and drops the waiters
-- whose entry did. A lapsed slot whose job asynq still leases (its id in
-- its queue's lease set: no process finished it, nobody took it back) is
-- not freed: its process stopped renewing, and either it is stalled and
-- may still run the job, or it died and the job is about to be taken back
-- (rdb's lua/recover_job.lua), which keeps the slot for it. Freed here,
-- the slot would go to a waiter, and the job taken back a moment later
-- would wait for the next job to end anywhere. asynq's own recoverer, the
-- last resort, takes the job out of the lease set, and the slot is freed
-- at the next call.
local function dropExpired(n, now)
  if leasesDroppedAt == now then return end
  leasesDroppedAt = now
  local ranks = nil
  for _, m in ipairs(redis.call("ZRANGEBYSCORE", leases, "-inf", now)) do
    local id, q = splitMember(m)
    ranks = ranks or rankOf(n)
    local i = q and ranks[q]
    -- Kept only while nobody runs the job again: a job that asks for a
    -- slot (it waits in line) is a new attempt of it, so the lapsed slot
    -- is its old one (its process stopped before it freed it), and
    -- keeping it would make the new attempt wait for itself forever.
    if not (i and redis.call("ZSCORE", asynqLeaseKey(n, i), id)) or redis.call("HEXISTS", waitprocs, m) == 1 then
      remFrom(leases, m)
      redis.call("HDEL", holders, m)
    else
      keptLapsed[m] = true
    end
  end
  dropExpiredWaiters(now)
end

-- reRankWaiters gives every waiter the rank of its tier in the order in
-- effect, keeping when it first asked: a reload that reorders the tiers
-- (or switches between strict and weighted) then orders the jobs already
-- waiting too, at the settle that follows it. Aged waiters (ranked 0)
-- keep their place.
local function reRankWaiters(n, strict)
  local ranks = rankOf(n)
  local ws = redis.call("ZRANGE", waiting, 0, -1, "WITHSCORES")
  for j = 1, #ws, 2 do
    local score, r = tonumber(ws[j + 1]), memberRank(ranks, ws[j])
    if score >= 1e13 and r then
      local want = (strict and r or 1) * 1e13 + score % 1e13
      if want ~= score then addTo(waiting, want, ws[j]) end
    end
  end
end

-- fresh says whether waiter w asked in the last WAITER_FRESH ms: a live
-- process's waiters ask every 100 ms (each time their expiry is set to
-- now + ttl). A waiter that is not fresh belongs to a process that died
-- (or is cut off from Redis): it gets no slot handed to it and holds no
-- other job back, from a second after its process stopped asking until
-- its entry expires (ttl).
local WAITER_FRESH = 1000
local function fresh(w, now, ttl)
  return tonumber(redis.call("ZSCORE", waitexp, w) or "0") >= now + ttl - WAITER_FRESH
end

-- Slots kept for jobs taken back from a worker that stopped answering
-- (rdb's lua/recover_job.lua gives each a place, in places, at the head of
-- its tier): a free slot goes to such a job before anyone asks for it, as
-- long as its place is ahead of the best live waiter's (and of the asking
-- job's, before: the place of the job that asks), held under KEPT for
-- KEEP_MS; the job takes it when it asks (take), and a slot it does not
-- take in that time lapses like any lease (the place stays, until the job
-- asks or the places lapse, two minutes after the last recovery; while one
-- is there, many jobs waiting do not pause the queues: settle). Not in a
-- pool with steering or
-- a start rate, whose rules must see every start: there a taken-back job
-- only keeps its place.
local KEPT = "(kept for a job taken back)"
local KEEP_MS = 10000
local function keepSlots(size, count, now, ttl, before)
  if reserving or aging or rateBurst > 0 or inGrace(now) or placesKept() == 0 then return count end
  local all = redis.call("HGETALL", places)
  local kept = {}
  for i = 1, #all, 2 do kept[#kept + 1] = {all[i], tonumber(all[i + 1])} end
  table.sort(kept, function(a, b) return a[2] < b[2] end)
  local best = before
  local ws = redis.call("ZRANGE", waiting, 0, 31, "WITHSCORES")
  for i = 1, #ws, 2 do
    if fresh(ws[i], now, ttl) then
      local sc = tonumber(ws[i + 1])
      if not best or sc < best then best = sc end
      break
    end
  end
  for _, k in ipairs(kept) do
    if count >= size or (best and k[2] > best) then break end
    if not redis.call("ZSCORE", leases, k[1]) then
      addTo(leases, now + KEEP_MS, k[1])
      redis.call("HSET", holders, k[1], KEPT)
      count = count + 1
    end
  end
  return count
end

-- take: may the job member (its tier's rank, 1 = highest; asked by
-- process) take one of the pool's slots now? When it may, it takes one
-- and stops being a waiter. When it may not, it becomes (or stays) a
-- waiter: ranked by tier, then by when it first asked, with strict tiers;
-- by when it first asked only, with weighted ones (their order is the
-- dequeue order asynq's weights chose). readyAt is when the job was first
-- ready to run (ms, 0: unknown), for the starvation guard.
--
-- mode: "ask" for a job asking on its own (it may become a waiter; the
-- flags are settled); "batch" for one of several asking in one call (the
-- caller settles once for all); "grant" when a release hands a freed slot
-- to this waiter (grantFree): a refusal then leaves the waiter exactly as
-- it was (its own process keeps its entry fresh, so a dead process's
-- waiters still expire), and the caller settles.
--
-- waited (ms) is how long the job has waited in its process before this
-- question: a first question is placed in line as of that long ago.
--
-- grantFree passes what it knows already in "grant" mode: the waiter's
-- score (known), and clear when no live waiter is ahead of it (so the
-- line need not be read again to find one).
--
-- Returns taken, the count of slots held, and when the start rate allows
-- a start (ms, 0: now or no rate).
local function take(n, size, member, rank, process, ttl, strict, readyAt, now, mode, known, clear, waited)
  local granting, settles = mode == "grant", mode == "ask"
  -- A job that already holds its slot in this process (its earlier call
  -- took it, or a release handed it one, but the reply was lost: a
  -- failover, a dropped connection) keeps it: asking again must not make
  -- it wait behind its own lease. Another process's lease under the same
  -- member (a copy of the job that asynq's recoverer handed out while the
  -- first still runs) does not count: that copy asks as any other job.
  -- A job taken back from a worker that stopped answering finds the slot
  -- kept for it (keepSlots), whichever process asks with it first.
  -- Where the job will most likely take a slot (room, nobody waiting), it
  -- claims the holder's field at once (HSETNX: one command where a read
  -- and a write were two) and gives it back if it does not take one after
  -- all; a field already there is read as before.
  local h, claimed = nil, false
  if not granting and card(leases) < size and card(waiting) == 0 and redis.call("HSETNX", holders, member, process) == 1 then
    claimed = true
  else
    h = redis.call("HGET", holders, member)
  end
  if h == KEPT and redis.call("ZSCORE", leases, member) then
    redis.call("HSET", holders, member, process)
    usePlace(member)
    h = process
  end
  if h == process and redis.call("ZSCORE", leases, member) then
    addTo(leases, now + ttl, member)
    forgetWaiter(member)
    return true, card(leases), 0
  end

  local count = card(leases)
  if count >= size then
    -- Full, or holding leases of a process that died: drop expired ones.
    dropExpired(n, now)
    count = card(leases)
  end
  -- A job asks as the top tier (rank 0) once it is aged: marked by the
  -- starvation guard (agedTier), or waited past its tier's maximum wait,
  -- counted from when it was first ready or, when that is unknown, from
  -- when it first asked. An aged waiter is ranked among the aged by that
  -- time; a waiter keeps the best rank it has had.
  local prev = -1
  if known then
    prev = known
  elseif card(waiting) > 0 then
    prev = tonumber(redis.call("ZSCORE", waiting, member) or "-1")
  end
  -- A job taken back from a worker that stopped answering (rdb's
  -- lua/recover_job.lua) asks with the place kept for it: at the head of
  -- its tier. The place moves into the line (or is used up) now.
  local kept = placesKept() > 0 and redis.call("HGET", places, member)
  if kept then
    usePlace(member)
    if prev < 0 or tonumber(kept) < prev then prev = tonumber(kept) end
  end
  local score = prev >= 0 and prev or ((strict and rank or 1) * 1e13 + now - math.min(waited or 0, now))
  if aging and score >= 1e13 then
    local since = readyAt > 0 and readyAt or (score - rank * 1e13)
    local a = redis.call("ZSCORE", agedKey(n), member)
    if (a and tonumber(a) > now) or (maxWait[rank] > 0 and now - since > maxWait[rank]) then
      score = math.min(since, now)
    end
  end
  local myRank = math.floor(score / 1e13)
  if not granting and count < size then count = keepSlots(size, count, now, ttl, score) end
  local ok = count < size and not inGrace(now)
  -- Reservations: a job may take a slot only while the free slots exceed
  -- what its tier must leave to the tiers above it.
  local need, ranks = nil, nil
  if ok and reserving then
    need, ranks = needs(n, size), rankOf(n)
    ok = size - count > need[rank]
  end
  if ok and card(waiting) > 0 and not (clear and not need) then
    if not granting then dropExpiredWaiters(now) end
    -- The best live waiter goes first (one that is not fresh holds
    -- nothing back); with reservations, the best one that may take a free
    -- slot now: one a reservation holds back does not hold back the tiers
    -- it serves.
    local offset = 0
    repeat
      local ws = redis.call("ZRANGEBYSCORE", waiting, "-inf", "(" .. score, "LIMIT", offset, 16)
      for _, w in ipairs(ws) do
        if w ~= member and fresh(w, now, ttl) then
          local r = need and memberRank(ranks, w)
          if not need or not r or size - count > need[r] then
            ok = false
            break
          end
        end
      end
      offset = offset + 16
    until not ok or #ws < 16
  end
  if ok then
    -- A job of a higher tier that was taken from its queue but has not
    -- asked yet goes first: it sits in asynq's active list with a fresh
    -- asynq lease (renewed in the last 5 s, so not left behind by a dead
    -- process), holds no slot and is no waiter. An aged job counts as the
    -- top tier.
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
    -- Nor does any job go ahead of a job marked aged that is about to be
    -- dequeued: the head of its tier's queue, which the gate keeps open
    -- for it (not paused by an operator or a breaker), when a reservation
    -- does not hold it back. Otherwise jobs already waiting would take
    -- every slot that frees before any process dequeues it. A mark whose
    -- job is neither (deleted, moved) holds nothing back.
    if ok and aging and myRank > 0 then
      ranks = ranks or rankOf(n)
      for _, m in ipairs(redis.call("ZRANGEBYSCORE", agedKey(n), now, "+inf")) do
        local id, r = string.match(m, "^(.*)@[^@]*$"), memberRank(ranks, m)
        if id and r then
          local p = pausedVal(n, r)
          if dequeuedNotAsked(r, id) or ((not p or p == MARK) and (not need or size - count > need[r])
              and redis.call("LINDEX", pendingKey(n, r), -1) == id) then
            ok = false
            break
          end
        end
      end
    end
  end
  -- Nor does a lower tier's job take one of the last free slots that a
  -- higher tier's pending jobs in open queues need (with reservations, a
  -- tier's jobs need slots beyond what it must leave to the tiers above
  -- it: pendingAbove): a dequeue loop of asynq asks one
  -- queue after the other, so a loop that found the higher tier's queue
  -- empty an instant before its jobs were enqueued, and the lower tier's
  -- queue an instant after, holds a lower tier's job taken ahead of them
  -- (the queues are paused only at the next call here). It waits in line
  -- while the higher tier's jobs are dequeued (their queue is open), at
  -- most PENDING_PATIENCE from its first question: a bound for when no
  -- worker is free to dequeue them.
  if ok and strict and myRank > 1 and now - (score - myRank * 1e13) < PENDING_PATIENCE
      and pendingAbove(n, myRank - 1, size - count, size) then
    ok = false
  end
  -- A job of a tier with a maximum wait that is not aged yet does not go
  -- ahead of a higher tier's pending jobs: while an aged job's queue is
  -- the only one open, other processes may dequeue the next jobs of its
  -- tier in the same instant; they wait until they are aged themselves
  -- (or the higher tiers run dry) instead of starting ahead of their turn.
  if ok and aging and myRank > 0 and maxWait[rank] > 0 and firstPending(n, rank - 1) then ok = false end
  local wait = 0
  if ok then
    wait = rateWait(n, now)
    ok = wait == 0
  end
  if ok then
    rateTake(n, now)
    addTo(leases, now + ttl, member)
    if not claimed then redis.call("HSET", holders, member, process) end
    forgetWaiter(member)
    if aging then redis.call("ZREM", agedKey(n), member) end
    count = count + 1
    if settles then
      settle(n, size, count, strict, now)
      -- Jobs that waited behind this aged one may go now if room is left.
      if myRank == 0 and count < size and card(waiting) > 0 then
        redis.call("PUBLISH", leases .. ":freed", "1")
      end
    end
    return true, count, 0
  end
  if claimed then redis.call("HDEL", holders, member) end
  if granting then return false, count, wait end
  addTo(waiting, score, member)
  redis.call("ZADD", waitexp, now + ttl, member)
  redis.call("HSET", waitprocs, member, process)
  if keptLapsed[member] then
    keptLapsed[member] = nil
    leasesDroppedAt = nil
  end
  -- A waiter keeps its aged rank in its score.
  if aging then redis.call("ZREM", agedKey(n), member) end
  if settles then settle(n, size, count, strict, now) end
  return false, count, wait
end

-- grantFree hands the pool's free slots at once to the best waiters that
-- may take them (take, "grant"): their leases are written here, held by
-- their processes, so they start with no further call. Waiters in order,
-- best first, up to GRANT_SCAN; without reservations, a waiter that may
-- not go means none behind it may. Returns the count, the members granted
-- to process (the caller) and "process<TAB>member" for the others.
-- Only a live waiter (fresh) gets a slot this way.
local GRANT_SCAN = 32
local function grantFree(n, size, count, strict, ttl, process, now)
  local mine, others = {}, {}
  if count < size then count = keepSlots(size, count, now, ttl, nil) end
  if count >= size or card(waiting) == 0 or inGrace(now) then return count, mine, others end
  dropExpiredWaiters(now)
  local ranks = rankOf(n)
  -- clear: every waiter passed so far was granted or is not live, so none
  -- is ahead of the next one (take need not look).
  local clear = true
  local ws = redis.call("ZRANGE", waiting, 0, GRANT_SCAN - 1, "WITHSCORES")
  for j = 1, #ws, 2 do
    if count >= size then break end
    local w = ws[j]
    local proc, r = redis.call("HGET", waitprocs, w), memberRank(ranks, w)
    local live = fresh(w, now, ttl)
    if proc and r and live then
      local taken, c = take(n, size, w, r, proc, ttl, strict, 0, now, "grant", tonumber(ws[j + 1]), clear)
      if taken then
        count = c
        if proc == process then mine[#mine + 1] = w else others[#others + 1] = proc .. "\t" .. w end
      elseif not reserving then
        break
      else
        clear = false
      end
    elseif live then
      clear = false
    end
  end
  return count, mine, others
end

-- announce publishes the grants to each process they went to, on that
-- process's own channel (channel:<process>; "g", then one
-- "process<TAB>member" line each), and, when room is left and jobs still
-- wait (a rule held them back), "1" on channel, which every process
-- hears: every waiter asks again. A grant reaches only its process: on
-- the shared channel, every grant cost Redis a write to every process
-- subscribed, and every process a message to read and drop, a cost per
-- grant that grows with the number of processes.
local function announce(channel, size, count, others)
  local byProc, procs = {}, {}
  for _, line in ipairs(others) do
    local proc = string.match(line, "^([^\t]*)\t")
    if not byProc[proc] then
      byProc[proc] = {}
      procs[#procs + 1] = proc
    end
    byProc[proc][#byProc[proc] + 1] = line
  end
  for _, proc in ipairs(procs) do
    redis.call("PUBLISH", channel .. ":" .. proc, "g\n" .. table.concat(byProc[proc], "\n"))
  end
  if count < size and card(waiting) > 0 then redis.call("PUBLISH", channel, "1") end
end

-- handOn writes the lease of member, a job of process that a job ending in
-- the same process handed its slot to without asking Redis first (the
-- gate's handLocked): the caller freed the ending job's lease just
-- before, in the same call, so the count does not move. The job runs
-- already, so its lease is written even where the ending job's had lapsed
-- (as a recovery re-adds the slots of running jobs). One that holds a
-- lease already (a release elsewhere handed it a slot meanwhile) keeps
-- it, and the slot freed goes on to the next waiter (grantFree); another
-- process's lease under the same member (a copy of the job) is left as it
-- is. new: member never asked for a slot, so it is no waiter to take out
-- of the line.
local function handOn(member, process, ttl, now, new)
  if redis.call("HSETNX", holders, member, process) == 0 and redis.call("HGET", holders, member) ~= process then return end
  addTo(leases, now + ttl, member)
  if not new then forgetWaiter(member) end
end

-- bestOther returns the rank of the best live waiter of a process other
-- than process and how long it has waited (ms), so that process may hand
-- the slot of a job that ends to one of its own jobs without asking Redis
-- (the gate's handLocked, takeHeldRelease) only while that keeps to the
-- order a release here would keep: 0, 0 when there is none; for a full
-- pool whose first HAND_SCAN waiters all belong to process, the last of
-- them (no other process's waiter is ahead of it). A pool with room hands
-- on only while nobody waits at all: -1 when someone does. -1 too when no
-- slot may be handed on that way: a pool with steering or a start rate,
-- whose rules must see every freed slot, or a recovery grace.
local HAND_SCAN = 8
local function bestOther(n, strict, process, now, ttl, count, size)
  if reserving or aging or rateBurst > 0 or inGrace(now) or placesKept() > 0 then return -1, 0 end
  if count < size then
    if card(waiting) > 0 then return -1, 0 end
    -- Nor while higher tiers' pending jobs need the free slots (take): a
    -- take-over does not see them. The lowest tier's pending jobs hold
    -- nobody back, so a pool of one queue never looks.
    if strict and pendingAbove(n, n - 1, size - count, size) then return -1, 0 end
    return 0, 0
  end
  local rank, age = 0, 0
  local ws = redis.call("ZRANGE", waiting, 0, HAND_SCAN - 1, "WITHSCORES")
  local last = nil
  for j = 1, #ws, 2 do
    local w, score = ws[j], tonumber(ws[j + 1])
    last = score
    if redis.call("HGET", waitprocs, w) ~= process and fresh(w, now, ttl) then
      rank, age = math.floor(score / 1e13), math.max(0, now - score % 1e13)
      break
    end
  end
  if rank == 0 and last and #ws == 2 * HAND_SCAN then rank, age = math.floor(last / 1e13), math.max(0, now - last % 1e13) end
  -- A higher tier with pending jobs than that waiter (or any, with none)
  -- counts as a waiter of its tier that has waited no time: the slot a job
  -- ends with is the one those jobs need (take), and only a job of their
  -- tier or a higher one may have it here. The lowest tier never counts.
  if strict then
    local p = firstPending(n, (rank > 0 and rank - 1) or (n - 1), true)
    if p then return p, 0 end
  end
  return rank, age
end

-- Giving a worker back. A job taken back from a worker that stopped
-- answering goes to the head of its queue with a slot kept for it, but it
-- starts only once a worker (one of asynq's, in some process) dequeues
-- it. When every worker of every process holds a job waiting for a slot
-- (the look-ahead), none would until some job ends anywhere: the length
-- of a report. So a process whose jobs ask while such a job is still in
-- its queue gives back the worker of its worst-placed waiter among them:
-- the waiter's job goes back to its queue just behind the jobs taken back
-- (it keeps its place in the waiting line, which it finds again when it
-- asks), the caller's handler returns at once, and the worker it frees
-- dequeues the job taken back. One worker per such job, across all
-- processes: each one given is counted in handbacks for HANDBACK_MS, by
-- when it has surely dequeued what it was freed for.
local HANDBACK_MS = 2000
local HANDBACK_SCAN = 64

-- handBack gives back the workers of up to as many of asking (this
-- process's jobs that asked in this call and wait: {member}) as
-- jobs taken back still wait in their queue for one, less those given in
-- the last HANDBACK_MS. ttl is the waiters' entry time (ms). Returns the
-- members given back.
local function handBack(n, asking, ttl, now)
  if #asking == 0 or placesKept() == 0 then return {} end
  local ranks = rankOf(n)
  local need = 0
  local all = redis.call("HGETALL", places)
  for j = 1, #all, 2 do
    local id, q = splitMember(all[j])
    local i = q and ranks[q]
    if i and redis.call("HGET", taskKey(n, i, id), "state") == "pending" then need = need + 1 end
  end
  if need == 0 then return {} end
  redis.call("ZREMRANGEBYSCORE", handbacks, "-inf", now)
  need = need - redis.call("ZCARD", handbacks)
  if need <= 0 then return {} end
  -- Worst first: the latest place; among equal places, the latest asked.
  for j, w in ipairs(asking) do
    w[2], w[3] = tonumber(redis.call("ZSCORE", waiting, w[1]) or "0"), j
  end
  table.sort(asking, function(a, b)
    if a[2] ~= b[2] then return a[2] > b[2] end
    return a[3] > b[3]
  end)
  local given = {}
  for _, w in ipairs(asking) do
    if need == 0 then break end
    local id, q = splitMember(w[1])
    local i = q and ranks[q]
    -- Still this process's, dequeued and not holding a slot.
    if i and not redis.call("ZSCORE", leases, w[1]) and redis.call("ZSCORE", asynqLeaseKey(n, i), id)
        and redis.call("LREM", activeKey(n, i), 1, id) == 1 then
      redis.call("ZREM", asynqLeaseKey(n, i), id)
      -- Behind the jobs taken back at the head of the queue (asynq
      -- dequeues from the right).
      local pk, ahead = pendingKey(n, i), {}
      for _ = 1, HANDBACK_SCAN do
        local h = redis.call("LINDEX", pk, -1)
        if not h or redis.call("HEXISTS", places, h .. "@" .. q) == 0 then break end
        ahead[#ahead + 1] = redis.call("RPOP", pk)
      end
      redis.call("RPUSH", pk, id)
      for j = #ahead, 1, -1 do redis.call("RPUSH", pk, ahead[j]) end
      redis.call("HSET", taskKey(n, i, id), "state", "pending")
      -- Its place stays in the line, but no slot is handed to it and it
      -- holds nobody back (not fresh) until it asks again.
      redis.call("HDEL", waitprocs, w[1])
      redis.call("ZADD", waitexp, "XX", now + ttl - WAITER_FRESH - 1, w[1])
      redis.call("ZADD", handbacks, now + HANDBACK_MS, w[1])
      given[#given + 1] = w[1]
      need = need - 1
    end
  end
  if #given > 0 then redis.call("PEXPIRE", handbacks, HANDBACK_MS) end
  return given
end

-- begin starts a call: it sets the call's keys and arguments and resets
-- every piece of state above that a call keeps, so that nothing one call
-- learnt reaches the next (the library stays loaded between calls).
-- TestGateLibBeginResetsState checks that each such local is set here.
local function begin(keys, args)
  KEYS, ARGV = keys, args
  leases, waiting, waitexp, holders, grace = keys[1], keys[2], keys[3], keys[4], keys[5]
  waitprocs, handbacks, places, placesMark = keys[#keys], keys[#keys - 1], keys[#keys - 2], keys[#keys - 3]
  placesLeft = nil
  cards, graceUntil, placesMarked = {}, nil, nil
  pausedVals = {}
  rateInterval, rateBurst = 0, 0
  waitersDroppedAt, leasesDroppedAt = nil, nil
  keptLapsed = {}
  reserved, maxWait = {}, {}
  reserving, aging = false, false
end

-- pool_stats: one pool's queues and slots, read in one step, so that every
-- count in the reply describes the same instant (a job counted as running
-- is never also counted as waiting, and a slot's holder is never missing).
--
-- KEYS, with n queues (highest tier first):
--   8(i-1)+1 .. 8i   queue i: pending, active, scheduled, retry, archived,
--                    completed, paused, asynq's count of jobs processed
--   8n+1 .. 8n+5     cluster-scoped pools only: the gate's leases, their
--                    holders, the size an operator set, the processes'
--                    capacities and when each was last seen
-- ARGV: n, "1" for a cluster-scoped pool, then n task-key prefixes
-- (asynq:{<queue>}:t:), then the n queue names.
--
-- Reply: {queues, slots}. queues[i] = {pending, active, scheduled, retry,
-- archived, completed, pending_since of the oldest pending job or "",
-- paused value or "", running, processed}: running is how many of the queue's jobs
-- hold a slot of the gate (cluster-scoped), or asynq's active count
-- (process-scoped: a job runs as soon as it is taken); processed is
-- asynq's running count of the jobs it processed (succeeded or failed).
-- slots = {leases,
-- operator size or 0, live processes, their capacity, holder1, n1, ...}.
local n = tonumber(ARGV[1])
local cluster = ARGV[2] == "1"

local running = {}
local slots = {0, 0, 0, 0}
if cluster then
  local base = 8 * n
  local t = redis.call("TIME")
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local members = redis.call("ZRANGEBYSCORE", KEYS[base + 1], now, "+inf")
  local byHolder, order = {}, {}
  for _, m in ipairs(members) do
    local q = string.match(m, "@([^@]*)$")
    if q then running[q] = (running[q] or 0) + 1 end
    -- Every script that adds a lease writes its holder in the same step,
    -- and frees both together: a live lease always has one.
    local h = redis.call("HGET", KEYS[base + 2], m) or "?"
    if not byHolder[h] then byHolder[h] = 0; order[#order + 1] = h end
    byHolder[h] = byHolder[h] + 1
  end
  slots[1] = #members
  slots[2] = tonumber(redis.call("GET", KEYS[base + 3]) or "0") or 0
  local live = redis.call("ZRANGEBYSCORE", KEYS[base + 5], now, "+inf")
  slots[3] = #live
  local capacity = 0
  for _, p in ipairs(live) do
    capacity = capacity + (tonumber(redis.call("HGET", KEYS[base + 4], p) or "0") or 0)
  end
  slots[4] = capacity
  for _, h in ipairs(order) do
    slots[#slots + 1] = h
    slots[#slots + 1] = byHolder[h]
  end
end

local queues = {}
for i = 1, n do
  local k = 8 * (i - 1)
  local oldest = redis.call("LINDEX", KEYS[k + 1], -1)
  local since = false
  if oldest then since = redis.call("HGET", ARGV[2 + i] .. oldest, "pending_since") end
  local active = redis.call("LLEN", KEYS[k + 2])
  local run = active
  if cluster then run = running[ARGV[2 + n + i]] or 0 end
  queues[i] = {redis.call("LLEN", KEYS[k + 1]), active, redis.call("ZCARD", KEYS[k + 3]),
    redis.call("ZCARD", KEYS[k + 4]), redis.call("ZCARD", KEYS[k + 5]), redis.call("ZCARD", KEYS[k + 6]),
    since or "", redis.call("GET", KEYS[k + 7]) or "", run, tonumber(redis.call("GET", KEYS[k + 8]) or "0") or 0}
end
return {queues, slots}

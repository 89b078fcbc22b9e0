-- admit_fast: the door's common case, kept small because Lua, not Redis,
-- is what an enqueue at the door costs (see docs/DOOR.md). Single
-- jobs of one pool, enqueued now, each with the same rates (the pool's own
-- enqueue rates, held in its door state), are admitted in order while the
-- door state's bound of the backlog is fresh, nobody waits in line, the
-- job fits under its tier's limit by the bound and every rate lets it
-- pass. At the first job for which any of that does not hold, the script
-- stops: it has written nothing for that job or the ones after it, and
-- the caller takes them to the general script (lua/admit.lua), which
-- counts exactly, refuses, waits, or admits. A refusal is never decided
-- here.
--
-- Every key is in KEYS, all of them the pool's:
--   KEYS[1]  the pool's door state (hash: est, counted, tat:<rate>)
--   KEYS[2]  the pool's line of waiting requests, when ARGV[3] is "1"
--   then per job: its task hash and its tier's pending list.
-- ARGV: 1 recount interval ms, 2 pending_since (Unix ns), 3 "1" if the
-- pool has a waiting line (KEYS[2]), 4 "1" if the pool has a backlog
-- limit, 5 R (rates every job passes), then R door state fields, then R
-- pairs of interval ms and tolerance ms (burst times interval), then per
-- job: its tier's limit, id, message.
-- Returns, per job admitted (a prefix of the jobs, maybe none): 1 if
-- written, 0 if its ID was taken meanwhile (it still counts in the bound).
local A, K, call, tonumber = ARGV, KEYS, redis.call, tonumber
local R = tonumber(A[5])
local v = call("HMGET", K[1], "est", "counted", unpack(A, 6, 5 + R))
local t = call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local backlog = A[4] == "1"
local est
if backlog then
  local counted
  est, counted = tonumber(v[1] or ""), tonumber(v[2] or "")
  if not est or not counted or now < counted or now - counted >= tonumber(A[1]) then return {} end
  if A[3] == "1" and call("EXISTS", K[2]) == 1 then return {} end
end
local tat, iv, tol = {}, {}, {}
for i = 1, R do
  tat[i] = tonumber(v[2 + i] or "0") or 0
  iv[i], tol[i] = tonumber(A[4 + R + 2 * i]), tonumber(A[5 + R + 2 * i])
end
local out = {}
local ai, ki = 6 + 3 * R, 2
if A[3] == "1" then ki = 3 end
for j = 1, (#A - ai + 1) / 3 do
  if backlog and est + 1 > tonumber(A[ai]) then break end
  local ok = true
  for i = 1, R do
    if math.max(tat[i], now) + iv[i] - tol[i] > now then
      ok = false
      break
    end
  end
  if not ok then break end
  for i = 1, R do tat[i] = math.max(tat[i], now) + iv[i] end
  if backlog then est = est + 1 end
  if call("EXISTS", K[ki]) == 1 then
    out[j] = 0
  else
    call("HSET", K[ki], "msg", A[ai + 2], "state", "pending", "pending_since", A[2])
    call("LPUSH", K[ki + 1], A[ai + 1])
    out[j] = 1
  end
  ai, ki = ai + 3, ki + 2
end
if #out > 0 and (backlog or R > 0) then
  local set = {}
  if backlog then set[1], set[2] = "est", est end
  for i = 1, R do
    set[#set + 1] = A[5 + i]
    set[#set + 1] = tat[i]
  end
  call("HSET", K[1], unpack(set))
end
return out

-- step: what one process asks of the gate at one moment, in one call:
-- free the slots of the jobs that ended, hand the free slots to the best
-- waiters in any process (grantFree), then let each job that asks take a
-- slot or become a waiter (take, "batch"); settle the flags once and
-- announce.
-- ARGV: configured size (an operator's resize wins: effectiveSize), n,
-- the calling process, lease TTL ms, strict ("1"/"0"), wake channel, the
-- start rate's interval ms and burst (0: none), the steering
-- ("reserved:maxWaitMs," per rank, or "": see setSteering), the number of
-- members to free, then for each the member, the member of the calling
-- process its slot was handed to ("": none; handOn) and flags: "r" when
-- the member freed held its slot and waits nowhere in line, "n" when the
-- one handed to never asked (neither is then looked for among the
-- waiters), then per job asking:
-- its member, its rank (1 = highest tier), when it was first ready to run
-- (ms, by the enqueuing process's clock; 0: unknown) and how long it has
-- waited in its process already (ms: a first question's place in line is
-- as of then).
-- Returns {count, number of jobs asking, the size in effect, the rank of
-- the best live waiter of another process and how long it has waited (ms)
-- (bestOther), then per job asking 1 (taken), 0 (waits) or 2 (its
-- worker given back to a job taken back: handBack) and when the
-- start rate allows its start (ms, 0: now or no rate), then the members
-- granted to the calling process}. A member is freed only where the
-- calling process holds it (freeOwn).
local n = tonumber(ARGV[2])
local size = effectiveSize(n, ARGV[1])
local process, ttl, strict, channel = ARGV[3], tonumber(ARGV[4]), ARGV[5] == "1", ARGV[6]
setRate(ARGV[7], ARGV[8])
setSteering(ARGV[9], n)
local now = nowMs()
local freed = tonumber(ARGV[10])
for i = 11, 10 + 3 * freed, 3 do
  local flags = ARGV[i + 2]
  freeOwn(ARGV[i], process, string.find(flags, "r", 1, true))
  if ARGV[i + 1] ~= "" then handOn(ARGV[i + 1], process, ttl, now, string.find(flags, "n", 1, true)) end
end
-- Waiters asked first: they get the free slots before the jobs asking now.
local count, mine, others = grantFree(n, size, card(leases), strict, ttl, process, now)
local out = {0, 0, size, 0, 0}
local asks = 0
local waits, at = {}, {}
for i = 11 + 3 * freed, #ARGV - 3, 4 do
  local taken, c, wait = take(n, size, ARGV[i], tonumber(ARGV[i + 1]), process, ttl, strict, tonumber(ARGV[i + 2]) or 0, now, "batch", nil, nil, tonumber(ARGV[i + 3]) or 0)
  count = c
  asks = asks + 1
  out[#out + 1] = taken and 1 or 0
  out[#out + 1] = wait
  if not taken then
    waits[#waits + 1] = {ARGV[i]}
    at[ARGV[i]] = #out - 1
  end
end
for _, m in ipairs(handBack(n, waits, ttl, now)) do out[at[m]] = 2 end
settle(n, size, count, strict, now)
announce(channel, size, count, others)
out[1], out[2] = count, asks
out[4], out[5] = bestOther(n, strict, process, now, ttl, count, size)
for _, m in ipairs(mine) do out[#out + 1] = m end
return out

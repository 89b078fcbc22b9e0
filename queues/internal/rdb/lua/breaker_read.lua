-- read: the breaker as it stands, for an operator, in one atomic look.
-- Writes nothing (buckets older than the window are skipped, not
-- dropped). Returns Redis's clock (ms), the state ("closed" when never
-- set), the state hash (HGETALL), the probes running (half-open only,
-- their leases not lapsed) and the calls, failures and slow calls in the
-- window.
local now = nowMs()
local st = current()
local running = 0
if st == "half-open" then running = redis.call("ZCOUNT", probesKey, now, "+inf") end
local c, f, s = sums(now, false)
return {now, st, redis.call("HGETALL", stateKey), running, c, f, s}

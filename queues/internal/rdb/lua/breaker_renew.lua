-- renew: extend the leases of the probes a process runs. ARGV[8..]: their
-- members. A probe that already ended (or belongs to an earlier half-open
-- state) is not brought back. Returns result(...).
local now = nowMs()
for i = 8, #ARGV do redis.call("ZADD", probesKey, "XX", now + probeTtl, ARGV[i]) end
return result(now)

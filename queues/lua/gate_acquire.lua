-- acquire: may this job take one of the pool's slots? (see take in
-- gate_lib.lua)
-- ARGV: configured size (an operator's resize wins: effectiveSize), member, rank (1 = highest tier), n, process, lease TTL ms,
-- strict ("1"/"0"), then the n queue names, then the start rate's interval
-- ms and burst (0: none), then the steering ("reserved:maxWaitMs," per
-- rank, or "": see setSteering), then when the job was first ready to run
-- (ms, by the enqueuing process's clock; 0: unknown).
-- Returns {1, count, 0} when the slot was taken, {0, count, ms} when the
-- caller must wait (it is then a waiter, and a release may hand it a slot:
-- see gate_release.lua); ms > 0 is when the start rate allows its start.
local member, rank, n = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local size = effectiveSize(n, ARGV[1])
local process, ttl, strict = ARGV[5], tonumber(ARGV[6]), ARGV[7] == "1"
setRate(ARGV[8 + n], ARGV[9 + n])
setSteering(ARGV[10 + n], n)
local taken, count, wait = take(n, size, member, rank, process, ttl, strict, tonumber(ARGV[11 + n]) or 0, nowMs(), false)
return {taken and 1 or 0, count, wait}

-- report: add a process's calls to the window and trip the breaker when
-- the failures pass the ratio. ARGV[8..10]: calls, failures, slow calls;
-- then the members (job@queue) of the failed jobs to remember as suspects.
-- Counts are dropped unless the breaker is closed (and not forced closed).
-- Returns result(...) followed, when this call tripped the breaker, by the
-- suspects: the jobs whose failures in the window tripped it.
local MAX_SUSPECTS = 5000
local calls, failures, slow = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local now = nowMs()
advance(now)
if current() ~= "closed" or field("forced") == "closed" then return result(now) end
local b = math.floor(now / bucketMs())
if calls > 0 then redis.call("HINCRBY", windowKey, b .. ":c", calls) end
if failures > 0 then redis.call("HINCRBY", windowKey, b .. ":f", failures) end
if slow > 0 then redis.call("HINCRBY", windowKey, b .. ":s", slow) end
redis.call("PEXPIRE", windowKey, windowMs + bucketMs())
redis.call("ZREMRANGEBYSCORE", suspectsKey, "-inf", now - windowMs)
for i = 11, #ARGV do redis.call("ZADD", suspectsKey, now, ARGV[i]) end
if #ARGV >= 11 then
  -- Only the latest MAX_SUSPECTS are refunded after a trip.
  redis.call("ZREMRANGEBYRANK", suspectsKey, 0, -MAX_SUSPECTS - 1)
  redis.call("PEXPIRE", suspectsKey, windowMs)
end
if failures + slow == 0 then return result(now) end
local c, f, s = sums(now, true)
if c < minCalls or f + s < ratio * c then return result(now) end
local suspects = redis.call("ZRANGE", suspectsKey, 0, -1)
local why = string.format("%d of %d calls failed (%d errors, %d slow) in the window, ratio %.2f >= %.2f", f + s, c, f, s, (f + s) / c, ratio)
open(why, now, false, false)
redis.call("HSET", stateKey, "calls", c, "failures", f, "slow", s)
local out = result(now)
for _, m in ipairs(suspects) do out[#out + 1] = m end
return out

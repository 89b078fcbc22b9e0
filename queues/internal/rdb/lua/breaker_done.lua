-- done: a probe ended. ARGV[8]: its member, ARGV[9]: "ok" (it succeeded in
-- time), "fail" (it failed, or was slow: reopen) or "none" (its outcome
-- says nothing of the dependency: its place goes to another job).
-- Returns result(...).
local member, outcome = ARGV[8], ARGV[9]
local now = nowMs()
advance(now)
-- A probe that outlived its own half-open state (another probe failed
-- meanwhile) still held a place; its outcome counts in the half-open state
-- it ends in, if any.
if redis.call("ZREM", probesKey, member) == 0 or current() ~= "half-open" then
  advance(now)
  return result(now)
end
if outcome == "ok" then
  local ok = redis.call("HINCRBY", stateKey, "probes_ok", 1)
  if ok >= probes then
    close(string.format("%d of %d probes succeeded", ok, probes), now)
    redis.call("HSET", stateKey, "calls", probes, "failures", 0, "slow", 0)
    return result(now)
  end
elseif outcome == "fail" then
  local ok = tonumber(field("probes_ok") or "0")
  open(string.format("a probe failed (%d of %d had succeeded)", ok, probes), now, true, false)
  redis.call("HSET", stateKey, "calls", ok + 1, "failures", 1, "slow", 0)
  return result(now)
end
advance(now)
return result(now)

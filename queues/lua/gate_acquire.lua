local leases, waiting, waitexp, holders = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now, size, member = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local leaseExp, score, waitExp = ARGV[4], tonumber(ARGV[5]), ARGV[6]
local rank, n, process, nowS = tonumber(ARGV[7]), tonumber(ARGV[8]), ARGV[9], tonumber(ARGV[10])
local patient = ARGV[11 + n] == "1"
local function pause()
  for i = 1, n do redis.call("SET", KEYS[4 + i], "compartment-gate", "NX") end
end
local function unpause()
  for i = 1, n do
    if redis.call("GET", KEYS[4 + i]) == "compartment-gate" then redis.call("DEL", KEYS[4 + i]) end
  end
end
local count = redis.call("ZCARD", leases)
if count >= size then
  -- Full, or holding leases of a process that died: drop expired ones.
  redis.call("ZREMRANGEBYSCORE", leases, "-inf", now)
  count = redis.call("ZCARD", leases)
end
local ok = count < size
if ok and redis.call("ZCARD", waiting) > 0 then
  local stale = redis.call("ZRANGEBYSCORE", waitexp, "-inf", now)
  for _, w in ipairs(stale) do
    redis.call("ZREM", waiting, w)
    redis.call("ZREM", waitexp, w)
  end
  local best = redis.call("ZRANGE", waiting, 0, 0, "WITHSCORES")
  if best[1] and best[1] ~= member and tonumber(best[2]) < score then ok = false end
end
if ok then
  for i = 1, rank - 1 do
    if patient and redis.call("EXISTS", KEYS[4 + i]) == 0 and redis.call("LLEN", KEYS[4 + n + i]) > 0 then
      ok = false
      break
    end
    local q = ARGV[10 + i]
    for _, id in ipairs(redis.call("LRANGE", KEYS[4 + 2 * n + i], 0, -1)) do
      local m = id .. "@" .. q
      if not redis.call("ZSCORE", leases, m) and not redis.call("ZSCORE", waiting, m) then
        local exp = tonumber(redis.call("ZSCORE", KEYS[4 + 3 * n + i], id) or "0")
        if exp > nowS + 24 then
          ok = false
          break
        end
      end
    end
    if not ok then break end
  end
end
if ok then
  redis.call("ZADD", leases, leaseExp, member)
  redis.call("HSET", holders, member, process)
  if redis.call("ZREM", waiting, member) == 1 then redis.call("ZREM", waitexp, member) end
  count = count + 1
  if count >= size then pause() end
  return {1, count}
end
redis.call("ZADD", waiting, score, member)
redis.call("ZADD", waitexp, waitExp, member)
if count >= size then pause() else unpause() end
return {0, count}

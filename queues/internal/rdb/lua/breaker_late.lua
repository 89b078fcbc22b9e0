-- late: bring forward the retry of each job in the pool's late set (a trip
-- gave its failure back before asynq had written its retry) once asynq has
-- written it; drop entries older than ARGV[1] ms (the job was never put in
-- a retry set: it ran again, or its worker died). KEYS[1]: the late set
-- (members job@queue, scored by when they were added, in ms); KEYS[2..]:
-- the retry sets of the pool's queues. ARGV[2..]: the queue names, in the
-- order of KEYS[2..]. Returns how many retries it brought forward.
local members = redis.call("ZRANGE", KEYS[1], 0, -1, "WITHSCORES")
if #members == 0 then return 0 end
local t = redis.call("TIME")
local nowMs = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local maxAge = tonumber(ARGV[1])
local retry = {}
for i = 2, #ARGV do retry[ARGV[i]] = KEYS[i] end
local moved = 0
for i = 1, #members, 2 do
  local m, since = members[i], tonumber(members[i + 1])
  local at = string.find(m, "@[^@]*$")
  local key, id = nil, nil
  if at then
    id = string.sub(m, 1, at - 1)
    key = retry[string.sub(m, at + 1)]
  end
  if key and redis.call("ZSCORE", key, id) then
    redis.call("ZADD", key, "XX", tonumber(t[1]), id)
    redis.call("ZREM", KEYS[1], m)
    moved = moved + 1
  elseif key == nil or nowMs - since > maxAge then
    redis.call("ZREM", KEYS[1], m)
  end
end
return moved

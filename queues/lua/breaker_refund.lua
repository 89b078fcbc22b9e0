-- refund: take back one counted failure of each job whose failure count
-- key is in KEYS (its failure tripped the breaker: the outage's fault, not
-- the job's). A count never goes below zero.
for _, key in ipairs(KEYS) do
  local v = tonumber(redis.call("GET", key) or "0")
  if v > 1 then redis.call("DECR", key) elseif v == 1 then redis.call("DEL", key) end
end
return 0

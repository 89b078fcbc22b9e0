-- seal: no more jobs join the run; it can end.
-- ARGV: run ID, keep ms. Returns {"ok", steps due} or {"missing"}.
if redis.call("EXISTS", runKey) == 0 then return {"missing"} end
redis.call("HSET", runKey, "sealed", "1")
return {"ok", settle(tonumber(ARGV[2]))}

-- The shared part of the run scripts (lua/run_*.lua). A run is one piece
-- of business work made of many jobs (a month-end). Its record is a hash
-- (KEYS[1]) of labels and counts, and a hash of its jobs (KEYS[2]):
-- job ID -> "<state>\t<tier>\t<queue>\t<reason>". The counts are kept by
-- the same step that changes a job's state, never by scanning:
--   "n|<tier>|<state>"  the jobs of one tier in one state;
--   "t|<state>"         the jobs of every tier in one state.
-- States: queued (pending, scheduled, waiting for a retry), running,
-- succeeded, failed (for good), refused (at the door), cancelled.
-- KEYS[3] is the index of runs (sorted set by creation, ms), KEYS[4] the
-- set of runs whose completion step is due and not yet enqueued.
-- Every key of a run shares one hash tag on a Redis Cluster.
local runKey, jobsKey, indexKey, dueKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4]

local function nowMs()
  local t = redis.call("TIME")
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function parse(v)
  local state, tier, queue, reason = string.match(v, "^([^\t]*)\t([^\t]*)\t([^\t]*)\t(.*)$")
  return state, tier, queue, reason
end

local terminal = {succeeded = true, failed = true, refused = true, cancelled = true}

-- count adds d to the counts of state in tier.
local function count(tier, state, d)
  redis.call("HINCRBY", runKey, "n|" .. tier .. "|" .. state, d)
  redis.call("HINCRBY", runKey, "t|" .. state, d)
end

-- move puts job id in state (nil: out of the run) and keeps the counts.
local function move(id, from, fromTier, state, tier, queue, reason)
  if from then count(fromTier, from, -1) end
  if state then
    count(tier, state, 1)
    redis.call("HSET", jobsKey, id, state .. "\t" .. tier .. "\t" .. queue .. "\t" .. (reason or ""))
  else
    redis.call("HDEL", jobsKey, id)
  end
end

local function total(state)
  return tonumber(redis.call("HGET", runKey, "t|" .. state) or "0")
end

-- settle ends the run once it is sealed and no job of it is queued or
-- running: it notes when, and, unless it was cancelled or none of its
-- jobs ran, marks its completion step due (and the failure step with it
-- when a job failed for good). The record then lives keepMs more.
-- Returns the steps due ("" for none).
local function settle(keepMs)
  if redis.call("HGET", runKey, "sealed") ~= "1" or redis.call("HEXISTS", runKey, "ended") == 1 then
    return ""
  end
  if total("queued") + total("running") > 0 then return "" end
  redis.call("HSET", runKey, "ended", nowMs())
  if keepMs > 0 then
    redis.call("PEXPIRE", runKey, keepMs)
    redis.call("PEXPIRE", jobsKey, keepMs)
  end
  if redis.call("HEXISTS", runKey, "cancelled") == 1 then return "" end
  if total("succeeded") + total("failed") == 0 then return "" end
  local due = "complete"
  if total("failed") > 0 then due = "complete,failure" end
  redis.call("HSET", runKey, "due", due)
  redis.call("SADD", dueKey, ARGV[1])
  return due
end

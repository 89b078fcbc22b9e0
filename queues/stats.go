package queues

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// QueueStats is the state of one of a pool's queues (one per tier).
type QueueStats struct {
	Pool, Tier, Queue string
	Pending, Active   int64
	Scheduled, Retry  int64
	Archived          int64
	Completed         int64
	// OldestPending is how long the oldest pending job has been pending
	// (0 when none is), by this process's clock against the time asynq
	// stamped when the job became pending.
	OldestPending time.Duration
	// Paused: the queue is paused, by the cluster-wide gate (the pool is
	// full, or a higher tier has work) or by an operator (PausedByOperator,
	// see PausePool).
	Paused, PausedByOperator bool
	// BacklogLimit is the pool's backlog up to which the door admits jobs
	// of this tier (0: no limit).
	BacklogLimit int64
	// RefusedBacklog and RefusedRate count the jobs of this tier the door
	// refused, for a full backlog and for an enqueue rate, by every
	// producer (only for pools with a door).
	RefusedBacklog, RefusedRate int64
	// Reserved is the pool's slots reserved for this tier and the tiers
	// above it; MaxWait is the tier's maximum wait (0: none of either).
	Reserved int
	MaxWait  time.Duration
	// OverMaxWait: the oldest pending job has waited past MaxWait, so the
	// cluster-wide gate serves it before the higher tiers.
	OverMaxWait bool
}

// Stats is a snapshot of every pool's queues and cluster-wide slots.
type Stats struct {
	// Queues lists every pool's queues, in pool order, highest tier first.
	Queues []QueueStats
	// ClusterSlots gives, for each cluster-scoped pool, the slots held
	// across every worker process (leases not expired by Redis's clock).
	ClusterSlots map[string]int64
	// Sizes gives, for each cluster-scoped pool, its size in effect: the
	// one an operator set (Client.Resize), or its configured size.
	Sizes map[string]int64
	// WaitingForRoom gives, for each pool with a backlog limit, the enqueue
	// requests waiting for room now.
	WaitingForRoom map[string]int64
	// Breakers gives, for each pool with a circuit breaker, its state
	// (BreakerClosed, BreakerOpen or BreakerHalfOpen) and the openings in a
	// row without a close (see Client.Breaker for the rest).
	Breakers map[string]BreakerSummary
}

// BreakerSummary is a pool's circuit breaker in Stats.
type BreakerSummary struct {
	State string
	Trips int64
}

// StatsRoundTrips is what Stats costs: one pipelined round trip to Redis,
// whatever the number of pools, tiers and jobs (one short script per queue
// and per cluster-scoped pool, for pools with a door its refusal counts and
// waiting line, for pools with a breaker its state; no per-job scans).
const StatsRoundTrips = 1

// queueStatsScript reads one queue's counters, the pending-since stamp of
// its oldest pending job, and its pause flag. KEYS: pending, active,
// scheduled, retry, archived, completed, paused; ARGV[1]: the prefix of the
// queue's job keys.
var queueStatsScript = redis.NewScript(`
local oldest = redis.call("LINDEX", KEYS[1], -1)
local since = false
if oldest then since = redis.call("HGET", ARGV[1] .. oldest, "pending_since") end
return {redis.call("LLEN", KEYS[1]), redis.call("LLEN", KEYS[2]), redis.call("ZCARD", KEYS[3]),
  redis.call("ZCARD", KEYS[4]), redis.call("ZCARD", KEYS[5]), redis.call("ZCARD", KEYS[6]),
  since or "", redis.call("GET", KEYS[7]) or ""}
`)

// clusterSlotsScript counts a gate's leases that Redis's clock has not seen
// expire, and reads the size an operator set (0: none). KEYS: the leases,
// the size.
var clusterSlotsScript = redis.NewScript(`
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {redis.call("ZCOUNT", KEYS[1], now, "+inf"), tonumber(redis.call("GET", KEYS[2]) or "0") or 0}
`)

// Stats reads every pool's queues and cluster-wide slots in one pipelined
// round trip (StatsRoundTrips). It never scans jobs: a deep backlog costs
// what an empty queue does.
func (c *Client) Stats(ctx context.Context) (Stats, error) {
	// Scripts are sent by digest; load them once if Redis lost them.
	for attempt := 0; ; attempt++ {
		st, err := c.stats(ctx)
		if err == nil || attempt > 0 || !redis.HasErrorPrefix(err, "NOSCRIPT") {
			return st, err
		}
		if err := queueStatsScript.Load(ctx, c.rdb).Err(); err != nil {
			return Stats{}, err
		}
		if err := clusterSlotsScript.Load(ctx, c.rdb).Err(); err != nil {
			return Stats{}, err
		}
	}
}

func (c *Client) stats(ctx context.Context) (Stats, error) {
	type queueRef struct {
		pool *Pool
		i    int
		cmd  *redis.Cmd
	}
	var queues []queueRef
	slots := map[string]*redis.Cmd{}
	refused := map[string]*redis.MapStringStringCmd{}
	waiting := map[string]*redis.IntCmd{}
	breakers := map[string]*redis.SliceCmd{}
	pipe := c.rdb.Pipeline()
	for _, p := range c.pools().pools {
		if p.cfg.Breaker != nil {
			stateKey, _, _, _ := c.ks.breakerKeys(p.Name())
			breakers[p.Name()] = pipe.HMGet(ctx, stateKey, "state", "trips")
		}
		if p.cfg.HasDoor() {
			w, _, r := c.ks.doorKeys(p.Name())
			refused[p.Name()] = pipe.HGetAll(ctx, r)
			if p.cfg.MaxBacklog > 0 {
				waiting[p.Name()] = pipe.ZCard(ctx, w)
			}
		}
		for i, q := range p.queues {
			keys := []string{asynqPendingKey(q), asynqActiveKey(q), asynqQueueKey(q, "scheduled"), asynqQueueKey(q, "retry"),
				asynqQueueKey(q, "archived"), asynqQueueKey(q, "completed"), asynqPausedKey(q)}
			queues = append(queues, queueRef{p, i, queueStatsScript.EvalSha(ctx, pipe, keys, asynqQueueKey(q, "t:"))})
		}
		if p.Scope() == ScopeCluster {
			leases, _ := c.ks.gateKeys(p.Name())
			slots[p.Name()] = clusterSlotsScript.EvalSha(ctx, pipe, []string{leases, c.ks.poolSizeKey(p.Name())})
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return Stats{}, fmt.Errorf("queue stats: %w", err)
	}
	now := time.Now()
	st := Stats{ClusterSlots: map[string]int64{}, Sizes: map[string]int64{}, WaitingForRoom: map[string]int64{}, Breakers: map[string]BreakerSummary{}}
	for name, cmd := range breakers {
		vals := cmd.Val()
		b := BreakerSummary{State: BreakerClosed}
		if len(vals) == 2 {
			if v, _ := vals[0].(string); v != "" {
				b.State = v
			}
			if v, _ := vals[1].(string); v != "" {
				b.Trips, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		st.Breakers[name] = b
	}
	for name, cmd := range waiting {
		st.WaitingForRoom[name] = cmd.Val()
	}
	for _, ref := range queues {
		vals, err := ref.cmd.Slice()
		if err != nil || len(vals) != 8 {
			return Stats{}, fmt.Errorf("queue stats: %s: unexpected reply %v (%v)", ref.pool.queues[ref.i], vals, err)
		}
		n := func(k int) int64 { v, _ := vals[k].(int64); return v }
		qs := QueueStats{
			Pool: ref.pool.Name(), Tier: ref.pool.TierOf(ref.pool.queues[ref.i]), Queue: ref.pool.queues[ref.i],
			Pending: n(0), Active: n(1), Scheduled: n(2), Retry: n(3), Archived: n(4), Completed: n(5),
		}
		if since, _ := vals[6].(string); since != "" && qs.Pending > 0 {
			if ns, err := strconv.ParseInt(since, 10, 64); err == nil {
				qs.OldestPending = max(0, now.Sub(time.Unix(0, ns)))
			}
		}
		pause, _ := vals[7].(string)
		qs.Paused, qs.PausedByOperator = pause != "", pause != "" && pause != gatePauseValue && pause != breakerPauseValue
		qs.Reserved, qs.MaxWait = ref.pool.cfg.Reserved[qs.Tier], ref.pool.cfg.MaxWait[qs.Tier]
		qs.OverMaxWait = qs.MaxWait > 0 && qs.OldestPending > qs.MaxWait
		if ref.pool.cfg.MaxBacklog > 0 {
			qs.BacklogLimit = int64(ref.pool.cfg.tierLimit(qs.Tier))
		}
		if cmd, ok := refused[qs.Pool]; ok {
			counts := cmd.Val()
			qs.RefusedBacklog, _ = strconv.ParseInt(counts[refusedField(qs.Tier, "backlog")], 10, 64)
			qs.RefusedRate, _ = strconv.ParseInt(counts[refusedField(qs.Tier, "rate")], 10, 64)
		}
		st.Queues = append(st.Queues, qs)
	}
	for name, cmd := range slots {
		v, err := cmd.Int64Slice()
		if err != nil || len(v) != 2 {
			return Stats{}, fmt.Errorf("queue stats: pool %q slots: unexpected reply %v (%w)", name, v, err)
		}
		st.ClusterSlots[name] = v[0]
		st.Sizes[name] = v[1]
		if v[1] < 1 {
			p, _ := c.pools().get(name)
			st.Sizes[name] = int64(p.Size())
		}
	}
	return st, nil
}

// resumeScript lifts the operator's pauses of KEYS (paused keys), leaving
// the gate's (ARGV[1]) and the circuit breaker's (ARGV[2]).
var resumeScript = redis.NewScript(`
local n = 0
for _, key in ipairs(KEYS) do
  local v = redis.call("GET", key)
  if v and v ~= ARGV[1] and v ~= ARGV[2] then redis.call("DEL", key); n = n + 1 end
end
return n
`)

// PausePool pauses every queue of the pool, across every worker process:
// no job of the pool starts until ResumePool. Running jobs finish. It is
// the pause asynq's tools set (the queue's paused key, holding the Unix
// time), so they show it; the cluster-wide gate never lifts it. Pausing a
// paused pool changes nothing. An unknown pool is an error and changes
// nothing.
func (c *Client) PausePool(ctx context.Context, name string) error {
	p, err := c.pools().get(name)
	if err != nil {
		return err
	}
	now := strconv.FormatInt(time.Now().Unix(), 10)
	pipe := c.rdb.Pipeline()
	for _, q := range p.queues {
		// Replace a pause the gate or the breaker set: each lifts only its
		// own, so the operator's pause outlasts both.
		pipe.Eval(ctx, `local v = redis.call("GET", KEYS[1]) if not v or v == ARGV[1] or v == ARGV[2] then redis.call("SET", KEYS[1], ARGV[3]) end return 0`,
			[]string{asynqPausedKey(q)}, gatePauseValue, breakerPauseValue, now)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("pause pool %q: %w", name, err)
	}
	return nil
}

// ResumePool lifts an operator's pause of every queue of the pool (see
// PausePool). Pauses the cluster-wide gate or the circuit breaker set stay:
// each lifts its own (the gate when slots free up, the breaker when it
// closes). An unknown pool is an error and changes nothing.
func (c *Client) ResumePool(ctx context.Context, name string) error {
	p, err := c.pools().get(name)
	if err != nil {
		return err
	}
	keys := make([]string, len(p.queues))
	for i, q := range p.queues {
		keys[i] = asynqPausedKey(q)
	}
	// One key per call keeps every call on one hash slot (Redis Cluster).
	pipe := c.rdb.Pipeline()
	for _, k := range keys {
		resumeScript.Eval(ctx, pipe, []string{k}, gatePauseValue, breakerPauseValue)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("resume pool %q: %w", name, err)
	}
	return nil
}

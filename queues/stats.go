package queues

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// QueueStats is the state of one of a pool's queues (one per tier).
type QueueStats struct {
	Pool, Tier, Queue string
	Pending           int64
	// Active is asynq's count of the queue's jobs that a worker took from
	// it: Running + WaitingForSlot. It is not what runs: show Running.
	Active int64
	// Running counts the jobs whose handler runs: for a cluster-scoped
	// pool, those holding a slot of its gate (never more, across every
	// process, than the size in effect, but after a shrink); for a
	// process-scoped pool, asynq's active jobs (a job runs as soon as a
	// worker takes it).
	Running int64
	// WaitingForSlot counts the jobs a worker took from the queue that do
	// not run: waiting in their process for a cluster-wide slot (the
	// look-ahead, docs/CLUSTER.md), or in the instant between their
	// handler's end and asynq recording it. Always 0 for a process-scoped
	// pool.
	WaitingForSlot   int64
	Scheduled, Retry int64
	Archived         int64
	Completed        int64
	// Processed is asynq's running count of the queue's jobs processed,
	// succeeded or failed, by every worker process (it grows by one per
	// attempt): the difference between two reads over the time between
	// them is the jobs done per second.
	Processed int64
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

// Stats is a snapshot of every pool's queues and cluster-wide slots. Each
// pool's part is read in one step: its counts describe one instant.
type Stats struct {
	// Queues lists every pool's queues, in pool order, highest tier first.
	Queues []QueueStats
	// ClusterSlots gives, for each cluster-scoped pool, the slots held
	// across every worker process (leases not expired by Redis's clock).
	ClusterSlots map[string]int64
	// Sizes gives, for each cluster-scoped pool, its size in effect: the
	// one an operator set (Client.Resize), or its configured size.
	Sizes map[string]int64
	// Slots gives, for each cluster-scoped pool, who holds its slots and
	// what the live worker processes can run.
	Slots map[string]PoolSlots
	// WaitingForRoom gives, for each pool with a backlog limit, the enqueue
	// requests waiting for room now.
	WaitingForRoom map[string]int64
	// Breakers gives, for each pool with a circuit breaker, its state
	// (BreakerClosed, BreakerOpen or BreakerHalfOpen) and the openings in a
	// row without a close (see Client.Breaker for the rest).
	Breakers map[string]BreakerSummary
}

// PoolSlots is a cluster-scoped pool's slots in Stats, read in the same
// step as its queues.
type PoolSlots struct {
	// InUse is the slots held (ClusterSlots).
	InUse int64
	// Holders gives the slots each worker process holds, by its ID
	// (host:pid:random); they add up to InUse.
	Holders map[string]int64
	// Processes counts the worker processes that run the pool now (each
	// says so every few seconds; a killed one drops out within
	// GateLeaseTTL).
	Processes int64
	// Capacity is how many of the pool's jobs those processes can run at
	// once between them (each its concurrency: the pool's max_size in its
	// own config). A size in effect above it cannot be reached until more
	// workers start.
	Capacity int64
}

// BreakerSummary is a pool's circuit breaker in Stats.
type BreakerSummary struct {
	State BreakerStatus
	Trips int64
}

// StatsRoundTrips is what Stats costs: one pipelined round trip to Redis,
// whatever the number of pools, tiers and jobs (one script per pool, for
// pools with a door its refusal counts and waiting line, for pools with a
// breaker its state; no per-job scans).
const StatsRoundTrips = 1

//go:embed lua/pool_stats.lua
var poolStatsLua string

// poolStatsScript reads one pool's queues and slots in one step (see
// lua/pool_stats.lua).
var poolStatsScript = redis.NewScript(poolStatsLua)

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
		if err := poolStatsScript.Load(ctx, c.rdb).Err(); err != nil {
			return Stats{}, err
		}
	}
}

// poolStatsCall is the script call that reads one pool in Stats.
func (c *Client) poolStatsCall(ctx context.Context, pipe redis.Pipeliner, p *Pool) *redis.Cmd {
	n := len(p.queues)
	keys := make([]string, 0, 8*n+5)
	args := make([]any, 0, 2+2*n)
	cluster := "0"
	if p.Scope() == ScopeCluster {
		cluster = "1"
	}
	args = append(args, n, cluster)
	for _, q := range p.queues {
		keys = append(keys, rdb.PendingKey(q), rdb.ActiveKey(q), rdb.ScheduledKey(q), rdb.RetryKey(q),
			rdb.ArchivedKey(q), rdb.CompletedKey(q), rdb.PausedKey(q), rdb.ProcessedKey(q))
		args = append(args, rdb.QueueKey(q, "t:"))
	}
	for _, q := range p.queues {
		args = append(args, q)
	}
	if p.Scope() == ScopeCluster {
		leases, _ := c.ks.GateKeys(p.Name())
		capacity, seen := c.ks.GateProcsKeys(p.Name())
		keys = append(keys, leases, leases+":holders", c.ks.PoolSizeKey(p.Name()), capacity, seen)
	}
	return poolStatsScript.EvalSha(ctx, pipe, keys, args...)
}

func (c *Client) stats(ctx context.Context) (Stats, error) {
	type poolRef struct {
		pool *Pool
		cmd  *redis.Cmd
	}
	var pools []poolRef
	refused := map[string]*redis.MapStringStringCmd{}
	waiting := map[string]*redis.IntCmd{}
	breakers := map[string]*redis.SliceCmd{}
	pipe := c.rdb.Pipeline()
	for _, p := range c.pools().pools {
		if p.cfg.Breaker != nil {
			stateKey, _, _, _ := c.ks.BreakerKeys(p.Name())
			breakers[p.Name()] = pipe.HMGet(ctx, stateKey, "state", "trips")
		}
		if p.cfg.HasDoor() {
			w, _, r := c.ks.DoorKeys(p.Name())
			refused[p.Name()] = pipe.HGetAll(ctx, r)
			if p.cfg.MaxBacklog > 0 {
				waiting[p.Name()] = pipe.ZCard(ctx, w)
			}
		}
		pools = append(pools, poolRef{p, c.poolStatsCall(ctx, pipe, p)})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return Stats{}, fmt.Errorf("queue stats: %w", err)
	}
	now := time.Now()
	st := Stats{ClusterSlots: map[string]int64{}, Sizes: map[string]int64{}, Slots: map[string]PoolSlots{},
		WaitingForRoom: map[string]int64{}, Breakers: map[string]BreakerSummary{}}
	for name, cmd := range breakers {
		vals := cmd.Val()
		b := BreakerSummary{State: BreakerClosed}
		if len(vals) == 2 {
			if v, _ := vals[0].(string); v != "" {
				b.State = BreakerStatus(v)
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
	for _, ref := range pools {
		p := ref.pool
		queues, slots, err := parsePoolStats(ref.cmd, len(p.queues))
		if err != nil {
			return Stats{}, fmt.Errorf("queue stats: pool %q: %w", p.Name(), err)
		}
		for i, vals := range queues {
			n := func(k int) int64 { v, _ := vals[k].(int64); return v }
			qs := QueueStats{
				Pool: p.Name(), Tier: p.TierOf(p.queues[i]), Queue: p.queues[i],
				Pending: n(0), Active: n(1), Scheduled: n(2), Retry: n(3), Archived: n(4), Completed: n(5),
				Running: n(8), Processed: n(9),
			}
			qs.WaitingForSlot = max(0, qs.Active-qs.Running)
			if since, _ := vals[6].(string); since != "" && qs.Pending > 0 {
				if ns, err := strconv.ParseInt(since, 10, 64); err == nil {
					qs.OldestPending = max(0, now.Sub(time.Unix(0, ns)))
				}
			}
			pause, _ := vals[7].(string)
			qs.Paused, qs.PausedByOperator = pause != "", pause != "" && pause != gatePauseValue && pause != breakerPauseValue
			qs.Reserved, qs.MaxWait = p.cfg.Reserved[qs.Tier], p.cfg.MaxWait[qs.Tier]
			qs.OverMaxWait = qs.MaxWait > 0 && qs.OldestPending > qs.MaxWait
			if p.cfg.MaxBacklog > 0 {
				qs.BacklogLimit = int64(p.cfg.tierLimit(qs.Tier))
			}
			if cmd, ok := refused[qs.Pool]; ok {
				counts := cmd.Val()
				qs.RefusedBacklog, _ = strconv.ParseInt(counts[refusedField(qs.Tier, "backlog")], 10, 64)
				qs.RefusedRate, _ = strconv.ParseInt(counts[refusedField(qs.Tier, "rate")], 10, 64)
			}
			st.Queues = append(st.Queues, qs)
		}
		if p.Scope() != ScopeCluster {
			continue
		}
		st.ClusterSlots[p.Name()] = slots.InUse
		st.Slots[p.Name()] = slots.PoolSlots
		st.Sizes[p.Name()] = slots.size
		if slots.size < 1 {
			st.Sizes[p.Name()] = int64(p.Size())
		}
	}
	return st, nil
}

// poolSlotsReply is the slots part of a pool_stats reply.
type poolSlotsReply struct {
	PoolSlots
	size int64 // an operator's size, 0 for none
}

// parsePoolStats checks and splits a pool_stats reply (lua/pool_stats.lua)
// for a pool of n queues.
func parsePoolStats(cmd *redis.Cmd, n int) ([][]any, poolSlotsReply, error) {
	var out poolSlotsReply
	reply, err := cmd.Slice()
	if err != nil {
		return nil, out, err
	}
	if len(reply) != 2 {
		return nil, out, fmt.Errorf("unexpected reply %v", reply)
	}
	qs, _ := reply[0].([]any)
	slots, _ := reply[1].([]any)
	if len(qs) != n || len(slots) < 4 || len(slots)%2 != 0 {
		return nil, out, fmt.Errorf("unexpected reply %v", reply)
	}
	queues := make([][]any, n)
	for i, q := range qs {
		vals, _ := q.([]any)
		if len(vals) != 10 {
			return nil, out, fmt.Errorf("unexpected queue reply %v", q)
		}
		queues[i] = vals
	}
	num := func(v any) int64 { x, _ := v.(int64); return x }
	out.InUse, out.size, out.Processes, out.Capacity = num(slots[0]), num(slots[1]), num(slots[2]), num(slots[3])
	out.Holders = map[string]int64{}
	for i := 4; i+1 < len(slots); i += 2 {
		h, _ := slots[i].(string)
		out.Holders[h] += num(slots[i+1])
	}
	return queues, out, nil
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
			[]string{rdb.PausedKey(q)}, gatePauseValue, breakerPauseValue, now)
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
		keys[i] = rdb.PausedKey(q)
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

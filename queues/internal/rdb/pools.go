package rdb

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed lua/pool_stats.lua
	poolStatsLua string
	//go:embed lua/queue_pause.lua
	queuePauseLua string
	//go:embed lua/queue_resume.lua
	queueResumeLua string

	poolStatsScript   = redis.NewScript(poolStatsLua)
	queuePauseScript  = redis.NewScript(queuePauseLua)
	queueResumeScript = redis.NewScript(queueResumeLua)
)

// Pools is a client's reads and writes of its pools' state in Redis other
// than the gate's own calls: the status reads (Batch, Slots) and an
// operator's size. It holds no state of its own: build one where needed.
type Pools struct {
	rc redis.UniversalClient
	ks Keyspace
}

// NewPools returns the pools' state over rc, in the layout ks.
func NewPools(rc redis.UniversalClient, ks Keyspace) Pools { return Pools{rc: rc, ks: ks} }

// SetSize sets a cluster-scoped pool's size to size, for every process:
// the gate's scripts read it at every call and prefer it to their
// configured size. One round trip.
func (p Pools) SetSize(ctx context.Context, pool string, size int) error {
	if err := p.rc.Set(ctx, p.ks.PoolSizeKey(pool), size, 0).Err(); err != nil {
		return fmt.Errorf("write the size: %w", err)
	}
	return nil
}

// ResetSize takes an operator's size of pool away: each process's
// configured size holds again. One round trip.
func (p Pools) ResetSize(ctx context.Context, pool string) error {
	if err := p.rc.Del(ctx, p.ks.PoolSizeKey(pool)).Err(); err != nil {
		return fmt.Errorf("delete the size: %w", err)
	}
	return nil
}

// Size reads the size an operator set for pool: set is false when none is,
// or when what is there is not a whole number of at least 1 (the gate's
// scripts ignore it too). One round trip.
func (p Pools) Size(ctx context.Context, pool string) (size int, set bool, err error) {
	v, err := p.rc.Get(ctx, p.ks.PoolSizeKey(pool)).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return 0, false, nil
	case err != nil:
		return 0, false, fmt.Errorf("read the size: %w", err)
	}
	if n, err := strconv.Atoi(v); err == nil && n >= 1 {
		return n, true, nil
	}
	return 0, false, nil
}

// Slots reads a cluster-scoped pool's slots: the leases that have not
// expired by Redis's clock and who holds them, and what the live worker
// processes can run, in one step (the pool_stats script for no queue).
func (p Pools) Slots(ctx context.Context, pool string) (PoolSlots, error) {
	keys, args := p.poolStatsCall(PoolStatsArgs{Pool: pool, Cluster: true})
	res, err := poolStatsScript.Run(ctx, p.rc, keys, args...).Result()
	if err != nil {
		return PoolSlots{}, fmt.Errorf("pool slots: %w", err)
	}
	st, err := parsePoolStats(res, 0)
	if err != nil {
		return PoolSlots{}, fmt.Errorf("pool slots: %w", err)
	}
	return st.Slots, nil
}

// PoolStatsArgs names the pool a status read is of: its queues (highest
// tier first) and whether it is cluster-scoped (then its gate's slots are
// read too, and a queue's running jobs are those holding a slot).
type PoolStatsArgs struct {
	Pool    string
	Queues  []string
	Cluster bool
}

// PoolStats is one pool's status, read in one step: every count describes
// the same instant.
type PoolStats struct {
	// Queues are the pool's queues, in the order asked.
	Queues []QueueCounts
	// Slots are the gate's slots, for a cluster-scoped pool.
	Slots PoolSlots
}

// QueueCounts is one queue's part of a pool's status.
type QueueCounts struct {
	Pending, Active, Scheduled, Retry, Archived, Completed int64
	// Running counts the jobs holding a slot of the gate (a
	// cluster-scoped pool), or asynq's active jobs.
	Running int64
	// Processed is asynq's running count of the queue's jobs processed.
	Processed int64
	// PendingSince is when the job at the head of the pending list became
	// pending (asynq's stamp), zero when there is none or it has no
	// readable stamp.
	PendingSince time.Time
	// Paused: the queue is paused; PausedByOperator: by someone other than
	// the gate or a circuit breaker.
	Paused, PausedByOperator bool
}

// PoolSlots is a cluster-scoped pool's slots.
type PoolSlots struct {
	// InUse is the leases not expired; Holders how many each process
	// holds (they add up to InUse).
	InUse   int64
	Holders map[string]int64
	// OperatorSize is the size an operator set (0: none).
	OperatorSize int64
	// Processes are the worker processes whose word has not lapsed, and
	// Capacity how many of the pool's jobs they can run at once between
	// them.
	Processes, Capacity int64
}

// poolStatsCall returns the keys and arguments of the pool_stats script
// for a.
func (p Pools) poolStatsCall(a PoolStatsArgs) ([]string, []any) {
	n := len(a.Queues)
	keys := make([]string, 0, 8*n+5)
	args := make([]any, 0, 2+2*n)
	cluster := "0"
	if a.Cluster {
		cluster = "1"
	}
	args = append(args, n, cluster)
	for _, q := range a.Queues {
		keys = append(keys, PendingKey(q), ActiveKey(q), scheduledKey(q), retryKey(q),
			archivedKey(q), completedKey(q), PausedKey(q), processedKey(q))
		args = append(args, QueueKey(q, "t:"))
	}
	for _, q := range a.Queues {
		args = append(args, q)
	}
	if a.Cluster {
		g := p.ks.Gate(a.Pool)
		keys = append(keys, g.Leases, g.Holders, g.Size, g.Procs, g.ProcsSeen)
	}
	return keys, args
}

// parsePoolStats reads a pool_stats reply for n queues
// (lua/pool_stats.lua).
func parsePoolStats(res any, n int) (PoolStats, error) {
	var out PoolStats
	reply, ok := res.([]any)
	if !ok || len(reply) != 2 {
		return out, badReply("pool stats", res)
	}
	qs, _ := reply[0].([]any)
	slots, _ := reply[1].([]any)
	var head [4]int64
	if len(qs) != n || len(slots)%2 != 0 || !ints(slots, head[:]) {
		return out, badReply("pool stats", res)
	}
	out.Queues = make([]QueueCounts, n)
	for i, q := range qs {
		vals, _ := q.([]any)
		var v [6]int64
		var tail [2]int64
		if len(vals) != 10 || !ints(vals, v[:]) || !ints(vals[8:], tail[:]) {
			return out, badReply("pool stats", res)
		}
		since, ok1 := vals[6].(string)
		pause, ok2 := vals[7].(string)
		if !ok1 || !ok2 {
			return out, badReply("pool stats", res)
		}
		c := QueueCounts{
			Pending: v[0], Active: v[1], Scheduled: v[2], Retry: v[3], Archived: v[4], Completed: v[5],
			Running: tail[0], Processed: tail[1],
			Paused: pause != "", PausedByOperator: pause != "" && pause != GatePause && pause != BreakerPause,
		}
		if ns, err := strconv.ParseInt(since, 10, 64); err == nil {
			c.PendingSince = time.Unix(0, ns)
		}
		out.Queues[i] = c
	}
	out.Slots = PoolSlots{InUse: head[0], OperatorSize: head[1], Processes: head[2], Capacity: head[3], Holders: map[string]int64{}}
	for i := 4; i+1 < len(slots); i += 2 {
		h, ok := slots[i].(string)
		c, ok2 := slots[i+1].(int64)
		if !ok || !ok2 {
			return out, badReply("pool stats", res)
		}
		out.Slots.Holders[h] += c
	}
	return out, nil
}

// Batch is a set of status reads that go to Redis in one pipelined round
// trip (Exec), whatever the number of pools: each call queues a read and
// returns its result, to read once Exec returned. Not safe for concurrent
// use.
type Batch struct {
	p     Pools
	reads []func(ctx context.Context, pipe redis.Pipeliner)
}

// Batch returns an empty batch of status reads.
func (p Pools) Batch() *Batch { return &Batch{p: p} }

// PoolStatsRead is a pool's status in a Batch.
type PoolStatsRead struct {
	cmd    *redis.Cmd
	queues int
}

// PoolStats queues a read of a pool's queues and, for a cluster-scoped
// pool, its slots: one script call, so that its counts describe one
// instant.
func (b *Batch) PoolStats(a PoolStatsArgs) *PoolStatsRead {
	r := &PoolStatsRead{queues: len(a.Queues)}
	keys, args := b.p.poolStatsCall(a)
	b.reads = append(b.reads, func(ctx context.Context, pipe redis.Pipeliner) {
		r.cmd = poolStatsScript.EvalSha(ctx, pipe, keys, args...)
	})
	return r
}

// Result returns the pool's status, or the read's error.
func (r *PoolStatsRead) Result() (PoolStats, error) {
	res, err := r.cmd.Result()
	if err != nil {
		return PoolStats{}, err
	}
	return parsePoolStats(res, r.queues)
}

// BreakerSummary is a circuit breaker's state as status shows it.
type BreakerSummary struct {
	// State is "" when the breaker has recorded none yet (it is closed).
	State string
	// Trips counts its openings in a row without a close.
	Trips int64
}

// BreakerRead is a breaker's summary in a Batch.
type BreakerRead struct{ cmd *redis.SliceCmd }

// BreakerSummary queues a read of pool's circuit breaker's state.
func (b *Batch) BreakerSummary(pool string) *BreakerRead {
	r := &BreakerRead{}
	state, _, _, _ := b.p.ks.BreakerKeys(pool)
	b.reads = append(b.reads, func(ctx context.Context, pipe redis.Pipeliner) {
		r.cmd = pipe.HMGet(ctx, state, "state", "trips")
	})
	return r
}

// Result returns the breaker's summary, or the read's error. A trip count
// that is not a number reads as 0.
func (r *BreakerRead) Result() (BreakerSummary, error) {
	vals, err := r.cmd.Result()
	if err != nil {
		return BreakerSummary{}, err
	}
	var s BreakerSummary
	if len(vals) != 2 {
		return s, badReply("breaker summary", vals)
	}
	s.State, _ = vals[0].(string)
	if v, _ := vals[1].(string); v != "" {
		s.Trips, _ = strconv.ParseInt(v, 10, 64)
	}
	return s, nil
}

// Refusals are a pool's door refusal counts, per tier and reason.
type Refusals struct{ counts map[string]string }

// Count returns the requests of tier the door refused for reason
// ("backlog" or "rate"), by every producer. The door counts them in a
// hash under "<tier>|<reason>".
func (r Refusals) Count(tier, reason string) int64 {
	n, _ := strconv.ParseInt(r.counts[RefusedField(tier, reason)], 10, 64)
	return n
}

// RefusalsRead is a pool's refusal counts in a Batch.
type RefusalsRead struct{ cmd *redis.MapStringStringCmd }

// DoorRefusals queues a read of the counts of the requests pool's door
// refused.
func (b *Batch) DoorRefusals(pool string) *RefusalsRead {
	r := &RefusalsRead{}
	_, _, refused := b.p.ks.doorKeys(pool)
	b.reads = append(b.reads, func(ctx context.Context, pipe redis.Pipeliner) {
		r.cmd = pipe.HGetAll(ctx, refused)
	})
	return r
}

// Result returns the counts, or the read's error.
func (r *RefusalsRead) Result() (Refusals, error) {
	m, err := r.cmd.Result()
	return Refusals{counts: m}, err
}

// CountRead is a count in a Batch.
type CountRead struct{ cmd *redis.IntCmd }

// DoorWaiting queues a read of how many enqueue requests wait for room
// in pool's backlog now.
func (b *Batch) DoorWaiting(pool string) *CountRead {
	r := &CountRead{}
	waiting, _, _ := b.p.ks.doorKeys(pool)
	b.reads = append(b.reads, func(ctx context.Context, pipe redis.Pipeliner) {
		r.cmd = pipe.ZCard(ctx, waiting)
	})
	return r
}

// Result returns the count, or the read's error.
func (r *CountRead) Result() (int64, error) { return r.cmd.Result() }

// Exec sends the batch's reads in one pipelined round trip. Scripts go by
// their digest; when Redis does not have one (it restarted, or was
// flushed), Exec loads the scripts and sends the whole batch once more. It
// returns the first read's error, if any; each result then says its own.
func (b *Batch) Exec(ctx context.Context) error {
	for attempt := 0; ; attempt++ {
		pipe := b.p.rc.Pipeline()
		for _, read := range b.reads {
			read(ctx, pipe)
		}
		_, err := pipe.Exec(ctx)
		if err == nil || attempt > 0 || !redis.HasErrorPrefix(err, "NOSCRIPT") {
			return err
		}
		for _, s := range []*redis.Script{poolStatsScript, leasesUnrenewedScript} {
			if err := s.Load(ctx, b.p.rc).Err(); err != nil {
				return fmt.Errorf("load the status scripts: %w", err)
			}
		}
	}
}

// PauseQueues pauses queues as an operator does, across every worker
// process, with the pause asynq's tools set (the paused key holds at, in
// Unix seconds): a pause the gate or a circuit breaker set is replaced, an
// operator's is left as it is. One pipelined round trip, one call per
// queue (on a Redis Cluster every call is on one hash slot).
func PauseQueues(ctx context.Context, rc redis.UniversalClient, queues []string, at time.Time) error {
	now := strconv.FormatInt(at.Unix(), 10)
	pipe := rc.Pipeline()
	for _, q := range queues {
		queuePauseScript.Eval(ctx, pipe, []string{PausedKey(q)}, GatePause, BreakerPause, now)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("set the pauses: %w", err)
	}
	return nil
}

// ResumeQueues lifts an operator's pauses of queues; the gate's and a
// circuit breaker's stay (each lifts its own). One pipelined round trip,
// one call per queue.
func ResumeQueues(ctx context.Context, rc redis.UniversalClient, queues []string) error {
	pipe := rc.Pipeline()
	for _, q := range queues {
		queueResumeScript.Eval(ctx, pipe, []string{PausedKey(q)}, GatePause, BreakerPause)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("lift the pauses: %w", err)
	}
	return nil
}

package queues_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/testwait"
	"github.com/lci-labs/compartment/queues"
)

// Stats reads the queues as asynq's inspector does, in one round trip:
// depths per tier, the oldest pending job's age, the pause flags.
func TestStatsReadsTheQueues(t *testing.T) {
	h := newHarness(t,
		queues.PoolConfig{Name: "order", Size: 2, JobTypes: []string{"order"}},
		queues.PoolConfig{Name: "batch", Size: 1, JobTypes: []string{"report"}, Tiers: []string{"regulatory", "close", "adhoc"}, Scope: queues.ScopeProcess},
	)
	ctx := context.Background()
	for i := range 3 {
		h.enqueue("report", job{Seq: i, Tier: "close"})
	}
	h.enqueue("order", job{Seq: 9})
	_, err := h.client.Enqueue(ctx, "report", nil, queues.EnqueueOptions{Tier: "adhoc", ProcessIn: time.Hour})
	require.NoError(t, err)

	st, err := h.client.Stats(ctx)
	require.NoError(t, err)
	require.Len(t, st.Queues, 4)
	byTier := map[string]queues.QueueStats{}
	for _, q := range st.Queues {
		byTier[q.Pool+"/"+q.Tier] = q
	}
	require.Equal(t, int64(3), byTier["batch/close"].Pending)
	require.Equal(t, int64(0), byTier["batch/regulatory"].Pending)
	require.Equal(t, int64(1), byTier["batch/adhoc"].Scheduled)
	require.Equal(t, int64(1), byTier["order/"].Pending)
	require.Zero(t, byTier["batch/regulatory"].OldestPending)

	// The oldest pending job's age is the one asynq's inspector reports.
	info, err := h.insp.GetQueueInfo(byTier["batch/close"].Queue)
	require.NoError(t, err)
	require.InDelta(t, info.Latency.Seconds(), byTier["batch/close"].OldestPending.Seconds(), 0.5)
	require.Greater(t, byTier["batch/close"].OldestPending, time.Duration(0))

	// Only the cluster-scoped pool has cluster slots.
	require.Contains(t, st.ClusterSlots, "order")
	require.NotContains(t, st.ClusterSlots, "batch")

	// One pipelined round trip, whatever the pools and tiers: seen by a
	// hook on the Redis client, not taken from the engine's word.
	rc := redis.NewClient(h.redis.Options)
	t.Cleanup(func() { _ = rc.Close() })
	trips := &roundTrips{}
	rc.AddHook(trips)
	counted, err := queues.NewClient(rc, h.cfg)
	require.NoError(t, err)
	_, err = counted.Stats(ctx) // may load the script the first time (NOSCRIPT)
	require.NoError(t, err)
	trips.n.Store(0)
	_, err = counted.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), trips.n.Load(), "Stats is one round trip to Redis")
}

// roundTrips counts the calls a Redis client makes: one per command sent
// on its own, one per pipeline.
type roundTrips struct{ n atomic.Int64 }

func (r *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (r *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { r.n.Add(1); return next(ctx, cmd) }
}
func (r *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { r.n.Add(1); return next(ctx, cmds) }
}

// An operator's pause holds every tier of the pool, replaces a pause the
// gate set (which the gate would lift on its own), and Resume lifts only
// the operator's pauses.
func TestPauseAndResumePool(t *testing.T) {
	h := newHarness(t,
		queues.PoolConfig{Name: "order", Size: 2, JobTypes: []string{"order"}},
		queues.PoolConfig{Name: "batch", Size: 1, JobTypes: []string{"report"}, Tiers: []string{"regulatory", "close", "adhoc"}},
	)
	ctx := context.Background()
	rdb := h.redis.Client
	batch, err := h.client.Pool("batch")
	require.NoError(t, err)
	qs := batch.Queues()
	paused := func(q string) string {
		v, _ := rdb.Get(ctx, "asynq:{"+q+"}:paused").Result()
		return v
	}
	// The gate had paused the lowest tier.
	require.NoError(t, rdb.Set(ctx, "asynq:{"+qs[2]+"}:paused", "compartment-gate", 0).Err())

	require.ErrorContains(t, h.client.PausePool(ctx, "nope"), `unknown pool "nope"`)
	require.NoError(t, h.client.PausePool(ctx, "batch"))
	for _, q := range qs {
		require.NotEmpty(t, paused(q), q)
		require.NotEqual(t, "compartment-gate", paused(q), "%s: an operator's pause, which the gate leaves alone", q)
	}
	order, _ := h.client.Pool("order")
	require.Empty(t, paused(order.Queues()[0]), "another pool is untouched")
	st, err := h.client.Stats(ctx)
	require.NoError(t, err)
	for _, q := range st.Queues {
		require.Equal(t, q.Pool == "batch", q.PausedByOperator, q.Queue)
	}
	// asynq's inspector sees the pause too.
	info, err := h.insp.GetQueueInfo(qs[0])
	if err == nil {
		require.True(t, info.Paused)
	}

	require.NoError(t, rdb.Set(ctx, "asynq:{"+qs[1]+"}:paused", "compartment-gate", 0).Err()) // as if the gate set it after a resume
	require.NoError(t, h.client.ResumePool(ctx, "batch"))
	require.Empty(t, paused(qs[0]))
	require.Equal(t, "compartment-gate", paused(qs[1]), "the gate's own pause stays for the gate to lift")
	require.Empty(t, paused(qs[2]))
	require.ErrorContains(t, h.client.ResumePool(ctx, "nope"), `unknown pool "nope"`)

	// The circuit breaker's pause is its own too: an operator's resume
	// leaves it, Stats does not call it the operator's, and an operator's
	// pause replaces it (the breaker lifts only its own, so the operator's
	// outlasts the breaker's close).
	require.NoError(t, rdb.Set(ctx, "asynq:{"+qs[0]+"}:paused", "compartment-breaker", 0).Err())
	st, err = h.client.Stats(ctx)
	require.NoError(t, err)
	require.True(t, st.Queues[len(st.Queues)-3].Paused)
	require.False(t, st.Queues[len(st.Queues)-3].PausedByOperator, st.Queues[len(st.Queues)-3].Queue)
	require.NoError(t, h.client.ResumePool(ctx, "batch"))
	require.Equal(t, "compartment-breaker", paused(qs[0]))
	require.NoError(t, h.client.PausePool(ctx, "batch"))
	require.NotEqual(t, "compartment-breaker", paused(qs[0]))
	require.NotEmpty(t, paused(qs[0]))
}

// Stats says, per cluster-scoped pool, how many worker processes run it
// and how many of its jobs they can run between them (each its own
// MaxSize): a process that starts counts at once, one that stops drops out
// at once.
func TestStatsSayWhatTheWorkersCanRun(t *testing.T) {
	c := newClusterPool(t, queues.PoolConfig{Size: 2, MaxSize: 3})
	ctx := context.Background()
	slots := func() queues.PoolSlots {
		st, err := c.client.Stats(ctx)
		require.NoError(t, err)
		return st.Slots["batch"]
	}
	require.Equal(t, queues.PoolSlots{Holders: map[string]int64{}}, slots(), "no worker runs the pool yet")
	c.start(2)
	testwait.For(t, 10*time.Second, "both processes to say what they can run", func() bool {
		s := slots()
		return s.Processes == 2 && s.Capacity == 6
	})
	require.NoError(t, c.runners[1].Stop(ctx))
	s := slots()
	require.Equal(t, int64(1), s.Processes, "a stopped process no longer runs the pool")
	require.Equal(t, int64(3), s.Capacity)
}

// The holders of a cluster-scoped pool's slots are read with the slots in
// one step: they add up to the slots held, and none is unknown.
func TestClusterSlotsHoldersAddUp(t *testing.T) {
	c := newCluster(t, 2, nil)
	c.cfg.ShutdownTimeout = 200 * time.Millisecond // the jobs below never end on their own
	for i := range 6 {
		c.enqueue(clusterJob{Seq: i, Work: time.Hour})
	}
	c.start(2)
	var st queues.Stats
	// The processes hold jobs ahead of a slot (the look-ahead) once the
	// pool is full.
	testwait.For(t, 20*time.Second, "two jobs running and more waiting for a slot", func() bool {
		var err error
		st, err = c.client.Stats(context.Background())
		require.NoError(t, err)
		var running, forSlot int64
		for _, q := range st.Queues {
			running += q.Running
			forSlot += q.WaitingForSlot
			require.Equal(t, q.Active, q.Running+q.WaitingForSlot)
		}
		require.LessOrEqual(t, running, int64(2), "more jobs shown running than the size")
		// A job shown running holds its slot; it enters its handler a
		// moment later, so the handlers are waited on too.
		c.obs.mu.Lock()
		inside := c.obs.inside
		c.obs.mu.Unlock()
		return running == 2 && forSlot > 0 && inside == 2
	})
	c.obs.mu.Lock()
	require.Equal(t, 2, c.obs.peak, "never more than two inside the handlers")
	c.obs.mu.Unlock()
	slots := st.Slots["batch"]
	require.Equal(t, int64(2), slots.InUse)
	var sum int64
	for h, n := range slots.Holders {
		require.Regexp(t, `^.+:\d+:[0-9a-f]{6}$`, h, "a holder is a process (host:pid:id)")
		sum += n
	}
	require.Equal(t, slots.InUse, sum)
}

package queues_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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
	require.Equal(t, queues.StatsRoundTrips, 1)
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

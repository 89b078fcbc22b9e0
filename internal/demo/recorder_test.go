package demo

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/handlers"
)

// TestRecorderTimesOutOrdersPastTheirRequest checks the recorder's order
// path without Redis: an order the handler gets after its request gave up
// fails for good with ErrOrderTimedOut and counts as timed out; one in time
// runs and counts its latency; other jobs only count in their rows.
func TestRecorderTimesOutOrdersPastTheirRequest(t *testing.T) {
	t.Parallel()
	rec := newRecorder(time.Second, nil)
	ran := 0
	next := asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		ran++
		return ctx.Err() // as a handler whose database call sees the deadline
	})
	run := func(id, jobType string) error {
		return rec.observe(context.Background(), job{id: id, queue: "q", lastTry: true}, []string{"all", jobType}, asynq.NewTask(jobType, nil), next)
	}

	rec.pending["late"] = time.Now().Add(-2 * time.Second) // enqueued before the month-end
	rec.startFlood()
	rec.pending["fine"] = time.Now()

	err := run("late", handlers.TypeOrder)
	require.ErrorIs(t, err, ErrOrderTimedOut)
	require.ErrorIs(t, err, asynq.SkipRetry, "a request that gave up is not retried")
	require.NoError(t, run("fine", handlers.TypeOrder))
	require.NoError(t, run("untracked", handlers.TypeSearch))
	require.Equal(t, 3, ran)

	before, during := rec.orderResults()
	require.Equal(t, 1, before.N)
	require.Equal(t, 1, before.TimedOut)
	require.GreaterOrEqual(t, before.Max, 2*time.Second)
	require.Equal(t, 1, during.N)
	require.Zero(t, during.TimedOut+during.Errors)

	peak, jobs := rec.peaks()
	require.Equal(t, map[string]int{"all": 1, handlers.TypeOrder: 1, handlers.TypeSearch: 1}, peak)
	require.Equal(t, map[string]int{"all": 3, handlers.TypeOrder: 2, handlers.TypeSearch: 1}, jobs)
	s := rec.snapshot()
	require.Equal(t, rowSnapshot{active: 0, peak: 1, perSecond: 3}, s.rows["all"])
	require.Equal(t, 0, rec.snapshot().rows["all"].peak, "a snapshot starts a new interval")
}

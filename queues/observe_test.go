package queues_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/testwait"
	"github.com/lci-labs/compartment/queues"
)

// recorder is an Observer that keeps what it is told.
type recorder struct {
	mu     sync.Mutex
	starts []queues.JobStart
	ends   []queues.JobEnd
}

func (r *recorder) JobStarted(s queues.JobStart) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.starts = append(r.starts, s)
}

func (r *recorder) JobFinished(e queues.JobEnd) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ends = append(r.ends, e)
}

func (r *recorder) snapshot() ([]queues.JobStart, []queues.JobEnd) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]queues.JobStart(nil), r.starts...), append([]queues.JobEnd(nil), r.ends...)
}

// The observer hears every job's start and end with its pool, tier and
// outcome; the wait is known for a first attempt of a job the Client
// enqueued, and at least as long as the job really waited; a job the
// worker stops under is requeued, not failed.
func TestObserverSeesEveryJob(t *testing.T) {
	h := newHarness(t, queues.PoolConfig{Name: "batch", Size: 1, JobTypes: []string{"report"}, Tiers: []string{"regulatory", "close", "adhoc"},
		PollInterval: 10 * time.Millisecond, MaxRetry: queues.NoRetry})
	rec := &recorder{}
	started := make(chan string, 10)
	mux := queues.NewHandlers()
	mux.HandleFunc("report", func(ctx context.Context, task *asynq.Task) error {
		started <- string(task.Payload())
		switch string(task.Payload()) {
		case "fail":
			return errors.New("broken")
		case "block":
			<-ctx.Done() // until the worker stops under it
			return ctx.Err()
		}
		return nil
	})
	cfg := h.cfg
	cfg.Handlers, cfg.Observer, cfg.ShutdownTimeout = mux, rec, time.Second
	c, err := queues.NewClient(h.redis.Client, cfg)
	require.NoError(t, err)
	ctx := context.Background()
	enqueuedAt := time.Now()
	for _, p := range []struct{ payload, tier string }{{"ok", "regulatory"}, {"fail", "close"}, {"block", "adhoc"}} {
		_, err := c.Enqueue(ctx, "report", []byte(p.payload), queues.EnqueueOptions{Tier: p.tier})
		require.NoError(t, err)
	}
	require.NoError(t, c.Start(ctx))
	for range 3 {
		select {
		case <-started:
		case <-time.After(30 * time.Second):
			t.Fatal("the jobs did not start")
		}
	}
	require.NoError(t, c.Stop(ctx))
	testwait.For(t, 5*time.Second, "three ends", func() bool { _, e := rec.snapshot(); return len(e) == 3 })

	starts, ends := rec.snapshot()
	require.Len(t, starts, 3)
	for i, s := range starts {
		require.Equal(t, "batch", s.Pool)
		require.Equal(t, []string{"regulatory", "close", "adhoc"}[i], s.Tier, "strict tiers, highest first")
		require.True(t, s.WaitKnown)
		require.LessOrEqual(t, s.Wait, time.Since(enqueuedAt))
		require.Zero(t, s.Retried)
	}
	outcome := map[string]queues.JobOutcome{}
	for _, e := range ends {
		require.True(t, e.Started)
		require.Greater(t, e.Run, time.Duration(0))
		outcome[e.Tier] = e.Outcome
	}
	require.Equal(t, map[string]queues.JobOutcome{
		"regulatory": queues.OutcomeSucceeded,
		"close":      queues.OutcomeArchived, // max_retry 0: its first failure archives it
		"adhoc":      queues.OutcomeRequeued, // the worker stopped under it
	}, outcome)
	// asynq agrees: the stopped job is back in its queue.
	adhoc, _ := h.client.Pool("batch")
	info, err := h.insp.GetQueueInfo(adhoc.Queues()[2])
	require.NoError(t, err)
	require.Equal(t, 1, info.Pending)
}

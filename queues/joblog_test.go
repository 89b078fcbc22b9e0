package queues_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/testwait"
	"github.com/lci-labs/compartment/queues"
)

// One log line per job, at info for a slow pool (job_timeout over a
// minute) and at debug for a fast one, unless configured otherwise: pool,
// tier, job, duration and outcome.
func TestOneLogLinePerJob(t *testing.T) {
	t.Parallel()
	h := newHarness(t,
		queues.PoolConfig{Name: "order", Size: 1, JobTypes: []string{"order:create"}, PollInterval: 20 * time.Millisecond, JobTimeout: 30 * time.Second},
		queues.PoolConfig{Name: "batch", Size: 1, JobTypes: []string{"report:run"}, Tiers: []string{"regulatory", "adhoc"}, PollInterval: 20 * time.Millisecond, JobTimeout: 10 * time.Minute},
		queues.PoolConfig{Name: "quiet", Size: 1, JobTypes: []string{"audit:write"}, PollInterval: 20 * time.Millisecond, JobTimeout: 10 * time.Minute, JobLog: queues.JobLogOff},
	)
	var buf apptest.SyncBuffer
	h.cfg.Logger = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	mux := queues.NewHandlers()
	done := make(chan string, 3)
	for _, jt := range []string{"order:create", "report:run", "audit:write"} {
		mux.HandleFunc(jt, func(ctx context.Context, t *asynq.Task) error { done <- t.Type(); return nil })
	}
	h.run(mux)
	ctx := context.Background()
	for _, jt := range []string{"order:create", "audit:write"} {
		_, err := h.client.Enqueue(ctx, jt, nil, queues.EnqueueOptions{})
		require.NoError(t, err)
	}
	_, err := h.client.Enqueue(ctx, "report:run", nil, queues.EnqueueOptions{Tier: "regulatory"})
	require.NoError(t, err)
	for range 3 {
		<-done
	}
	testwait.For(t, 10*time.Second, "the report's log line", func() bool { return strings.Contains(buf.String(), "msg=job") })

	var jobLines []string
	for _, l := range strings.Split(buf.String(), "\n") {
		if strings.Contains(l, "msg=job ") {
			jobLines = append(jobLines, l)
		}
	}
	require.Len(t, jobLines, 1, "only the slow pool logs at info: %v", jobLines)
	line := jobLines[0]
	for _, want := range []string{"level=INFO", "pool=batch", "job_type=report:run", "tier=regulatory", "duration=", "outcome=done", "job_id="} {
		require.Contains(t, line, want)
	}
	require.NotContains(t, buf.String(), "pool=order job_type", "a fast pool logs its jobs at debug")
	require.NotContains(t, buf.String(), "audit:write", "job_log: off")
}

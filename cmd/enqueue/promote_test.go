package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/internal/testwait"
)

// pendingByTier counts the batch pool's pending reports per tier.
func pendingByTier(t *testing.T, cfg string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, q := range status(t, cfg).Pools[2].Queues {
		out[q.Tier] = q.Pending
	}
	return out
}

// TestPromoteCommand: a waiting report moves to another tier (exit 0);
// running or done, it is left alone with a line that says so (exit 0);
// bad input or a report that is not queued exits 2 and moves nothing.
func TestPromoteCommand(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	cfg := apptest.Config(t, r, "")
	code, _, stderr := enqueue(t, "-config", cfg, "report", "-name", "top-customers", "-period", "2026-10")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, 1, pendingByTier(t, cfg)["management"])

	code, stdout, stderr := enqueue(t, "-config", cfg, "promote", "-name", "top-customers", "-period", "2026-10", "-tier", "regulatory")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `^report top-customers for 2026-10: moved from tier management to regulatory, at the end of its queue \(queue \S+:batch:regulatory, id report:top-customers:2026-10\)\n$`, stdout)
	require.Equal(t, map[string]int{"regulatory": 1, "close": 0, "management": 0, "adhoc": 0}, pendingByTier(t, cfg))

	code, stdout, stderr = enqueue(t, "-config", cfg, "promote", "-name", "top-customers", "-period", "2026-10", "-tier", "regulatory", "-json")
	require.Equal(t, 0, code, stderr)
	var res struct {
		Report, Period, ID, From, To, State string
		Moved                               bool
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &res))
	require.Equal(t, "top-customers", res.Report)
	require.Equal(t, "report:top-customers:2026-10", res.ID)
	require.Equal(t, "regulatory", res.From)
	require.Equal(t, "pending", res.State)
	require.False(t, res.Moved, "already in the tier")

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"missing tier", []string{"-name", "top-customers", "-period", "2026-10"}, "enqueue promote: -name, -period and -tier are required"},
		{"unknown report", []string{"-name", "payroll", "-period", "2026-10", "-tier", "close"}, `enqueue promote: unknown report "payroll"`},
		{"bad period", []string{"-name", "top-customers", "-period", "2026-13", "-tier", "close"}, `period "2026-13" must be a month written YYYY-MM`},
		{"unknown tier", []string{"-name", "top-customers", "-period", "2026-10", "-tier", "urgent"}, `enqueue promote: priority: unknown tier "urgent"`},
		{"not queued", []string{"-name", "trial-balance", "-period", "2026-10", "-tier", "regulatory"}, "enqueue promote: report \"trial-balance\" for 2026-10 is not queued (never enqueued, or finished and no longer kept); nothing moved"},
		{"other period", []string{"-name", "top-customers", "-period", "2026-09", "-tier", "close"}, `report "top-customers" for 2026-09 is not queued`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := enqueue(t, append([]string{"-config", cfg, "promote"}, tc.args...)...)
			require.Equal(t, 2, code, stderr)
			require.Empty(t, stdout)
			require.Contains(t, stderr, tc.want)
		})
	}
	require.Equal(t, map[string]int{"regulatory": 1, "close": 0, "management": 0, "adhoc": 0}, pendingByTier(t, cfg), "nothing moved")

	// Bad input is refused before Redis is reached: exit 2, not 1.
	unreachable := apptest.Config(t, r, "")
	apptest.ReplaceInConfig(t, unreachable, r.URL, "redis://127.0.0.1:1/4")
	code, _, stderr = enqueue(t, "-config", unreachable, "promote", "-name", "top-customers", "-period", "2026-10", "-tier", "urgent")
	require.Equal(t, 2, code, stderr)
	require.Contains(t, stderr, `unknown tier "urgent"`)
	code, _, stderr = enqueue(t, "-config", unreachable, "promote", "-name", "top-customers", "-period", "2026-10", "-tier", "close")
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stderr, "redis at 127.0.0.1:1 is unreachable")

	// Running: a worker (asynq's own server here) holds the report.
	regulatory := status(t, cfg).Pools[2].Queues[0].Queue
	started, release := make(chan struct{}), make(chan struct{})
	srv := asynq.NewServerFromRedisClient(r.Client, asynq.Config{Concurrency: 1, Queues: map[string]int{regulatory: 1}, ShutdownTimeout: 5 * time.Second})
	require.NoError(t, srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		close(started)
		<-release
		return nil
	})))
	t.Cleanup(srv.Shutdown)
	<-started
	code, stdout, stderr = enqueue(t, "-config", cfg, "promote", "-name", "top-customers", "-period", "2026-10", "-tier", "adhoc")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "report top-customers for 2026-10 is already running; nothing moved\n", stdout)

	// Done (kept for report_retention).
	close(release)
	insp := asynq.NewInspectorFromRedisClient(r.Client)
	testwait.For(t, 10*time.Second, "the report to complete", func() bool {
		info, err := insp.GetTaskInfo(regulatory, "report:top-customers:2026-10")
		return err == nil && info.State == asynq.TaskStateCompleted
	})
	code, stdout, stderr = enqueue(t, "-config", cfg, "promote", "-name", "top-customers", "-period", "2026-10", "-tier", "adhoc")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "report top-customers for 2026-10 is already done; nothing moved\n", stdout)
}

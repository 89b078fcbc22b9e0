package app_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/handlers"
	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/reports"
	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/internal/testwait"
	"github.com/lci-labs/compartment/queues"
)

// TestMonthEndBreakerStorageOutage runs a month-end plan in-process on the
// embedded stack (or the CI's Redis and PostgreSQL) and takes away the
// reports' output directory mid-run: every report fails. The batch pool's
// breaker opens, probes fail while it is gone, nothing is archived
// although max_retry is 1, and once the directory is back every report
// completes and writes its file.
func TestMonthEndBreakerStorageOutage(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	path := testConfig(t, r, "")
	apptest.ReplaceInConfig(t, path, "    max_retry: 2\n",
		"    max_retry: 1\n    breaker: {min_calls: 3, window: 1m, cool_down: 1s, max_cool_down: 2s}\n")
	apptest.ReplaceInConfig(t, path, "shutdown_timeout: 5s\n", "shutdown_timeout: 5s\nreport_min_duration: 100ms\n")
	cfg, err := app.Load(path, nil)
	require.NoError(t, err)

	var mu sync.Mutex
	done := map[string]bool{}
	w, err := app.NewWorker(context.Background(), cfg, app.WorkerOptions{
		Logger: slog.New(slog.DiscardHandler),
		OnReportDone: func(p handlers.ReportPayload, _ reports.Result) {
			mu.Lock()
			done[p.Report] = true
			mu.Unlock()
		},
	})
	require.NoError(t, err)
	t.Cleanup(w.Close)
	enq, err := app.NewEnqueuerFor(cfg, w.Redis)
	require.NoError(t, err)
	t.Cleanup(enq.Close)
	ctx := context.Background()

	names := []string{"vat-return", "withholding-tax", "trial-balance", "ar-aging", "ap-aging", "revenue-by-region",
		"revenue-by-category", "top-customers", "refunds-analysis", "customer-cohorts"}
	planFile := filepath.Join(t.TempDir(), "plan.yaml")
	require.NoError(t, os.WriteFile(planFile, []byte("reports:\n  - name: "+strings.Join(names, "\n  - name: ")+"\n"), 0o600))
	plan, err := reports.LoadPlan(planFile, "2026-10", cfg.Catalog, cfg.Policy)
	require.NoError(t, err)
	res, err := enq.EnqueuePlan(ctx, plan)
	require.NoError(t, err)
	require.NoError(t, w.Start(ctx))

	// The first report done, the output directory goes: a file takes its
	// place, so every report fails to write.
	testwait.For(t, 30*time.Second, "a first report", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(done) > 0
	})
	out, away := cfg.OutputDir, cfg.OutputDir+".away"
	require.NoError(t, os.Rename(out, away))
	// A report ending in between makes the directory again (the writer
	// creates it when it is missing): its files join the others, and the
	// swap is tried again.
	testwait.For(t, 30*time.Second, "a file in the output directory's place", func() bool {
		if os.WriteFile(out, nil, 0o600) == nil {
			return true
		}
		entries, err := os.ReadDir(out)
		require.NoError(t, err)
		for _, e := range entries {
			_ = os.Rename(filepath.Join(out, e.Name()), filepath.Join(away, e.Name()))
		}
		_ = os.Remove(out) // not yet empty if another report wrote meanwhile: tried again
		return false
	})

	breaker := func() queues.BreakerState {
		st, err := enq.Client.Breaker(ctx, "batch")
		require.NoError(t, err)
		return st
	}
	testwait.For(t, 30*time.Second, "the breaker to open", func() bool { return breaker().State == queues.BreakerOpen })
	first := breaker().Trips
	testwait.For(t, 30*time.Second, "two failed probes", func() bool { return breaker().Trips >= first+2 })
	counts := func() (tc app.TierCount) {
		states, err := enq.Progress(ctx, res.Jobs)
		require.NoError(t, err)
		for _, c := range app.CountByTier(states, cfg.Policy.Tiers()) {
			tc.Total += c.Total
			tc.Done += c.Done
			tc.Failed += c.Failed
			tc.Running += c.Running
		}
		return tc
	}
	require.Zero(t, counts().Failed, "nothing archived while the directory is gone")

	require.NoError(t, os.Remove(out))
	require.NoError(t, os.Rename(away, out))
	var last app.TierCount
	defer func() {
		if t.Failed() {
			st, _ := enq.Client.Breaker(ctx, "batch")
			t.Logf("reports: %+v; breaker: %+v", last, st)
		}
	}()
	testwait.For(t, time.Minute, "every report to complete", func() bool {
		last = counts()
		return last.Done == len(names)
	})
	require.Zero(t, counts().Failed)
	require.Equal(t, queues.BreakerClosed, breaker().State)
	for _, name := range names {
		info, err := os.Stat(filepath.Join(out, name+"_2026-10.csv"))
		require.NoError(t, err, name)
		require.NotZero(t, info.Size(), name)
	}
}

package app_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/reports"
)

// A month-end plan's progress follows a report an operator promoted: it
// is found in its new tier, not reported missing.
func TestProgressFollowsAPromotedReport(t *testing.T) {
	t.Parallel()
	cfg, enq := newEnqueuer(t)
	ctx := context.Background()
	plan, err := reports.ParsePlan([]byte("reports:\n  - name: vat-return\n  - name: top-customers\n"), "2026-10", cfg.Catalog, cfg.Policy)
	require.NoError(t, err)
	res, err := enq.EnqueuePlan(ctx, plan)
	require.NoError(t, err)

	moved, err := enq.PromoteReport(ctx, "top-customers", "2026-10", "close")
	require.NoError(t, err)
	require.True(t, moved.Moved)
	require.Equal(t, "management", moved.From)

	states, err := enq.Progress(ctx, res.Jobs)
	require.NoError(t, err)
	got := map[string]app.JobState{}
	for _, s := range states {
		got[s.Job.Report] = s
	}
	require.Equal(t, "pending", got["top-customers"].State)
	require.Equal(t, "close", got["top-customers"].Job.Tier)
	require.Equal(t, moved.Queue, got["top-customers"].Job.Queue)
	require.Equal(t, "pending", got["vat-return"].State)
	counts := app.CountByTier(states, cfg.Policy.Tiers())
	require.Equal(t, 1, counts[1].Waiting, "counted in its new tier")
	require.Zero(t, counts[2].Total)
}

// Progress stops reading once its context ends: asynq's reads take none,
// so an interrupt would otherwise wait for every job's read in turn (each
// up to the client's timeouts while Redis does not answer).
func TestProgressStopsWithItsContext(t *testing.T) {
	t.Parallel()
	_, enq := newEnqueuer(t)
	jobs := make([]app.ReportJob, 50)
	for i := range jobs {
		jobs[i] = app.ReportJob{Report: "vat-return", Period: "2026-10", Tier: "regulatory", ID: fmt.Sprintf("job-%d", i), Queue: "nowhere"}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := enq.Progress(ctx, jobs)
	require.ErrorIs(t, err, context.Canceled)
}

package demo_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/demo"
	"github.com/lci-labs/compartment/internal/testredis"
)

func TestDemoShowsTheBulkheadsHold(t *testing.T) {
	r := testredis.New(t)
	cfg, err := app.Load(apptest.Config(t, r, "report_min_duration: 200ms\n"), nil)
	require.NoError(t, err)
	var out bytes.Buffer
	s, err := demo.Run(context.Background(), demo.Options{
		Config: cfg, Plan: apptest.RepoPath("configs/month-end.yaml"), Periods: []string{"2026-09", "2026-10"},
		OrdersPerSecond: 50, SearchesPerSecond: 20, Warmup: 300 * time.Millisecond, Out: &out, Refresh: 50 * time.Millisecond,
	})
	require.NoError(t, err, out.String())
	require.True(t, s.OK(), out.String())
	require.Equal(t, 20, s.ReportsDone)
	require.Zero(t, s.Failed)
	require.Zero(t, s.Inversions)
	require.Len(t, s.Starts, 20)
	require.Equal(t, "regulatory", s.Starts[0].Tier)
	require.Equal(t, "adhoc", s.Starts[19].Tier)
	for _, p := range s.Pools {
		require.LessOrEqual(t, p.MaxConcurrent, p.Size, p.Name)
		require.LessOrEqual(t, p.MaxConns, p.Size, p.Name)
		require.Positive(t, p.Jobs, p.Name)
	}
	require.Equal(t, 2, s.Pools[2].MaxConcurrent, "the batch pool filled up")
	require.Positive(t, s.OrderDuring.N)

	var printed bytes.Buffer
	s.Print(&printed)
	require.Contains(t, printed.String(), "reports: 20 completed, 0 failed")
	require.Contains(t, printed.String(), "tier inversions: 0")
	require.Contains(t, printed.String(), "batch        2                2                2       20  held")
}

func TestSummaryOK(t *testing.T) {
	require.False(t, demo.Summary{Inversions: 1}.OK(), "a tier overtaken is not OK")
	require.False(t, demo.Summary{Pools: []demo.PoolResult{{Name: "batch", Size: 2, MaxConcurrent: 3}}}.OK(), "a pool over its size is not OK")
	require.False(t, demo.Summary{Pools: []demo.PoolResult{{Name: "batch", Size: 2, MaxConns: 3}}}.OK(), "more connections than the size is not OK")
	require.False(t, demo.Summary{Failed: 1}.OK())
	require.True(t, demo.Summary{Pools: []demo.PoolResult{{Name: "batch", Size: 2, MaxConcurrent: 2, MaxConns: 2}}}.OK())
}

package demo_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/demo"
	"github.com/lci-labs/compartment/internal/testredis"
)

// adaptiveConfig is the test config with what the third act needs, as in
// configs/demo.yaml: the database a dependency every pool uses, the batch
// pool of 4 adaptive down to 1, every report holding its connection at
// least reportMinDuration. Its pools claim 3 + 2 + 4 = 9 of 10.
func adaptiveConfig(t *testing.T, reportMinDuration string) *app.Config {
	t.Helper()
	path := apptest.Config(t, testredis.New(t), "report_min_duration: "+reportMinDuration+"\ndependencies:\n  - name: reports-db\n    capacity: 10\n")
	apptest.ReplaceInConfig(t, path, "seed_orders: 3000", "seed_orders: 300")
	apptest.ReplaceInConfig(t, path, "  max_connections: 10\n", "  max_connections: 10\n  dependency: reports-db\n")
	apptest.ReplaceInConfig(t, path, "  - name: order\n    size: 3\n", "  - name: order\n    size: 3\n    uses: {reports-db: 1}\n")
	apptest.ReplaceInConfig(t, path, "  - name: search\n    size: 2\n", "  - name: search\n    size: 2\n    uses: {reports-db: 1}\n")
	apptest.ReplaceInConfig(t, path, "  - name: batch\n    size: 2\n",
		"  - name: batch\n    size: 4\n    max_size: 4\n    uses: {reports-db: 1}\n    adaptive: {min: 1, window: 200ms}\n")
	cfg, err := app.Load(path, nil)
	require.NoError(t, err)
	return cfg
}

// TestSlowdownAct runs AFTER and the third act with short durations: each
// report holds its connection 1s (5s at the load the database was sized
// for once it is 5x slower) and the database stays slow for 3s at least.
// Two months: their 4 regulatory reports fill the batch pool's 4 slots, so
// in AFTER no lower tier starts beside them (the inversion count reads the
// order in which handlers start, which jobs admitted at the same moment
// may swap).
// What a user relies on, counted inside the handlers: the batch pool's
// limit fell below 4 while the database was slow, for the reason that its
// jobs took longer, and climbed back to 4 after the recovery because they
// no longer did; no job started beyond the limit in effect; every order
// enqueued completed within 10 s; every report too.
func TestSlowdownAct(t *testing.T) {
	out := &apptest.SyncBuffer{}
	s, err := demo.Run(context.Background(), demo.Options{
		Config: adaptiveConfig(t, "1s"), Plan: apptest.RepoPath("configs/month-end.yaml"), Periods: []string{"2026-09", "2026-10"}, SkipOutage: true,
		OrdersPerSecond: 10, SearchesPerSecond: 5, Warmup: 500 * time.Millisecond, SlowFor: 3 * time.Second,
		// Not the demo's 2 s: on a busy machine CPU starvation alone can
		// make an order that late, and this act tests the adaptive limit.
		OrderTimeout: 10 * time.Second, Out: out, Refresh: 50 * time.Millisecond,
	})
	require.NoError(t, err, out.String())
	var printed bytes.Buffer
	s.Print(&printed)
	t.Log("\n" + printed.String())
	require.True(t, s.WallsHeld(), printed.String())

	a := s.Slowdown
	require.NotNil(t, a, "the act ran")
	require.Equal(t, "batch", a.Pool)
	require.Equal(t, 4, a.Max)
	require.Equal(t, 1, a.Min)
	require.Equal(t, 4, a.StartLimit)
	require.False(t, a.FellBeforeSlowdown, "the limit held at 4 while the reports ran at full speed: %+v", a.Changes)
	require.GreaterOrEqual(t, a.SlowFor, 3*time.Second)

	// The limit fell below 4 while the database was slow, because the
	// reports took longer than their baseline.
	var fell, climbedBack bool
	for _, ch := range a.Changes {
		if ch.At >= 0 && ch.At <= a.SlowFor && ch.To < ch.From && ch.To < 4 {
			require.Contains(t, ch.Reason, "against a baseline of", "a fall says why")
			fell = true
		}
		if ch.At > a.SlowFor && ch.To == 4 && ch.To > ch.From {
			require.Contains(t, ch.Reason, "the pool was full", "a climb says why")
			climbedBack = true
		}
	}
	require.True(t, fell, "the limit fell below 4 during the slowdown: %+v", a.Changes)
	require.True(t, a.Fell())
	require.Less(t, a.Lowest, 4)
	require.GreaterOrEqual(t, a.Lowest, 1, "never below min")
	require.LessOrEqual(t, a.FellAfter, a.SlowFor)
	// And it was back at 4 after the recovery.
	require.True(t, climbedBack, "the limit climbed back to 4 after the recovery: %+v", a.Changes)
	require.True(t, a.Back())
	require.Equal(t, 4, a.EndLimit)

	// Counted inside the handlers: no batch job started beyond the limit
	// in effect then, none beyond max_size.
	require.Positive(t, a.Starts)
	require.Zero(t, a.OverLimit, "batch jobs started beyond the limit")
	require.LessOrEqual(t, a.MostAtOnce, 4)
	// No order lost: every order enqueued in the act completed.
	require.Positive(t, a.OrdersEnqueued)
	require.Equal(t, a.OrdersEnqueued, a.OrdersCompleted, "every order enqueued completed")
	require.Positive(t, a.OrderBefore.N)
	require.Positive(t, a.OrderDuring.N)
	require.Positive(t, a.OrderAfter.N)
	require.Zero(t, a.OrdersTimedOut())
	// Every report of the act completed.
	require.Positive(t, a.ReportsTotal)
	require.Equal(t, a.ReportsTotal, a.ReportsDone)
	require.Zero(t, a.ReportsFailed)
	require.True(t, a.Held(), printed.String())
	require.True(t, s.OK())

	o := out.String()
	require.Contains(t, o, "=== SLOWDOWN: the report database 5x slower, then healthy again ===")
	require.Contains(t, o, "[SLOWDOWN] the report database 5x slower for")
	require.Contains(t, o, "  report database: 5x slower, 0.8 reports at full speed instead of 4")
	require.Contains(t, o, "  batch limit: ")
	require.Contains(t, o, "[SLOWDOWN] the batch pool's limit (from its log in Redis; times from the slowdown):")
	require.Regexp(t, `\n\s+\+\d[\d.]*m?s  4 -> [123]  jobs took \S+ against a baseline of \S+\n`, o, "the timeline has the fall")
	require.Contains(t, o, "the report database: healthy again")
	p := printed.String()
	require.Contains(t, p, "SLOWDOWN: the report database slows      before the slowdown")
	require.Contains(t, p, "  fell below 4                           ")
	require.Contains(t, p, "  back at 4                              ")
	require.Contains(t, p, "SLOWDOWN: the adaptive limit followed the database")
}

// TestSlowdownNeedsAnAdaptivePool: a config whose report pool is not
// adaptive cannot play the act; Run says so before anything runs, and
// names the way out.
func TestSlowdownNeedsAnAdaptivePool(t *testing.T) {
	var out bytes.Buffer
	_, err := demo.Run(context.Background(), demo.Options{
		Config: config(t, "200ms"), Plan: apptest.RepoPath("configs/month-end.yaml"), Periods: []string{"2026-10"}, Out: &out,
	})
	require.ErrorContains(t, err, `the third act (the database slows) needs the report pool "batch" to be adaptive`)
	require.ErrorContains(t, err, "-skip-slowdown")
	require.False(t, strings.Contains(out.String(), "=== "), "nothing ran")
}

package database_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// runReports runs n reports of least each at once and returns how long the
// slowest took.
func runReports(t *testing.T, hold func(ctx context.Context, start time.Time) error, begin func() func(), n int) time.Duration {
	t.Helper()
	var wg sync.WaitGroup
	began := time.Now()
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			end := begin()
			defer end()
			errs[i] = hold(context.Background(), time.Now())
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	return time.Since(began)
}

// The report server model: within its capacity reports take their time;
// beyond it they share the server; a slowdown of 5 at the load it was
// sized for makes each take 5 times longer. Timers only fire late, so the
// lower bounds are exact; the upper bounds are loose for busy machines.
func TestReportServerModel(t *testing.T) {
	db := open(t, nil)
	const least = 100 * time.Millisecond
	hold := func(ctx context.Context, start time.Time) error { return db.HoldReport(ctx, start, least) }

	took := runReports(t, hold, db.BeginReport, 2)
	require.GreaterOrEqual(t, took, least, "off: each holds its least")
	require.Equal(t, 1.0, db.Slowdown())

	db.SetSlowdown(2, 1)
	took = runReports(t, hold, db.BeginReport, 2)
	require.GreaterOrEqual(t, took, least)
	require.Less(t, took, 3*least, "2 reports on a server for 2 run at full speed")

	db.SetSlowdown(2, 5)
	require.Equal(t, 5.0, db.Slowdown())
	took = runReports(t, hold, db.BeginReport, 2)
	require.GreaterOrEqual(t, took, 5*least*9/10, "2 reports on a server for 0.4: 5 times longer")
	require.Less(t, took, 20*least)

	// A report alone on the slowed server takes 1 ÷ 0.4 = 2.5 times.
	took = runReports(t, hold, db.BeginReport, 1)
	require.GreaterOrEqual(t, took, 25*least/10*9/10)
	require.Less(t, took, 4*5*least)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	end := db.BeginReport()
	defer end()
	require.ErrorIs(t, db.HoldReport(ctx, time.Now(), least), context.Canceled)
}

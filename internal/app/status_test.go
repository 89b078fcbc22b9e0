package app_test

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/handlers"
	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/reports"
	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/internal/testwait"
	"github.com/lci-labs/compartment/queues"
)

// TestStatusNeverShowsMoreThanTheSize runs a month-end of 40 reports on a
// cluster-scoped batch pool of 4 served by three worker processes, each
// holding jobs ahead of a slot (the look-ahead: 2 each), and reads the
// status over and over while it runs: what `enqueue status`, `status
// -json`, /api/status and the dashboard show. At every sample the pool and
// each tier show at most 4 jobs running, the slots' holders add up to the
// running count (none unknown), and the jobs held ahead of a slot are
// counted apart. Inside the handlers, never more than 4 run at once.
func TestStatusNeverShowsMoreThanTheSize(t *testing.T) {
	// Not parallel: three workers and 200 status reads keep an embedded
	// Redis busy enough without the package's other tests beside them.
	r := testredis.New(t)
	// Each report holds its slot this long, so that the month-end lasts
	// for the 200 status reads it needs and more: about 6 s on a real
	// Redis (a read takes 10-15 ms here under this load), 10 s on the
	// embedded one (40 ms and more).
	hold := "600ms"
	if r.Mini != nil {
		hold = "1s"
	}
	path := apptest.Config(t, r, "report_min_duration: "+hold+"\n")
	apptest.ReplaceInConfig(t, path, "  - name: batch\n    size: 2\n", "  - name: batch\n    size: 4\n")
	// Only the batch pool works here: the other pools poll slowly, so that
	// the status reads, not their polling, keep the (embedded) Redis busy.
	apptest.ReplaceInConfig(t, path, "job_types: [order:create]\n    poll_interval: 20ms", "job_types: [order:create]\n    poll_interval: 1s")
	apptest.ReplaceInConfig(t, path, "job_types: [search:index]\n    poll_interval: 20ms", "job_types: [search:index]\n    poll_interval: 1s")
	cfg, err := app.Load(path, nil)
	require.NoError(t, err)
	batch, err := queues.NewClient(r.Client, cfg.Engine)
	require.NoError(t, err)
	p, err := batch.Pool("batch")
	require.NoError(t, err)
	require.Equal(t, queues.ScopeCluster, p.Scope())

	// Observed inside the handlers of every worker.
	var mu sync.Mutex
	inside, peak, done := 0, 0, 0
	observe := func(_ *queues.Pool, next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
			if task.Type() != "report:run" {
				return next.ProcessTask(ctx, task)
			}
			mu.Lock()
			inside++
			peak = max(peak, inside)
			mu.Unlock()
			defer func() {
				mu.Lock()
				inside--
				done++
				mu.Unlock()
			}()
			return next.ProcessTask(ctx, task)
		})
	}
	ctx := context.Background()
	var enq *app.Enqueuer
	for i := range 3 {
		w, err := app.NewWorker(ctx, cfg, app.WorkerOptions{Logger: slog.New(slog.DiscardHandler), Middleware: []queues.Middleware{observe}})
		require.NoError(t, err)
		t.Cleanup(w.Close)
		if i == 0 {
			enq, err = app.NewEnqueuerFor(cfg, w.Redis)
			require.NoError(t, err)
			t.Cleanup(enq.Close)
		}
		require.NoError(t, w.Start(ctx))
		t.Cleanup(func() { require.NoError(t, w.Stop(context.Background())) })
	}

	// A month-end of 40 reports (the shipped plan for four months). On a
	// machine so loaded that it would end before 200 reads, one more
	// month's plan is added while the backlog runs low, up to three years.
	var periods []string
	for m := range 36 {
		periods = append(periods, time.Date(2024, time.Month(1+m), 1, 0, 0, 0, 0, time.UTC).Format("2006-01"))
	}
	total, next := 0, 0
	addMonth := func() {
		plan, err := reports.LoadPlan(apptest.RepoPath("configs/month-end.yaml"), periods[next], cfg.Catalog, cfg.Policy)
		require.NoError(t, err)
		_, err = enq.EnqueuePlan(ctx, plan)
		require.NoError(t, err)
		total += len(plan.Entries)
		next++
	}
	for range 4 {
		addMonth()
	}

	samples, full, forSlot := 0, 0, 0
	began := time.Now()
	testwait.For(t, 3*time.Minute, "the month-end to finish", func() bool {
		mu.Lock()
		finished := done == total
		mu.Unlock()
		if finished {
			return true
		}
		st, err := enq.Status(ctx)
		require.NoError(t, err)
		var ps app.PoolStatus
		for _, p := range st.Pools {
			if p.Name == "batch" {
				ps = p
			}
		}
		require.Equal(t, 4, ps.EffectiveSize)
		require.LessOrEqual(t, ps.Active, ps.EffectiveSize, "status shows more jobs running than the pool's size: %+v", ps)
		tiers, tiersForSlot, held := 0, 0, 0
		for _, q := range ps.Queues {
			require.LessOrEqual(t, q.Active, ps.EffectiveSize, "tier %s shows more running than the pool's size", q.Tier)
			tiers += q.Active
			tiersForSlot += q.WaitingForSlot
		}
		for h, n := range ps.Holders {
			require.NotEqual(t, "?", h, "a slot's holder is unknown")
			held += n
		}
		require.Equal(t, ps.Active, tiers, "the tiers' running jobs add up to the pool's")
		require.Equal(t, ps.Active, held, "the holders' slots add up to the running jobs")
		require.Equal(t, ps.WaitingForSlot, tiersForSlot)
		require.Equal(t, max(0, ps.EffectiveSize-ps.Active), ps.Available)
		// Three workers serve the pool, but each runs up to its max_size,
		// at least the 4 slots: one of them could run the whole pool, so
		// the autoscaling signal says one while there is work.
		pending := 0
		for _, q := range ps.Queues {
			pending += q.Pending
		}
		if ps.Active+ps.WaitingForSlot+pending > 0 {
			require.Equal(t, 1, ps.UsefulWorkers, "%+v", ps)
		}
		require.GreaterOrEqual(t, st.UsefulWorkers, ps.UsefulWorkers)

		stats, err := enq.Client.Stats(ctx) // what /metrics reads
		require.NoError(t, err)
		var running int64
		for _, q := range stats.Queues {
			if q.Pool == "batch" {
				running += q.Running
				// Every job taken is running or waiting for a slot. A slot
				// whose release is on its way to Redis (up to 5 ms when it is
				// held back, gateHoldRelease) still counts as running after
				// asynq recorded its job's end.
				require.GreaterOrEqual(t, q.Running+q.WaitingForSlot, q.Active, "a job taken from the queue is neither running nor waiting for a slot")
				require.Equal(t, max(0, q.Active-q.Running), q.WaitingForSlot)
			}
		}
		require.LessOrEqual(t, running, int64(4), "the metrics' source shows more running than the size")

		samples++
		if samples < 200 && ps.Backlog < 8 && next < len(periods) {
			addMonth()
		}
		if ps.Active == ps.EffectiveSize {
			full++
		}
		if ps.WaitingForSlot > 0 {
			forSlot++
		}
		return false
	})
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d reports, %d status samples in %s: %d showed the pool full, %d showed jobs waiting for a slot; at most %d ran at once inside the handlers",
		total, samples, time.Since(began).Round(time.Millisecond), full, forSlot, peak)
	require.LessOrEqual(t, peak, 4, "more than 4 reports ran at once inside the handlers")
	require.GreaterOrEqual(t, samples, 200, "too few samples during the month-end")
	require.Positive(t, full, "no sample showed the pool full: the month-end did not load it")
	require.Positive(t, forSlot, "no sample showed a job waiting for a slot: the look-ahead was not exercised, so the test proves nothing")
}

// Status shows each dependency's capacity against what the pools claim of
// it and what their running jobs hold, and the adaptive pool's limit: two
// reports hold the adaptive batch pool's two slots (its limit, before any
// job ended), so the pool holds 2 of reports-db; an operator's size of 3
// lets the third start, and is in the limit's log.
func TestStatusShowsDependenciesAndAdaptiveLimit(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	path := apptest.Config(t, r, "")
	apptest.ReplaceInConfig(t, path, "database:\n", "dependencies: [{name: reports-db, capacity: 20}]\ndatabase:\n")
	apptest.ReplaceInConfig(t, path, "[order:create]\n", "[order:create]\n    uses: {reports-db: 1}\n")
	apptest.ReplaceInConfig(t, path, "[search:index]\n", "[search:index]\n    uses: {reports-db: 1}\n")
	apptest.ReplaceInConfig(t, path, "    max_retry: 2\n", "    max_retry: 2\n    max_size: 4\n    uses: {reports-db: 1}\n    adaptive: {min: 1}\n")
	cfg, err := app.Load(path, nil)
	require.NoError(t, err)

	var held atomic.Int64
	release := make(chan struct{})
	ctx := context.Background()
	w, err := app.NewWorker(ctx, cfg, app.WorkerOptions{Logger: slog.New(slog.DiscardHandler),
		OnReportDone: func(handlers.ReportPayload, reports.Result) {
			held.Add(1)
			<-release
		}})
	require.NoError(t, err)
	t.Cleanup(w.Close)
	enq, err := app.NewEnqueuerFor(cfg, w.Redis)
	require.NoError(t, err)
	t.Cleanup(enq.Close)
	require.NoError(t, w.Start(ctx))
	t.Cleanup(func() { require.NoError(t, w.Stop(context.Background())) })
	t.Cleanup(func() { close(release) }) // first: the held reports end

	for _, name := range []string{"vat-return", "trial-balance", "ar-aging"} {
		_, _, err := enq.EnqueueReport(ctx, name, "2026-10", "regulatory")
		require.NoError(t, err)
	}
	testwait.For(t, 30*time.Second, "two reports to hold the batch pool's slots", func() bool { return held.Load() == 2 })
	uses := func(order, search, batch int) app.DependencyStatus {
		return app.DependencyStatus{Name: "reports-db", Capacity: 20, Claimed: 9, InUse: order + search + batch, Pools: []app.DependencyUse{
			{Pool: "order", Units: 1, Claimed: 3, InUse: order},
			{Pool: "search", Units: 1, Claimed: 2, InUse: search},
			{Pool: "batch", Units: 1, Claimed: 4, InUse: batch}, // adaptive: it claims its max_size
		}}
	}
	st, err := enq.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, []app.DependencyStatus{uses(0, 0, 2)}, st.Dependencies)
	batch := st.Pools[2]
	require.Equal(t, 2, batch.Active)
	require.Equal(t, 2, batch.EffectiveSize)
	require.NotNil(t, batch.Adaptive)
	require.Equal(t, queues.AdaptiveStatus{Min: 1, Max: 4, Limit: 2}, *batch.Adaptive, "no job ended: the limit has not moved")

	require.NoError(t, enq.Client.Resize(ctx, "batch", 3))
	testwait.For(t, 30*time.Second, "the third report to start", func() bool { return held.Load() == 3 })
	st, err = enq.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, []app.DependencyStatus{uses(0, 0, 3)}, st.Dependencies)
	batch = st.Pools[2]
	require.True(t, batch.Resized)
	require.Equal(t, 3, batch.EffectiveSize)
	require.Equal(t, 2, batch.Adaptive.Limit, "the operator's size holds the limit off")
	require.Len(t, batch.Adaptive.Log, 1)
	require.Equal(t, 3, batch.Adaptive.Log[0].To)
	require.Contains(t, batch.Adaptive.Log[0].Reason, "an operator resized the pool")
}

package demo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/lci-labs/compartment/handlers"
	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/database"
	"github.com/lci-labs/compartment/internal/reports"
	"github.com/lci-labs/compartment/queues"
)

// sharedRow is the live view's and the summary's row for the whole shared
// pool of the outage phase.
const sharedRow = "all jobs"

// runOutage runs the story's before on rdb: one asynq server for every
// queue, its concurrency the database's connection count, and every job
// taking connections freely from the one shared connection pool (each kind
// of job may hold all of them). The application's own handlers run the
// jobs; its queues live under the namespace's "outage" prefix and are
// deleted at the end.
func runOutage(ctx context.Context, o Options, rdb redis.UniversalClient, plans []*reports.Plan, st *stage) (Phase, error) {
	cfg := o.Config
	size := cfg.Database.MaxConnections
	res := Phase{
		Name:     "BEFORE",
		Setup:    fmt.Sprintf("one shared pool of %d", size),
		Describe: fmt.Sprintf("one asynq server for every queue, concurrency %d; every job takes connections freely from the same %d", size, size),
	}
	// Each kind of job keeps the name of the pool it gets once the walls
	// are up; here every kind may hold every connection.
	poolOf := map[string]string{}
	shares := map[string]int{}
	queueOf := map[string]string{}
	asynqQueues := map[string]int{}
	ns := cfg.Engine.Namespace + ":outage"
	poll := cfg.Engine.Pools[0].PollInterval
	timeout := map[string]asynq.Option{}
	for _, p := range cfg.Engine.Pools {
		shares[p.Name] = size
		q := ns + ":" + p.Name
		asynqQueues[q] = 1 // no kind of job comes first: one pool, as in the story
		for _, jt := range p.JobTypes {
			poolOf[jt], queueOf[jt] = p.Name, q
			timeout[jt] = asynq.Timeout(p.JobTimeout)
		}
		poll = min(poll, p.PollInterval)
	}
	db, err := database.Open(ctx, cfg.Database, shares)
	if err != nil {
		return res, err
	}
	defer db.Close()
	h := queues.NewHandlers()
	if err := handlers.Register(h, handlers.Deps{
		DB: db, Catalog: cfg.Catalog, OutputDir: cfg.OutputDir, PoolOf: func(jt string) string { return poolOf[jt] },
		ReportMinDuration: cfg.ReportMinDuration,
	}); err != nil {
		return res, err
	}

	rec := newRecorder(o.OrderTimeout, nil)
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{
		Concurrency: size, Queues: asynqQueues, TaskCheckInterval: poll,
		// asynq warns of every job that fails for good; here that is every
		// order that timed out, which the demo counts itself.
		LogLevel:        asynq.ErrorLevel,
		ShutdownTimeout: cfg.Engine.ShutdownTimeout, Logger: queues.AsynqLogger(o.Logger.With("phase", "outage", "component", "asynq")),
	})
	if err := srv.Start(rec.wrap(func(jt string) []string { return []string{sharedRow, poolOf[jt]} }, h)); err != nil {
		return res, err
	}
	defer func() {
		srv.Shutdown() // a no-op once stopped
		deleteQueues(rdb, asynqQueues, o.Logger)
	}()
	client := asynq.NewClientFromRedisClient(rdb)
	// A job that fails is not retried: a request that gave up is gone, and
	// a report that failed is counted as failed.
	enqueue := func(ctx context.Context, jobType string, payload []byte, err error) (string, error) {
		if err != nil {
			return "", err
		}
		info, err := client.EnqueueContext(ctx, asynq.NewTask(jobType, payload), asynq.Queue(queueOf[jobType]), asynq.MaxRetry(0), timeout[jobType])
		if err != nil {
			return "", err
		}
		return info.ID, nil
	}

	rows := []viewRow{{key: sharedRow, label: sharedRow, size: size}}
	for _, p := range cfg.Engine.Pools {
		rows = append(rows, viewRow{key: p.Name, label: "  " + p.Name + " jobs", size: size})
	}
	total := 0
	ph := &phase{
		view: &liveView{w: o.Out, terminal: o.Terminal, phase: res.Name, rows: rows, refresh: o.Refresh},
		rec:  rec,
		enqueueOrder: func(ctx context.Context, p handlers.OrderPayload) (string, error) {
			b, err := handlers.Order.Encode(p)
			return enqueue(ctx, handlers.TypeOrder, b, err)
		},
		enqueueSearch: func(ctx context.Context, p handlers.SearchPayload) error {
			b, err := handlers.Search.Encode(p)
			_, err = enqueue(ctx, handlers.TypeSearch, b, err)
			return err
		},
		flood: func(ctx context.Context) (int, error) {
			for _, e := range monthEnd(cfg, plans) {
				b, err := handlers.Report.Encode(handlers.ReportPayload{Report: e.report, Period: e.period})
				if _, err := enqueue(ctx, handlers.TypeReport, b, err); err != nil {
					return total, err
				}
				total++
			}
			return total, nil
		},
		progress: func(context.Context) (string, bool, error) {
			done, failed, running := rec.reportCounts("", poolOf[handlers.TypeReport])
			line := fmt.Sprintf("%d/%d done, %d running, %d waiting, %d failed", done, total, running, total-done-failed-running, failed)
			return line, done+failed >= total, nil
		},
		held:  db.PeakConnections,
		db:    db.SQL(),
		stage: st, title: res.Name + ": " + res.Setup, shared: size,
		minDuration: max(0, o.OutageMin),
	}
	ph.view.note("\n=== %s: %s ===\n%s", res.Name, res.Setup, res.Describe)
	times, err := ph.run(ctx, o)
	if err != nil {
		return res, err
	}
	srv.Shutdown()

	res.MonthEndTook, res.Enqueue = times.monthEnd, times.enqueue
	res.OrderBefore, res.OrderDuring = rec.orderResults()
	res.ReportsTotal = total
	res.ReportsDone, res.ReportsFailed, _ = rec.reportCounts("", "")
	if res.ReportsFailed > 0 {
		res.Failures = append(res.Failures, fmt.Sprintf("%d reports failed (this phase keeps no reasons; run with -log-level info)", res.ReportsFailed))
	}
	peak, jobs := rec.peaks()
	conns := db.PeakConnections()
	res.Pools = append(res.Pools, PoolResult{Name: sharedRow, Size: size, MaxConcurrent: peak[sharedRow], MaxConns: NotCounted, Jobs: jobs[sharedRow]})
	for _, p := range cfg.Engine.Pools {
		res.Pools = append(res.Pools, PoolResult{Name: p.Name, Size: size, MaxConcurrent: peak[p.Name], MaxConns: conns[p.Name], Jobs: jobs[p.Name]})
	}
	return res, nil
}

// deleteQueues removes the outage phase's queues and what is left in them
// (orders that timed out are archived there).
func deleteQueues(rdb redis.UniversalClient, qs map[string]int, log *slog.Logger) {
	insp := asynq.NewInspectorFromRedisClient(rdb)
	for q := range qs {
		if err := insp.DeleteQueue(q, true); err != nil && !errors.Is(err, asynq.ErrQueueNotFound) {
			log.Warn("demo: could not delete the outage phase's queue", "queue", q, "error", err)
		}
	}
}

// reportEntry is one report of the month-end, in the order it is enqueued.
type reportEntry struct {
	report, period, tier string
}

// monthEnd lists every plan's reports tier by tier, highest first, so a
// report that starts while the rest are still being enqueued is never
// overtaken by a higher tier enqueued later. Both phases enqueue them in
// this order.
func monthEnd(cfg *app.Config, plans []*reports.Plan) []reportEntry {
	var out []reportEntry
	for _, tier := range cfg.Policy.Tiers() {
		for _, p := range plans {
			for _, e := range p.Entries {
				if e.Tier == tier {
					out = append(out, reportEntry{report: e.Name, period: p.Period.String(), tier: tier})
				}
			}
		}
	}
	return out
}

package app

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lci-labs/compartment/handlers"
	"github.com/lci-labs/compartment/internal/database"
	"github.com/lci-labs/compartment/internal/reports"
	"github.com/lci-labs/compartment/internal/schedule"
	"github.com/lci-labs/compartment/queues"
)

// WorkerOptions tune NewWorker.
type WorkerOptions struct {
	// Logger receives every log. Defaults to slog.Default().
	Logger *slog.Logger
	// OnReportDone is called after each report file is written.
	OnReportDone func(p handlers.ReportPayload, r reports.Result)
	// Middleware wraps each pool's handler (see queues.Config.Middleware).
	Middleware []queues.Middleware
	// Clock is the schedules' clock. Defaults to the system clock.
	Clock schedule.Clock
	// Observer is told when each job starts and ends (see
	// queues.Config.Observer), for metrics.
	Observer queues.Observer
	// OnBreakerChange is told of every change of a pool's circuit breaker
	// this process makes (see queues.Config.OnBreakerChange), for metrics:
	// the worker's own, and those an operator forces through an enqueuer
	// of the worker's (NewEnqueuer: the dashboard's breaker action).
	OnBreakerChange func(queues.BreakerChange)
	// OnRecover is told of the jobs this process took back from a worker
	// that stopped answering (see queues.Config.OnRecover), for metrics.
	OnRecover func(queues.Recovery)
}

// Worker is everything cmd/worker runs: Redis, the database, the pools.
type Worker struct {
	Config *Config
	Redis  *Redis
	DB     *database.DB
	Client *queues.Client
	// Scheduler fires the enabled schedules once Start has run; nil when
	// none is enabled.
	Scheduler *schedule.Scheduler

	log   *slog.Logger
	clock schedule.Clock
	// onBreakerChange is WorkerOptions.OnBreakerChange, for the
	// enqueuers NewEnqueuer builds.
	onBreakerChange func(queues.BreakerChange)

	current   atomic.Pointer[Config] // set by Reload; see Current
	mu        sync.Mutex
	enqueuers []*Enqueuer // made by NewEnqueuer: Reload updates them
}

// NewWorker connects Redis (starting the embedded one if configured) and
// the database, and builds the engine's client with the story's handlers.
// Nothing runs until Start. Close releases what NewWorker opened.
func NewWorker(ctx context.Context, cfg *Config, o WorkerOptions) (_ *Worker, err error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	w := &Worker{Config: cfg, log: o.Logger, clock: o.Clock, onBreakerChange: o.OnBreakerChange}
	defer func() {
		if err != nil {
			w.Close()
		}
	}()
	if w.Redis, err = OpenRedis(ctx, cfg.Redis, true, func(attempt int, err error) {
		o.Logger.Warn("redis unreachable at start; retrying (redis.wait_at_start)", "addr", cfg.Redis.Addr(), "attempt", attempt, "error", err)
	}); err != nil {
		return nil, err
	}
	if w.DB, err = database.Open(ctx, cfg.Database, cfg.Shares()); err != nil {
		return nil, err
	}
	h := queues.NewHandlers()
	h.OnPanic = func(jobType string, v any, stack []byte) {
		o.Logger.Error("handler panicked; job archived", "job_type", jobType, "panic", fmt.Sprint(v), "stack", string(stack))
	}
	poolOf := func(jobType string) string {
		p, _ := cfg.route(jobType)
		return p.Name
	}
	if err = handlers.Register(h, handlers.Deps{
		DB: w.DB, Catalog: cfg.Catalog, OutputDir: cfg.OutputDir, PoolOf: poolOf, Dependency: cfg.Database.Dependency,
		ReportMinDuration: cfg.ReportMinDuration, OnReportDone: o.OnReportDone,
		OnBundleDone: func(p handlers.BundlePayload, path string) {
			o.Logger.Info("month-end bundle written", "run", p.Run.ID, "period", p.Run.Period, "state", p.Run.State,
				"succeeded", p.Run.Counts.Succeeded, "failed", p.Run.Counts.Failed, "manifest", path, "notify", p.Notify)
		},
	}); err != nil {
		return nil, err
	}
	ec := cfg.Engine
	ec.Handlers, ec.Logger, ec.Middleware, ec.Observer = h, o.Logger, o.Middleware, o.Observer
	ec.OnBreakerChange, ec.OnRecover = o.OnBreakerChange, o.OnRecover
	if w.Client, err = queues.NewClient(w.Redis.Client, ec); err != nil {
		return nil, err
	}
	return w, nil
}

// Start removes the temporary report files killed runs left in the output
// directory, then starts the pools (see queues.Client.Start), then the
// schedules.
func (w *Worker) Start(ctx context.Context) error {
	w.cleanStaleTemp()
	if err := w.Client.Start(ctx); err != nil {
		return err
	}
	return w.startSchedules(ctx, w.log, w.clock)
}

// cleanStaleTemp removes the temporary files of reports whose worker was
// killed mid-write and that never ran again (a run removes its own report's
// leftovers first). A file is stale when it is older than twice the longest
// job timeout of any pool, and at least an hour: no run still writes it.
// A failure is logged, never fatal: leftovers take space, not correctness.
func (w *Worker) cleanStaleTemp() {
	dir := w.Config.OutputDir
	if dir == "" {
		return
	}
	age := time.Hour
	for _, p := range w.Config.Engine.Pools {
		age = max(age, 2*cmp.Or(p.JobTimeout, queues.DefaultJobTimeout))
	}
	n, err := reports.CleanStaleTemp(dir, age)
	if n > 0 {
		w.log.Info("removed temporary files that killed report runs left", "dir", dir, "files", n, "older_than", age)
	}
	if err != nil {
		w.log.Warn("could not remove every stale temporary report file", "dir", dir, "error", err)
	}
}

// Stop stops the schedules (a run under way finishes first), then the
// pools gracefully, bounded by ctx and the shutdown timeout (see
// queues.Client.Stop).
func (w *Worker) Stop(ctx context.Context) error {
	var serr error
	if w.Scheduler != nil {
		serr = w.Scheduler.Stop(ctx)
	}
	if w.Client == nil {
		return serr
	}
	return errors.Join(serr, w.Client.Stop(ctx))
}

// Close stops the pools if they still run, then closes the database and
// Redis: everything NewWorker opened.
func (w *Worker) Close() {
	if w.Scheduler != nil {
		_ = w.Scheduler.Stop(context.Background())
	}
	if w.Client != nil {
		_ = w.Client.Stop(context.Background())
	}
	if w.DB != nil {
		_ = w.DB.Close()
	}
	if w.Redis != nil {
		w.Redis.Close()
	}
}

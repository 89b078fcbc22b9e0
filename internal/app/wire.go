package app

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/lci-labs/compartment/handlers"
	"github.com/lci-labs/compartment/internal/database"
	"github.com/lci-labs/compartment/internal/reports"
	"github.com/lci-labs/compartment/queues"
)

// RedisPingTimeout bounds the reachability check at start.
const RedisPingTimeout = 5 * time.Second

// Redis is a connected Redis, embedded or real.
type Redis struct {
	Client redis.UniversalClient
	// Addr is where it listens, for messages.
	Addr string
	mini *miniredis.Miniredis
}

// Close closes the client and stops an embedded server.
func (r *Redis) Close() {
	_ = r.Client.Close()
	if r.mini != nil {
		r.mini.Close()
	}
}

// OpenRedis connects to the configured Redis and checks that it answers.
// With an embedded config, serve decides whether this process runs the
// embedded server (the worker) or connects to one another process runs
// (cmd/enqueue). An unreachable Redis is an error naming its address; there
// is never a fallback to an embedded one.
//
// With redis.wait_at_start set, an unreachable Redis is retried every second
// for that long (onRetry, when not nil, hears of each failed attempt).
func OpenRedis(ctx context.Context, cfg *Config, serve bool, onRetry func(attempt int, err error)) (*Redis, error) {
	r := &Redis{Addr: cfg.Redis.Addr()}
	if cfg.Redis.Embedded && serve {
		m := miniredis.NewMiniRedis()
		m.ClockTTL(true) // expire keys by the wall clock, as a real Redis does
		if err := m.StartAddr(cfg.Redis.EmbeddedAddr); err != nil {
			return nil, fmt.Errorf("embedded Redis: cannot listen on %s (is another worker running?): %w", cfg.Redis.EmbeddedAddr, err)
		}
		r.mini = m
		r.Addr = m.Addr() // the real port when embedded_addr asked for port 0
	}
	opts, err := cfg.Redis.RedisOptions()
	if err != nil {
		r.Close()
		return nil, err
	}
	if r.mini != nil {
		opts.Addr = r.mini.Addr()
	}
	r.Client = redis.NewClient(opts)
	deadline := time.Now().Add(cfg.Redis.WaitAtStart)
	for attempt := 1; ; attempt++ {
		pingCtx, cancel := context.WithTimeout(ctx, RedisPingTimeout)
		err := r.Client.Ping(pingCtx).Err()
		cancel()
		if err == nil {
			return r, nil
		}
		if time.Now().Before(deadline) && ctx.Err() == nil {
			if onRetry != nil {
				onRetry(attempt, err)
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		r.Close()
		hint := ""
		if cfg.Redis.Embedded {
			hint = " (the embedded Redis runs inside cmd/worker: start the worker with this config first)"
		}
		if cfg.Redis.WaitAtStart > 0 {
			hint += fmt.Sprintf(" (waited %s)", cfg.Redis.WaitAtStart)
		}
		return nil, fmt.Errorf("redis at %s is unreachable%s: %w", r.Addr, hint, err)
	}
}

// WorkerOptions tune NewWorker.
type WorkerOptions struct {
	// Logger receives every log. Defaults to slog.Default().
	Logger *slog.Logger
	// OnReportDone is called after each report file is written.
	OnReportDone func(p handlers.ReportPayload, r reports.Result)
	// Middleware wraps each pool's handler (see queues.RunnerConfig).
	Middleware []func(pool *queues.Pool, next asynq.Handler) asynq.Handler
}

// Worker is everything cmd/worker runs: Redis, the database, the pools.
type Worker struct {
	Config *Config
	Redis  *Redis
	DB     *database.DB
	Pools  *queues.Registry
	Runner *queues.Runner
	Mux    *handlers.Mux
}

// NewWorker connects Redis (starting the embedded one if configured) and
// the database, and builds the runner. Nothing runs until Start.
func NewWorker(ctx context.Context, cfg *Config, o WorkerOptions) (_ *Worker, err error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	w := &Worker{Config: cfg}
	defer func() {
		if err != nil {
			w.Close()
		}
	}()
	if w.Pools, err = queues.NewRegistryFromConfig(&cfg.Config); err != nil {
		return nil, err
	}
	if w.Redis, err = OpenRedis(ctx, cfg, true, func(attempt int, err error) {
		o.Logger.Warn("redis unreachable at start; retrying (redis.wait_at_start)", "addr", cfg.Redis.Addr(), "attempt", attempt, "error", err)
	}); err != nil {
		return nil, err
	}
	shares := map[string]int{}
	for _, p := range w.Pools.Pools() {
		shares[p.Name()] = p.Size()
	}
	if w.DB, err = database.Open(ctx, cfg.Database, shares); err != nil {
		return nil, err
	}
	w.Mux = handlers.NewMux()
	w.Mux.OnPanic = func(jobType string, v any, stack []byte) {
		o.Logger.Error("handler panicked; job archived", "job_type", jobType, "panic", fmt.Sprint(v), "stack", string(stack))
	}
	poolOf := func(jobType string) string {
		p, err := w.Pools.Route(jobType)
		if err != nil {
			return ""
		}
		return p.Name()
	}
	if err = handlers.RegisterBuiltins(w.Mux, handlers.Deps{
		DB: w.DB, Catalog: cfg.Catalog, OutputDir: cfg.OutputDir, PoolOf: poolOf,
		ReportMinDuration: cfg.ReportMinDuration, OnReportDone: o.OnReportDone,
	}); err != nil {
		return nil, err
	}
	w.Runner, err = queues.NewRunner(queues.RunnerConfig{
		Pools: w.Pools, Redis: w.Redis.Client, Handlers: w.Mux,
		ShutdownTimeout: cfg.ShutdownTimeout, Logger: o.Logger, Middleware: o.Middleware,
	})
	if err != nil {
		return nil, err
	}
	return w, nil
}

// Start starts the pools.
func (w *Worker) Start(ctx context.Context) error { return w.Runner.Start(ctx) }

// Shutdown stops the pools gracefully (see queues.Runner.Shutdown).
func (w *Worker) Shutdown() {
	if w.Runner != nil {
		w.Runner.Shutdown()
	}
}

// Close shuts the pools down and closes the database and Redis.
func (w *Worker) Close() {
	w.Shutdown()
	if w.DB != nil {
		_ = w.DB.Close()
	}
	if w.Redis != nil {
		w.Redis.Close()
	}
}

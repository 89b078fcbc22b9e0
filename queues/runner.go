package queues

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/lci-labs/compartment/bulkhead"
	"github.com/lci-labs/compartment/handlers"
)

// CrashRetries is how many worker crashes a job survives on top of its
// pool's max_retry. asynq counts a crash (the job's lease lapsing) as a
// retry, so a crash would otherwise use up a report's last real retry. The
// runner counts real failures itself, in Redis, and archives a job when
// they pass max_retry; asynq's own limit is max_retry + CrashRetries, which
// only crashes can reach.
const CrashRetries = 3

// RetryAfterCrash is how soon a job recovered after a worker crash runs
// again (asynq's recoverer finds it 30-90 s after the crash).
const RetryAfterCrash = time.Second

// ErrTooManyFailures is matched by the permanent failure of a job that
// failed more times than its pool's max_retry allows.
var ErrTooManyFailures = errors.New("failed more times than max_retry allows")

// ErrNotRouted is matched by the permanent failure of a job that arrived in a
// pool its type is not routed to (for example one enqueued by hand into the
// wrong queue).
var ErrNotRouted = errors.New("job type not routed to this pool")

// RunnerConfig wires a Runner.
type RunnerConfig struct {
	// Pools are the pools to run. Required.
	Pools *Registry
	// Redis is the client every pool's server shares. The Runner does not
	// close it. Required.
	Redis redis.UniversalClient
	// Handlers runs the jobs. Every routed job type needs a handler.
	// Required.
	Handlers *handlers.Mux
	// ShutdownTimeout bounds a graceful stop. Defaults to
	// DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// Logger receives the runner's and asynq's logs. Defaults to
	// slog.Default().
	Logger *slog.Logger
	// Middleware, when set, wraps each pool's handler inside the pool's
	// bulkhead (outermost first), for metrics or tracing.
	Middleware []func(pool *Pool, next asynq.Handler) asynq.Handler
	// RetryDelay says how long a failed job waits before its n-th retry.
	// Defaults to asynq's backoff (n^4 + 15 s + jitter); a job recovered
	// after a crash waits RetryAfterCrash whatever this says.
	RetryDelay func(n int, err error) time.Duration
	// DelayedCheckInterval is how often due retries and scheduled jobs move
	// back to their queue: the floor of any retry delay. Defaults to 5s
	// (asynq's).
	DelayedCheckInterval time.Duration
}

// Runner runs one asynq.Server per pool. Start it once; Shutdown stops it
// gracefully and may be called any number of times.
type Runner struct {
	cfg     RunnerConfig
	log     *slog.Logger
	servers []*asynq.Server
	health  *health
	gates   map[string]*gate // cluster-scoped pools

	gateStop context.CancelFunc
	gateDone sync.WaitGroup

	mu      sync.Mutex
	started bool
	stopped bool
	done    chan struct{}
}

// NewRunner checks cfg and builds a server per pool; nothing talks to Redis
// until Start.
func NewRunner(cfg RunnerConfig) (*Runner, error) {
	var errs []error
	if cfg.Pools == nil || len(cfg.Pools.Pools()) == 0 {
		errs = append(errs, errors.New("runner: no pools"))
	}
	if cfg.Redis == nil {
		errs = append(errs, errors.New("runner: no Redis client"))
	}
	if cfg.Handlers == nil {
		errs = append(errs, errors.New("runner: no handlers"))
	}
	if cfg.ShutdownTimeout < 0 {
		errs = append(errs, fmt.Errorf("runner: ShutdownTimeout must be >= 0, got %s", cfg.ShutdownTimeout))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	for _, p := range cfg.Pools.Pools() {
		for _, jt := range p.JobTypes() {
			if !cfg.Handlers.Has(jt) {
				errs = append(errs, fmt.Errorf("pool %q: job type %q has no handler", p.Name(), jt))
			}
		}
	}
	for _, jt := range cfg.Handlers.JobTypes() {
		if _, err := cfg.Pools.Route(jt); err != nil {
			errs = append(errs, fmt.Errorf("job type %q has a handler but is routed to no pool", jt))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = DefaultShutdownTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	r := &Runner{cfg: cfg, log: cfg.Logger, done: make(chan struct{}), health: &health{log: cfg.Logger}}
	r.gates = map[string]*gate{}
	processID := newProcessID()
	for _, p := range cfg.Pools.Pools() {
		if p.Config().Scope == ScopeCluster {
			r.gates[p.Name()] = newGate(cfg.Redis, cfg.Pools.Namespace(), p, processID)
		}
		r.servers = append(r.servers, r.newServer(p))
	}
	return r, nil
}

func (r *Runner) newServer(p *Pool) *asynq.Server {
	plog := r.log.With("pool", p.Name())
	pc := p.Config()
	delay := r.cfg.RetryDelay
	return asynq.NewServerFromRedisClient(r.cfg.Redis, asynq.Config{
		Concurrency:              p.Size(),
		Queues:                   p.asynqQueues(),
		StrictPriority:           pc.QueueOrder == QueueOrderStrict,
		TaskCheckInterval:        pc.PollInterval,
		ShutdownTimeout:          r.cfg.ShutdownTimeout,
		Logger:                   asynqLogger{plog.With("component", "asynq")},
		HealthCheckInterval:      healthCheckInterval,
		DelayedTaskCheckInterval: r.cfg.DelayedCheckInterval,
		HealthCheckFunc:          r.health.report,
		RetryDelayFunc: func(n int, err error, t *asynq.Task) time.Duration {
			switch {
			case errors.Is(err, asynq.ErrLeaseExpired):
				return RetryAfterCrash
			case delay != nil:
				return delay(n, err)
			default:
				return asynq.DefaultRetryDelayFunc(n, err, t)
			}
		},
		ErrorHandler: asynq.ErrorHandlerFunc(func(ctx context.Context, t *asynq.Task, err error) {
			retried, _ := asynq.GetRetryCount(ctx)
			maxRetry, _ := asynq.GetMaxRetry(ctx)
			id, _ := asynq.GetTaskID(ctx)
			queue, _ := asynq.GetQueueName(ctx)
			attrs := []any{"job_type", t.Type(), "job_id", id, "queue", queue, "retried", retried, "max_retry", maxRetry, "error", err}
			if errors.Is(err, asynq.SkipRetry) || retried >= maxRetry {
				// asynq archives it.
				plog.Error("job failed permanently; archived", attrs...)
			} else {
				plog.Warn("job failed; will retry", attrs...)
			}
		}),
	})
}

// handler is a pool's job handler: it refuses job types not routed to the
// pool, then runs the job inside the pool's bulkhead.
func (r *Runner) handler(p *Pool) asynq.Handler {
	routed := make(map[string]bool)
	for _, jt := range p.JobTypes() {
		routed[jt] = true
	}
	var next asynq.Handler = r.cfg.Handlers
	for i := len(r.cfg.Middleware) - 1; i >= 0; i-- {
		next = r.cfg.Middleware[i](p, next)
	}
	bh := p.Bulkhead()
	g := r.gates[p.Name()]
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		if !routed[t.Type()] {
			return handlers.Permanent(fmt.Errorf("%w: job type %q arrived in pool %q (routed: %q)", ErrNotRouted, t.Type(), p.Name(), p.JobTypes()))
		}
		if g != nil {
			id, _ := asynq.GetTaskID(ctx)
			queue, _ := asynq.GetQueueName(ctx)
			member, err := g.acquire(ctx, id, queue)
			if err != nil {
				return err
			}
			defer g.release(ctx, member)
		}
		err := bh.Execute(ctx, func(ctx context.Context) error { return next.ProcessTask(ctx, t) })
		if errors.Is(err, bulkhead.ErrFull) {
			// The server's concurrency equals the bulkhead size, so this
			// means the bulkhead is shared with other code. Fail without
			// SkipRetry: the job is retried later, not lost.
			return fmt.Errorf("pool %q: %w", p.Name(), err)
		}
		return r.countFailure(ctx, p, err)
	})
}

// countFailure keeps the count of a job's real failures (crashes aside) in
// Redis, and turns a failure past the pool's max_retry into a permanent one.
// A job that succeeds on its first run costs nothing here.
func (r *Runner) countFailure(ctx context.Context, p *Pool, err error) error {
	id, _ := asynq.GetTaskID(ctx)
	retried, _ := asynq.GetRetryCount(ctx)
	key := r.cfg.Pools.Namespace() + ":failures:" + id
	bg := context.WithoutCancel(ctx)
	if errors.Is(err, errGateWait) {
		return err // the job never ran: not a failure of the job
	}
	if err == nil || errors.Is(err, asynq.SkipRetry) {
		if retried > 0 {
			r.cfg.Redis.Del(bg, key)
		}
		return err
	}
	n, cerr := r.cfg.Redis.Incr(bg, key).Result()
	if cerr != nil {
		// Redis is failing too: asynq will not be able to record this
		// failure either; leave its own limit in charge.
		return err
	}
	r.cfg.Redis.Expire(bg, key, failureCountTTL)
	if maxRetry := *p.Config().MaxRetry; n > int64(maxRetry) {
		r.cfg.Redis.Del(bg, key)
		noun := "failures"
		if n == 1 {
			noun = "failure"
		}
		return handlers.Permanent(fmt.Errorf("%w (%d %s, max_retry %d): %w", ErrTooManyFailures, n, noun, maxRetry, err))
	}
	return err
}

// failureCountTTL bounds how long a job's failure count outlives it.
const failureCountTTL = 30 * 24 * time.Hour

// Start starts every pool's server. If one fails to start, the ones already
// started are shut down and the error is returned. Start may be called once.
func (r *Runner) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started {
		return errors.New("runner: already started")
	}
	if r.stopped {
		return errors.New("runner: already shut down")
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	gctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r.gateStop = cancel
	for _, g := range r.gates {
		r.gateDone.Add(1)
		go func() {
			defer r.gateDone.Done()
			g.run(gctx)
		}()
	}
	pools := r.cfg.Pools.Pools()
	for i, srv := range r.servers {
		p := pools[i]
		if err := srv.Start(r.handler(p)); err != nil {
			r.shutdownServers(r.servers[:i])
			r.stopGates()
			r.stopped = true
			close(r.done)
			return fmt.Errorf("pool %q: start: %w", p.Name(), err)
		}
		r.log.Info("pool started", "pool", p.Name(), "size", p.Size(), "scope", p.Config().Scope,
			"queues", p.Queues(), "order", p.Config().QueueOrder, "poll_interval", p.Config().PollInterval)
	}
	r.started = true
	return nil
}

// Shutdown stops every pool gracefully: all pools stop taking new jobs at
// once, running jobs get up to the shutdown timeout to finish, and jobs still
// running then are cancelled and go back to the head of their queue (asynq
// does not count that as a retry). Calling it before Start, or again, is
// safe; concurrent callers all return when the shutdown is complete.
func (r *Runner) Shutdown() {
	r.mu.Lock()
	if r.stopped {
		r.mu.Unlock()
		<-r.done
		return
	}
	r.stopped = true
	started := r.started
	r.mu.Unlock()
	if started {
		r.log.Info("shutting down", "timeout", r.cfg.ShutdownTimeout)
		r.shutdownServers(r.servers)
		// Leases are renewed until every job has finished or gone back.
		r.stopGates()
		r.log.Info("all pools stopped")
	}
	close(r.done)
}

func (r *Runner) stopGates() {
	if r.gateStop != nil {
		r.gateStop()
		r.gateDone.Wait()
	}
}

// GateStats reports how a cluster-scoped pool's gate behaved in this
// runner; ok is false for a pool scoped per process.
func (r *Runner) GateStats(pool string) (s GateStats, ok bool) {
	g, ok := r.gates[pool]
	if !ok {
		return GateStats{}, false
	}
	return g.stats(), true
}

// Done is closed when the runner has shut down.
func (r *Runner) Done() <-chan struct{} { return r.done }

func (r *Runner) shutdownServers(servers []*asynq.Server) {
	// Stop every server first so no pool takes new work while another is
	// still draining, then drain them concurrently: the whole stop takes one
	// shutdown timeout, not one per pool.
	var wg sync.WaitGroup
	for _, s := range servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.Stop() // returns once the server's dequeue loop has seen it
		}()
	}
	wg.Wait()
	for _, s := range servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.Shutdown()
		}()
	}
	wg.Wait()
}

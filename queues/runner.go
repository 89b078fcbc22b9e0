package queues

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lci-labs/compartment/bulkhead"

	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// CrashRetries is how many worker crashes a job survives on top of its
// pool's max_retry. asynq counts a crash (the job's lease lapsing) as a
// retry, so a crash would otherwise use up a job's last real retry. The
// runner counts real failures itself, in Redis, and archives a job when
// they pass max_retry; asynq's own limit is max_retry + CrashRetries, which
// only crashes can reach.
const CrashRetries = 3

// RetryAfterCrash is how soon a job recovered after a worker crash runs
// again, once asynq's recoverer has found it.
const RetryAfterCrash = time.Second

// ErrTooManyFailures is matched by the permanent failure of a job that
// failed more times than its pool's max_retry allows.
var ErrTooManyFailures = errors.New("failed more times than max_retry allows")

// ErrNotRouted is matched by the permanent failure of a job that arrived in a
// pool its type is not routed to (for example one enqueued by hand into the
// wrong queue).
var ErrNotRouted = errors.New("job type not routed to this pool")

// ErrStopped is returned by Start and Reconfigure once the client has
// stopped for good: after Stop, or after a Start that failed while starting
// the pools' servers (it stops those it had started). A Start that fails
// before that (Redis does not answer, a pool's gate cannot settle) leaves
// the client as it was, and Start may be called again.
var ErrStopped = errors.New("queues: client was stopped (or failed to start); make a new one")

// healthCheckInterval is how often each pool's server pings Redis.
const healthCheckInterval = 5 * time.Second

// failureCountTTL bounds how long a job's failure count outlives it.
const failureCountTTL = 30 * 24 * time.Hour

// runner runs one asynq.Server per pool.
type runner struct {
	c       *Client
	log     *slog.Logger
	servers map[string]serverGroup // by pool; guarded by mu once started
	// lanes are the reserved lanes of pools with reserved slots (see
	// newLane), by pool; guarded by mu once started.
	lanes    map[string]*asynq.Server
	health   *health
	fences   *fences  // the jobs this process runs, and those taken over
	runWatch runWatch // the running jobs of runs, to cancel with their run
	recov    *recoverer
	gates    map[string]*gate    // cluster-scoped pools
	breaker  map[string]*breaker // pools with a circuit breaker
	adaptive adaptiveSamples     // what this process saw of adaptive pools' jobs

	gateStop context.CancelFunc
	gateDone sync.WaitGroup

	inflight     map[string]*atomic.Int64 // jobs in the handler of each pool's current server; guarded by mu
	laneInflight map[string]*atomic.Int64 // the same for each pool's reserved lane
	drainCtx     context.Context          // ends when the client stops: retired servers stop at once
	drainStop    context.CancelFunc
	drains       sync.WaitGroup // servers retired by a reconfiguration, finishing their jobs

	mu       sync.Mutex
	started  bool
	stopping bool
	// stopFlag mirrors stopping for readers that must not wait for mu
	// (handlers ending while a reconfiguration drains a pool holds it).
	stopFlag atomic.Bool
	done     chan struct{}
}

func newRunner(c *Client) *runner {
	r := &runner{c: c, log: c.cfg.Logger, done: make(chan struct{}), health: &health{log: c.cfg.Logger}, gates: map[string]*gate{}, breaker: map[string]*breaker{},
		servers: map[string]serverGroup{}, lanes: map[string]*asynq.Server{}, inflight: map[string]*atomic.Int64{}, laneInflight: map[string]*atomic.Int64{}}
	r.fences = newFences(c.rdb, c.ks, c.cfg.RecoverAfter, c.cfg.Logger)
	r.recov = &recoverer{r: r, after: c.cfg.RecoverAfter}
	processID := newProcessID()
	for _, p := range c.pools().pools {
		if p.Scope() == ScopeCluster {
			g := newGate(c.rdb, c.ks, p, processID, c.cfg.Clock)
			g.log = c.cfg.Logger
			r.gates[p.Name()] = g
		}
		if p.cfg.Breaker != nil {
			b := newBreaker(c.rdb, c.ks, p, c.cfg.Logger)
			b.onChange = c.cfg.OnBreakerChange
			if g := r.gates[p.Name()]; g != nil {
				b.onClose = func(ctx context.Context) { _ = g.settle(ctx) }
			}
			r.breaker[p.Name()] = b
		}
		r.servers[p.Name()] = r.newServer(p)
		if lane := r.newLane(p); lane != nil {
			r.lanes[p.Name()] = lane
		}
	}
	return r
}

// Start checks that Redis answers and starts every pool's server. ctx
// bounds the start only: cancelling it after Start has returned does not
// stop the pools (Stop does). If a pool fails to start, the ones already
// started are stopped and the error names the pool. Start needs
// Config.Handlers and may be called once.
func (c *Client) Start(ctx context.Context) error {
	if c.run == nil {
		return errors.New("queues: Start: the client has no Handlers (Config.Handlers); it can only enqueue")
	}
	return c.run.start(ctx)
}

// Stop stops every pool gracefully: all pools stop taking new jobs at once,
// running jobs get up to Config.ShutdownTimeout to finish, and jobs still
// running then are cancelled and go back to the head of their queue (asynq
// does not count that as a retry). Stop returns nil once every pool has
// stopped, or ctx.Err() if ctx ends first; the stop then goes on in the
// background, bounded by the shutdown timeout, and Stopped tells when it is
// complete. Calling Stop before Start, more than once, or concurrently is
// safe. Stop does not close the Redis client.
func (c *Client) Stop(ctx context.Context) error {
	if c.run == nil {
		return nil
	}
	return c.run.stop(ctx)
}

// Stopped is closed when the client has stopped running jobs, after Stop.
// For a client without Handlers it is closed already.
func (c *Client) Stopped() <-chan struct{} {
	if c.run == nil {
		closed := make(chan struct{})
		close(closed)
		return closed
	}
	return c.run.done
}

// GateStats reports how a cluster-scoped pool's gate behaved in this
// process; ok is false for a pool scoped per process or a client that does
// not run jobs.
func (c *Client) GateStats(pool string) (s GateStats, ok bool) {
	if c.run == nil {
		return GateStats{}, false
	}
	g, ok := c.run.gates[pool]
	if !ok {
		return GateStats{}, false
	}
	return g.stats(), true
}

// newServer returns a pool's asynq servers: one per dequeue loop
// (PoolConfig.DequeueLoops), the pool's concurrency in this process split
// among them. They share one handler, so one bulkhead and, for a
// cluster-scoped pool, one gate: the pool's size and tier order hold
// whatever the number of loops.
func (r *runner) newServer(p *Pool) serverGroup {
	cfg := r.serverConfig(p)
	loops := max(1, p.cfg.DequeueLoops)
	total := cfg.Concurrency
	g := make(serverGroup, loops)
	for i := range g {
		c := cfg
		c.Concurrency = total / loops
		if i < total%loops {
			c.Concurrency++
		}
		g[i] = asynq.NewServerFromRedisClient(rdb.GuardedClient{UniversalClient: r.c.rdb, Guard: r.fences.guard}, c)
	}
	return g
}

// serverGroup is a pool's asynq servers in one process, started and
// stopped together.
type serverGroup []*asynq.Server

// Start starts every server with h; if one fails, those already started
// are shut down and the error returned.
func (g serverGroup) Start(h asynq.Handler) error {
	for i, s := range g {
		if err := s.Start(h); err != nil {
			serverGroup(g[:i]).Shutdown()
			return err
		}
	}
	return nil
}

// Stop makes every server stop taking jobs.
func (g serverGroup) Stop() {
	var wg sync.WaitGroup
	for _, s := range g {
		wg.Go(s.Stop)
	}
	wg.Wait()
}

// Shutdown stops every server, waiting for its running jobs (bounded by
// the shutdown timeout).
func (g serverGroup) Shutdown() {
	var wg sync.WaitGroup
	for _, s := range g {
		wg.Go(s.Shutdown)
	}
	wg.Wait()
}

// newLane returns the reserved lane of a cluster-scoped pool with reserved
// slots, or nil: a second asynq server in this process that serves only
// the tiers a reservation covers, with one worker per reserved slot. Its
// workers are the ones a job of those tiers is dequeued with when only
// reserved room is left: the pool's own server's workers may all be taken
// by lower-tier jobs that were dequeued in the instant before their queue
// was paused and wait for a slot, and a job cannot be dequeued without a
// free worker. The cluster-wide gate counts the lane's jobs like any
// other, so the pool's size holds.
func (r *runner) newLane(p *Pool) *asynq.Server {
	if p.Scope() != ScopeCluster || len(p.cfg.Reserved) == 0 {
		return nil
	}
	cfg := r.serverConfig(p)
	cfg.Concurrency = 0 // a pool with reservations has no look-ahead
	lowest := 0         // rank of the lowest tier with a reservation
	for i, t := range p.tiers {
		if n := p.cfg.Reserved[t]; n > 0 {
			cfg.Concurrency += n
			lowest = i
		}
	}
	all := p.asynqQueues()
	cfg.Queues = map[string]int{}
	for _, q := range p.queues[:lowest+1] {
		cfg.Queues[q] = all[q]
	}
	return asynq.NewServerFromRedisClient(rdb.GuardedClient{UniversalClient: r.c.rdb, Guard: r.fences.guard}, cfg)
}

func (r *runner) serverConfig(p *Pool) asynq.Config {
	plog := r.log.With("pool", p.Name())
	pc := p.cfg
	delay := r.c.cfg.RetryDelay
	return asynq.Config{
		// The pool's bulkhead (pc.concurrency()) caps the jobs that run;
		// the look-ahead workers only hold jobs waiting for a slot.
		Concurrency:              pc.concurrency() + pc.lookAhead(),
		Queues:                   p.asynqQueues(),
		StrictPriority:           pc.QueueOrder == QueueOrderStrict,
		TaskCheckInterval:        pc.PollInterval,
		ShutdownTimeout:          r.c.cfg.ShutdownTimeout,
		Logger:                   asynqLogger{plog.With("component", "asynq")},
		HealthCheckInterval:      healthCheckInterval,
		DelayedTaskCheckInterval: r.c.cfg.DelayedCheckInterval,
		HealthCheckFunc:          r.health.report,
		// A job that never ran (it gave up waiting for a cluster-wide
		// slot, or Redis failed while it asked for one) goes back without
		// using up a retry.
		// So does a job the circuit breaker held back, and a soft failure
		// (pools with a breaker count failures themselves: see
		// breakerOutcome).
		IsFailure: isFailure,
		RetryDelayFunc: func(n int, err error, t *asynq.Task) time.Duration {
			switch {
			case errors.Is(err, asynq.ErrLeaseExpired):
				return RetryAfterCrash
			case errors.Is(err, errBreakerOpen), errors.Is(err, errBreakerRedis):
				return breakerHoldDelay
			case errors.Is(err, errGateWait):
				// It never ran (taken from its queue ahead of a slot, it gave
				// up at a stop or near its deadline): due again at once, back
				// in its queue at the next forward of due jobs.
				return 0
			}
			var soft *softFailure
			if errors.As(err, &soft) {
				n = soft.n
			}
			switch {
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
			var soft *softFailure
			if errors.As(err, &soft) {
				retried = soft.n - 1
			}
			attrs := []any{"job_type", t.Type(), "job_id", id, "queue", queue, "retried", retried, "error", err}
			// A job that never ran (IsFailure: no retry used) is said as
			// such, not as a failure.
			switch {
			case errors.Is(err, errBreakerOpen):
				plog.Debug("job held back by the circuit breaker; back to its queue", attrs...)
				return
			case errors.Is(err, errHandedBack):
				plog.Debug("job not started: its worker was given to a job taken back; back in its queue, no retry used", attrs...)
				return
			case errors.Is(err, errGateWait) && r.isStopping():
				plog.Info("job put back at shutdown before it started; no retry used", attrs...)
				return
			case errors.Is(err, errGateWait):
				plog.Info("job not started: gave up waiting for a slot; back to its queue, no retry used", attrs...)
				return
			case errors.Is(err, errGateRedis), errors.Is(err, errBreakerRedis), errors.Is(err, errRunRedis):
				plog.Warn("job not started: Redis failed before it could start; it waits to be tried again, no retry used", attrs...)
				return
			}
			if errors.Is(err, asynq.SkipRetry) || retried >= maxRetry {
				// asynq archives it.
				plog.Error("job failed permanently; archived", attrs...)
			} else {
				plog.Warn("job failed; will retry", attrs...)
			}
		}),
	}
}

// handler is a pool's job handler: it refuses job types not routed to the
// pool, takes a cluster-wide slot for a cluster-scoped pool, then runs the
// job inside the pool's bulkhead. Each job reads the pool's settings in
// effect (Client.Reconfigure may change them while the server runs); the
// middleware sees the pool as it was when the server started.
func (r *runner) handler(p *Pool, inflight *atomic.Int64) asynq.Handler {
	routed := make(map[string]bool)
	for _, jt := range p.cfg.JobTypes {
		routed[jt] = true
	}
	var next asynq.Handler = r.c.cfg.Handlers
	mw := r.c.cfg.Middleware
	for i := len(mw) - 1; i >= 0; i-- {
		next = mw[i](p, next)
	}
	name := p.Name()
	g := r.gates[name]
	b := r.breaker[name]
	log := r.log.With("pool", name)
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		inflight.Add(1)
		defer inflight.Add(-1)
		reg := r.c.pools()    // once: the pool and its dependencies from the same config
		p := reg.byName[name] // pools are never removed
		id, _ := asynq.GetTaskID(ctx)
		queue, _ := asynq.GetQueueName(ctx)
		ctx, a, untrack := r.fences.track(ctx, rdb.Member{ID: id, Queue: queue})
		defer untrack()
		start := r.c.cfg.Clock()
		w := r.watchJob(ctx, p, t)
		ctx, span := r.c.tr.startRun(ctx, p, t)
		rj := r.runJobOf(ctx, p, t)
		ctx, deps := reg.deps.forJob(ctx, p.cfg)
		err := r.run(ctx, t, poolRun{pool: p, routed: routed, gate: g, breaker: b, bulkhead: p.Bulkhead(), next: next, watch: w, span: span, attempt: a, run: rj, deps: deps})
		stopping := r.isStopping()
		r.endRun(ctx, rj, err, stopping)
		logJob(ctx, log, p, t, r.c.cfg.Clock().Sub(start), err, stopping)
		if w != nil {
			w.finish(ctx, err, stopping)
		}
		span.end(ctx, err, stopping)
		return err
	})
}

// logJob writes the pool's per-job log line: pool, tier, job type and ID,
// duration and outcome, at the pool's JobLog level. stopping says whether
// the client is stopping: a job asynq put back at the shutdown timeout
// (its context cancelled under it), or one that gave up waiting for a slot
// because of the stop, is put back at shutdown, not failed.
func logJob(ctx context.Context, log *slog.Logger, p *Pool, t *asynq.Task, took time.Duration, err error, stopping bool) {
	level := slog.LevelDebug
	switch p.cfg.JobLog {
	case JobLogOff:
		return
	case JobLogInfo:
		level = slog.LevelInfo
	}
	if !log.Enabled(ctx, level) {
		return
	}
	id, _ := asynq.GetTaskID(ctx)
	queue, _ := asynq.GetQueueName(ctx)
	attrs := []any{"job_type", t.Type(), "job_id", id}
	if tier := p.TierOf(queue); tier != "" {
		attrs = append(attrs, "tier", tier)
	}
	attrs = append(attrs, "duration", took.Round(time.Millisecond))
	switch {
	case errors.Is(err, ErrFenced):
		level = max(level, slog.LevelWarn)
		attrs = append(attrs, "outcome", "fenced: taken over by another worker process while this one did not answer; nothing recorded")
	case stopping && errors.Is(err, errGateWait):
		attrs = append(attrs, "outcome", "not started: put back at shutdown, no retry used")
	case stopping && errors.Is(ctx.Err(), context.Canceled):
		attrs = append(attrs, "outcome", "put back at shutdown, no retry used")
		if err != nil {
			attrs = append(attrs, "error", err)
		}
	case err == nil:
		attrs = append(attrs, "outcome", "done")
	case errors.Is(err, errHandedBack):
		attrs = append(attrs, "outcome", "not started: its worker given to a job taken back from a worker that stopped answering; back in its queue")
	case errors.Is(err, errGateWait):
		attrs = append(attrs, "outcome", "not started: gave up waiting for a slot")
	case errors.Is(err, errBreakerOpen):
		attrs = append(attrs, "outcome", "held back: circuit breaker open", "error", err)
	case errors.Is(err, ErrRunCancelled):
		attrs = append(attrs, "outcome", "cancelled with its run: archived, not retried")
	case errors.Is(err, asynq.SkipRetry):
		attrs = append(attrs, "outcome", "failed for good", "error", err)
	default:
		attrs = append(attrs, "outcome", "failed", "error", err)
	}
	log.Log(ctx, level, "job", attrs...)
}

// poolRun is what run needs of the pool a job runs in, besides the job: the
// pool as configured now, the job types routed to it, its slot gate (nil
// for a process-scoped pool), its circuit breaker (nil without one), its
// bulkhead, the handler chain, the job's watch (nil when nobody observes)
// and its run's span (nil without tracing).
type poolRun struct {
	pool     *Pool
	routed   map[string]bool
	gate     *gate
	breaker  *breaker
	bulkhead *bulkhead.Bulkhead
	next     asynq.Handler
	watch    *watch
	span     *runSpan
	attempt  *attempt
	run      *runJob          // nil for a job of no run
	deps     *jobDependencies // nil when the pool uses no dependency
}

// run runs job t in pool pr.pool: it refuses a job type not routed to the
// pool, takes a cluster-wide slot through the pool's gate (none for a
// process-scoped pool), then runs the handler chain inside the pool's
// bulkhead (telling the watch it starts) and counts a failure. With a
// circuit breaker, the job first asks it.
func (r *runner) run(ctx context.Context, t *asynq.Task, pr poolRun) error {
	p, routed, g, b, bh, next, w := pr.pool, pr.routed, pr.gate, pr.breaker, pr.bulkhead, pr.next, pr.watch
	if !routed[t.Type()] {
		return Permanent(fmt.Errorf("%w: job type %q arrived in pool %q (routed: %q)", ErrNotRouted, t.Type(), p.Name(), p.cfg.JobTypes))
	}
	if err := r.tooManyFailures(ctx, p); err != nil {
		return err
	}
	var job rdb.Member
	probe := false
	if b != nil {
		job.ID, _ = asynq.GetTaskID(ctx)
		job.Queue, _ = asynq.GetQueueName(ctx)
		var verdict rdb.Verdict
		err := r.whileRedisDown(ctx, func() (err error) {
			verdict, err = b.admit(ctx, job)
			return err
		}, func(error) bool { return true })
		switch {
		case err != nil && pr.attempt.isFenced():
			return r.fenced(p, pr, false, job)
		case err != nil:
			return fmt.Errorf("pool %q: %w: %w", p.Name(), errBreakerRedis, err)
		case verdict == rdb.VerdictWait:
			pr.span.event(EventBreakerHeldBack)
			return fmt.Errorf("pool %q: %w: not started", p.Name(), errBreakerOpen)
		}
		probe = verdict == rdb.VerdictProbe
	}
	if g != nil {
		id, _ := asynq.GetTaskID(ctx)
		queue, _ := asynq.GetQueueName(ctx)
		retried, _ := asynq.GetRetryCount(ctx)
		ready := readyAt(t, retried)
		var slot string
		asked := time.Now()
		err := r.whileRedisDown(ctx, func() (err error) {
			slot, err = g.acquireReady(ctx, id, queue, ready)
			return err
		}, func(err error) bool { return errors.Is(err, errGateRedis) })
		pr.span.slotWait(time.Since(asked))
		if err != nil {
			if pr.attempt.isFenced() {
				return r.fenced(p, pr, probe, job)
			}
			if errors.Is(err, errHandedBack) {
				r.fences.handBack(pr.attempt)
			}
			if probe {
				b.probeDone(ctx, job, rdb.ProbeNone)
			}
			return err
		}
		defer func() {
			if pr.attempt.isFenced() {
				g.abandon(ctx, slot)
			} else {
				g.release(ctx, slot)
			}
		}()
	}
	if rj := pr.run; rj != nil {
		skip, err := r.startRun(ctx, rj)
		if err != nil && pr.attempt.isFenced() {
			// Taken over while it waited for Redis to record its start:
			// another process runs it now, and nothing of this run counts.
			return r.fenced(p, pr, probe, job)
		}
		if err != nil || skip {
			if probe {
				b.probeDone(ctx, job, rdb.ProbeNone)
			}
			return err
		}
	}
	began := time.Now()
	hctx, cancel := handlerContext(ctx)
	defer cancel()
	if pr.run != nil {
		var forget func()
		hctx, forget = r.runWatch.watch(hctx, pr.run)
		defer forget()
	}
	err := bh.Execute(hctx, func(ctx context.Context) error {
		w.start()
		pr.span.begin()
		pr.span.breakerPaused(b)
		defer w.returned()
		return next.ProcessTask(ctx, t)
	})
	ran := time.Since(began)
	if p.cfg.Adaptive != nil && err == nil && ctx.Err() == nil {
		// Only jobs that succeeded: a failure that returns at once would
		// drag the baseline down (and a failing dependency is the
		// breaker's); and in a pool with dependencies, only those that
		// took their share (jobDependencies.sampled).
		if pr.deps.sampled() {
			waited := time.Duration(0)
			if pr.deps != nil {
				waited = time.Duration(pr.deps.waited.Load())
			}
			r.adaptive.record(p.Name(), ran-waited, waited)
		} else if r.adaptive.skip(p.Name()) {
			r.log.Warn("adaptive limit: none of the pool's jobs took a share of its dependencies through queues.DependencyOf, so its limit has nothing to follow (docs/DEPENDENCIES.md)",
				"pool", p.Name(), "jobs", adaptiveSkipWarn, "uses", p.cfg.Uses)
		}
	}
	if err != nil && ctx.Err() == nil && errors.Is(hctx.Err(), context.DeadlineExceeded) {
		err = fmt.Errorf("ran into its deadline (job_timeout %s): %w", p.cfg.JobTimeout, err)
	}
	r.awaitRedis(ctx, ran, g)
	switch ferr := r.fences.confirm(ctx, pr.attempt); {
	case errors.Is(ferr, ErrFenced):
		return r.fenced(p, pr, probe, job)
	case ferr != nil:
		return fmt.Errorf("pool %q: %w", p.Name(), ferr)
	}
	if err != nil && pr.run != nil && pr.run.wasCut() {
		// Its run was cancelled under it: archived, not retried, and
		// neither a failure nor a breaker outcome.
		if probe {
			b.probeDone(ctx, job, rdb.ProbeNone)
		}
		return Permanent(fmt.Errorf("%w: %w", ErrRunCancelled, err))
	}
	if errors.Is(err, bulkhead.ErrFull) {
		// The server's concurrency equals the bulkhead size, so this
		// means the bulkhead is shared with other code. Fail without
		// SkipRetry: the job is retried later, not lost.
		if probe {
			b.probeDone(ctx, job, rdb.ProbeNone)
		}
		return fmt.Errorf("pool %q: %w", p.Name(), err)
	}
	if b != nil {
		return r.breakerOutcome(ctx, p, b, job, probe, ran, err)
	}
	return r.countFailure(ctx, p, err)
}

// fenced is what run returns for a job another process took over while
// this one did not answer: nothing of the run is recorded (no failure
// count, no breaker outcome; asynq's writes are refused, rdb.GuardedClient).
// A probe the job was for its pool's breaker is forgotten here
// (breaker.forgetProbe), not reported: the probe stays the new run's.
func (r *runner) fenced(p *Pool, pr poolRun, probe bool, job rdb.Member) error {
	if probe {
		pr.breaker.forgetProbe(job)
	}
	pr.span.event(EventFenced)
	return fmt.Errorf("pool %q: %w", p.Name(), ErrFenced)
}

// handlerContext is the context a job's handler runs with: the job's,
// ending a little before the job's deadline (gateGiveUpMargin of the time
// left: a tenth, 0.1 to 5 s). asynq does not wait for a handler once the
// deadline passes: it schedules the retry at once, while the runner may
// still be counting the failure against max_retry, so the retry could run
// before its count is in. Ending the handler's context first, a handler
// that honours its context returns, and its failure is counted and its
// verdict goes back to asynq, before asynq's own deadline fires.
func handlerContext(ctx context.Context) (context.Context, context.CancelFunc) {
	deadline, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	return context.WithDeadline(ctx, deadline.Add(-gateGiveUpMargin(time.Until(deadline))))
}

// A job that ran at least this long checks that Redis answers before its
// outcome goes back to asynq (awaitRedis): one read per second of work at
// most, nothing for short jobs while Redis is healthy.
const outcomeCheckAfter = time.Second

// outcomeHoldMax bounds how long a job's outcome waits for Redis. asynq's
// lease on a running job lasts 30 s from its last renewal (every 5 s, none
// while Redis is down); once it lapses, asynq ends the wait by cancelling
// the job's context and writes nothing for the job anyway.
const outcomeHoldMax = 30 * time.Second

// outcomeProbeTimeout bounds one check that Redis answers, so that a Redis
// that does not answer at all (no refused connection) cannot hold a check
// up to the job's deadline.
const outcomeProbeTimeout = time.Second

// awaitRedis holds a job that has run, before its outcome goes
// back to asynq, until Redis answers, when there is reason to think it
// does not: the pools' health checks (every 5 s) last failed, the pool's
// cluster-wide gate g (nil for a process-scoped pool; its keeper calls
// Redis every 2 s) saw its last call fail, or the job ran for
// outcomeCheckAfter or more and a check fails. The check reads the job's
// queue's active list (EXISTS), the key asynq writes next, so it asks the
// node that holds it on a Redis Cluster and the master through Sentinel.
//
// asynq v0.26 writes a job's outcome once and, if that write fails, retries
// it with a context it has already cancelled (processor.markAsDone), so an
// outcome reported during an outage or a Sentinel failover is lost: the job
// stays "active" until its lease lapses and asynq's recoverer runs it
// again, 55 to 125 s later. Holding it here instead, a report that ends
// mid-outage is marked done the moment Redis (or the new master) answers,
// and runs once. The hold ends, like the waits for a slot, when the job's
// context ends (asynq's lease lapsed, or its deadline), its deadline comes
// near, the client stops or outcomeHoldMax passes; the outcome then goes
// back as it would have without the hold.
func (r *runner) awaitRedis(ctx context.Context, ran time.Duration, g *gate) {
	if ctx.Err() != nil || (ran < outcomeCheckAfter && !r.health.isDown() && (g == nil || !g.unsure())) {
		return
	}
	queue, _ := asynq.GetQueueName(ctx) // always there in a job's context
	hold, cancel := context.WithTimeout(ctx, outcomeHoldMax)
	defer cancel()
	_ = r.whileRedisDown(hold, func() error {
		probe, cancel := context.WithTimeout(hold, outcomeProbeTimeout)
		defer cancel()
		return rdb.QueueAnswers(probe, r.c.rdb, queue)
	}, func(error) bool { return true })
}

// Pauses between a job's attempts to reach Redis for its slot or its
// breaker while Redis does not answer.
const (
	outageRetryFirst = 100 * time.Millisecond
	outageRetryMax   = time.Second
)

// whileRedisDown calls call until it returns nil or an error that is not
// retryable (a Redis error of the slot or breaker call), pausing 100 ms
// and then longer, up to a second, in between, for as long as the job may
// still wait: its context is alive, its deadline is not near (the gate's
// margin) and the client is not stopping. Then it returns call's last
// error.
//
// A job that gives up because Redis does not answer goes back to asynq,
// which must write that to Redis too: in an outage or a Sentinel failover
// that write fails, asynq v0.26 does not retry it (its retry runs with a
// context already cancelled), and the job then stays "active" until its
// lease lapses and a recoverer takes it, 55 to 125 s later; a job that
// was waiting for a slot also leaves its place in the gate's waiting line
// until that expires (GateLeaseTTL), holding back the jobs behind it.
// Waiting here instead, the job asks again as soon as Redis (or the new
// master) answers.
func (r *runner) whileRedisDown(ctx context.Context, call func() error, retryable func(error) bool) error {
	giveUp := time.Time{}
	if deadline, ok := ctx.Deadline(); ok {
		giveUp = deadline.Add(-gateGiveUpMargin(time.Until(deadline)))
	}
	pause := outageRetryFirst
	for {
		err := call()
		if err == nil || !retryable(err) || ctx.Err() != nil || r.isStopping() ||
			(!giveUp.IsZero() && time.Now().Add(pause).After(giveUp)) {
			return err
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		pause = min(2*pause, outageRetryMax)
	}
}

// countFailure keeps the count of a job's real failures (crashes aside) in
// Redis, and turns a failure past the pool's max_retry into a permanent one.
// A job that succeeds on its first run costs nothing here. When the job ran
// into its deadline, asynq retries it without reading this verdict, so the
// count is kept and the next attempt is refused before it runs (see
// tooManyFailures).
func (r *runner) countFailure(ctx context.Context, p *Pool, err error) error {
	if errors.Is(err, errGateWait) || errors.Is(err, errGateRedis) {
		return err // the job never ran: not a failure of the job
	}
	var job rdb.Member
	job.ID, _ = asynq.GetTaskID(ctx)
	job.Queue, _ = asynq.GetQueueName(ctx)
	retried, _ := asynq.GetRetryCount(ctx)
	counts := rdb.NewFailureCounts(r.c.rdb, r.c.ks, p.Name())
	bg := context.WithoutCancel(ctx)
	if err == nil || errors.Is(err, asynq.SkipRetry) {
		if retried > 0 {
			_ = counts.Delete(bg, job)
		}
		return err
	}
	n, cerr := counts.Add(bg, job, failureCountTTL)
	if cerr != nil {
		// Redis is failing too: asynq will not be able to record this
		// failure either; leave its own limit in charge.
		return err
	}
	if maxRetry := p.cfg.retries(); n > int64(maxRetry) {
		if ctx.Err() == nil {
			_ = counts.Delete(bg, job) // asynq reads this verdict and archives the job
		}
		return tooMany(n, maxRetry, err)
	}
	return err
}

// tooManyFailures refuses, before it runs, an attempt of a job whose
// counted failures already passed max_retry: the verdict of its last
// attempt was lost because that attempt ran into its deadline.
func (r *runner) tooManyFailures(ctx context.Context, p *Pool) error {
	retried, _ := asynq.GetRetryCount(ctx)
	if retried == 0 {
		return nil
	}
	var job rdb.Member
	job.ID, _ = asynq.GetTaskID(ctx)
	job.Queue, _ = asynq.GetQueueName(ctx)
	counts := rdb.NewFailureCounts(r.c.rdb, r.c.ks, p.Name())
	n, err := counts.Get(ctx, job)
	if err != nil || n <= int64(p.cfg.retries()) {
		return nil
	}
	_ = counts.Clear(context.WithoutCancel(ctx), job)
	return tooMany(n, p.cfg.retries(), errors.New("the last attempt ran into its deadline"))
}

// isFailure is asynq's IsFailure: a job that never ran, one the circuit
// breaker held back, and a soft failure (counted by the runner) use up no
// retry in asynq's count.
func isFailure(err error) bool {
	var soft *softFailure
	return !errors.Is(err, errGateWait) && !errors.Is(err, errGateRedis) && !errors.Is(err, errRunRedis) &&
		!errors.Is(err, errBreakerOpen) && !errors.Is(err, errBreakerRedis) && !errors.As(err, &soft)
}

func tooMany(n int64, maxRetry int, last error) error {
	noun := "failures"
	if n == 1 {
		noun = "failure"
	}
	return Permanent(fmt.Errorf("%w (%d %s, max_retry %d): %w", ErrTooManyFailures, n, noun, maxRetry, last))
}

// redisPingTimeout bounds Start's check that Redis answers.
const redisPingTimeout = 5 * time.Second

func (r *runner) start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started {
		return errors.New("queues: Start: already started")
	}
	if r.stopping {
		return ErrStopped
	}
	pingCtx, cancel := context.WithTimeout(ctx, redisPingTimeout)
	err := r.c.rdb.Ping(pingCtx).Err()
	cancel()
	if err != nil {
		return fmt.Errorf("queues: Start: redis: %w", err)
	}
	// Settle the pause flags before any server dequeues: a cluster pool's
	// gate opens what it may; a pool without a gate (scope: process now,
	// cluster before) lifts any pause a gate left on its queues.
	for _, p := range r.c.pools().pools {
		var err error
		if g := r.gates[p.Name()]; g != nil {
			err = g.settle(ctx)
		} else {
			err = clearGatePauses(ctx, r.c.rdb, p)
		}
		if b := r.breaker[p.Name()]; err == nil && b != nil {
			err = b.sync(ctx)
		} else if err == nil {
			err = clearBreaker(ctx, r.c.rdb, r.c.ks, p)
		}
		if err != nil {
			return fmt.Errorf("pool %q: start: %w", p.Name(), err)
		}
	}
	gctx, stopGates := context.WithCancel(context.WithoutCancel(ctx))
	r.gateStop = stopGates
	for _, g := range r.gates {
		r.gateDone.Add(1)
		go func() {
			defer r.gateDone.Done()
			g.run(gctx)
		}()
	}
	for _, b := range r.breaker {
		r.gateDone.Go(func() { b.loop(gctx) })
	}
	r.gateDone.Go(func() { r.fences.loop(gctx) })
	r.gateDone.Go(func() { r.recov.loop(gctx) })
	r.gateDone.Go(func() { r.runLoop(gctx) })
	r.gateDone.Go(func() { r.adaptiveLoop(gctx) })
	r.drainCtx, r.drainStop = context.WithCancel(context.WithoutCancel(ctx))
	var started []*asynq.Server
	// abort stops what started and fails the start: the client is then
	// stopped for good.
	abort := func(err error) error {
		r.shutdownServers(started)
		r.drainStop()
		r.stopGates()
		r.stopping = true
		r.stopFlag.Store(true)
		close(r.done)
		return err
	}
	for _, p := range r.c.pools().pools {
		srv := r.servers[p.Name()]
		r.inflight[p.Name()] = new(atomic.Int64)
		if err := srv.Start(r.handler(p, r.inflight[p.Name()])); err != nil {
			return abort(fmt.Errorf("pool %q: start: %w", p.Name(), err))
		}
		started = append(started, srv...)
		r.logStarted(p, "pool started")
	}
	for _, p := range r.c.pools().pools {
		lane := r.lanes[p.Name()]
		if lane == nil {
			continue
		}
		r.laneInflight[p.Name()] = new(atomic.Int64)
		if err := lane.Start(r.handler(p, r.laneInflight[p.Name()])); err != nil {
			return abort(fmt.Errorf("pool %q: start its reserved lane: %w", p.Name(), err))
		}
		started = append(started, lane)
	}
	r.started = true
	return nil
}

func (r *runner) stop(ctx context.Context) error {
	r.mu.Lock()
	if !r.stopping {
		r.stopping = true
		r.stopFlag.Store(true)
		for _, g := range r.gates {
			g.stopWaiting()
		}
		if r.started {
			servers := make([]*asynq.Server, 0, len(r.servers)+len(r.lanes))
			for _, s := range r.servers {
				servers = append(servers, s...)
			}
			for _, s := range r.lanes {
				servers = append(servers, s)
			}
			go func() {
				r.log.Info("stopping pools", "shutdown_timeout", r.c.cfg.ShutdownTimeout.String())
				r.drainStop() // servers still finishing their jobs after a rebuild stop too
				r.shutdownServers(servers)
				r.drains.Wait()
				// Leases are renewed until every job has finished or gone
				// back to its queue.
				r.stopGates()
				r.log.Info("all pools stopped")
				close(r.done)
			}()
		} else {
			close(r.done)
		}
	}
	r.mu.Unlock()
	select {
	case <-r.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// logStarted logs a pool's settings as its server starts.
func (r *runner) logStarted(p *Pool, msg string) {
	r.log.Info(msg, "pool", p.Name(), "size", p.Size(), "max_size", p.MaxSize(), "scope", string(p.Scope()),
		"queues", p.Queues(), "order", string(p.cfg.QueueOrder), "poll_interval", p.cfg.PollInterval, "dequeue_loops", p.cfg.DequeueLoops, "job_log", string(p.cfg.JobLog))
}

func (r *runner) stopGates() {
	if r.gateStop != nil {
		r.gateStop()
		r.gateDone.Wait()
	}
}

func (r *runner) shutdownServers(servers []*asynq.Server) {
	// Stop every server first so no pool takes new work while another is
	// still draining, then drain them concurrently: the whole stop takes one
	// shutdown timeout, not one per pool.
	var wg sync.WaitGroup
	for _, s := range servers {
		wg.Go(s.Stop) // returns once the server's dequeue loop has seen it
	}
	wg.Wait()
	for _, s := range servers {
		wg.Go(s.Shutdown)
	}
	wg.Wait()
}

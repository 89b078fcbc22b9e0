package queues

import (
	"cmp"
	"fmt"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/lci-labs/compartment/priority"
)

// Scope says where a pool's size holds.
type Scope string

// Scopes of a pool's size.
const (
	// ScopeCluster caps the pool across every worker process connected to
	// the same Redis and namespace, through a gate in Redis (see
	// docs/CLUSTER.md). It is the default, in Go and in the config file.
	ScopeCluster Scope = "cluster"
	// ScopeProcess caps the pool per worker process (asynq's concurrency):
	// two processes run up to twice the size.
	ScopeProcess Scope = "process"
)

// QueueOrder says how a pool with tiers picks its next job.
type QueueOrder string

// Queue orders.
const (
	// QueueOrderStrict always takes the highest tier that has work; lower
	// tiers wait while higher ones have work. The default.
	QueueOrderStrict QueueOrder = "strict"
	// QueueOrderWeighted tries each tier's queue first with probability
	// proportional to its weight, so lower tiers are never starved but a
	// higher tier can be overtaken.
	QueueOrderWeighted QueueOrder = "weighted"
)

// JobLog says how a pool logs each job it runs: one line with the pool,
// tier, job, duration and outcome.
type JobLog string

// Job log levels.
const (
	JobLogInfo  JobLog = "info"
	JobLogDebug JobLog = "debug"
	JobLogOff   JobLog = "off"
)

// slowPoolTimeout: a pool whose jobs may run longer than this is a slow
// pool, whose jobs are logged at info by default; faster pools log theirs
// at debug, so a busy order pool does not flood the log.
const slowPoolTimeout = time.Minute

// Defaults and limits of Config and PoolConfig.
const (
	DefaultNamespace            = "compartment"
	DefaultShutdownTimeout      = 30 * time.Second
	DefaultPollInterval         = time.Second // asynq's TaskCheckInterval default
	DefaultJobTimeout           = 30 * time.Minute
	DefaultMaxRetry             = 25
	DefaultDelayedCheckInterval = 5 * time.Second // asynq's
	// DefaultDequeueLoops is one asynq server, so one dequeue loop, per
	// pool in each process.
	DefaultDequeueLoops = 1
	// NoRetry as PoolConfig.MaxRetry archives a job at its first failure.
	NoRetry = -1
	// MinPollInterval keeps an idle pool from spinning on Redis.
	MinPollInterval = 10 * time.Millisecond
)

var namePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// Config configures a Client: the pools, their tiers and, for a client that
// runs jobs, the handlers. Zero fields take the default their comment
// names. NewClient applies the defaults to a copy (WithDefaults) and
// validates it; the caller's Config is never changed.
type Config struct {
	// Namespace prefixes every queue name and every key of ours, so several
	// deployments (or tests) can share one Redis. Defaults to
	// "compartment".
	Namespace string
	// Tiers is the business's priority policy: the order of the tiers pools
	// serve and the default tier of a job enqueued without one. Required
	// when a pool has tiers.
	Tiers *priority.Policy
	// Pools are the worker partitions, each its own bulkhead and asynq
	// server. At least one is required.
	Pools []PoolConfig
	// Handlers runs the jobs. Required for Start; a client that only
	// enqueues leaves it nil. When set, every routed job type needs a
	// handler and every handler's job type must be routed.
	Handlers *Handlers
	// Middleware wraps each pool's handler, inside the pool's bulkhead,
	// outermost first: for metrics or tracing. Defaults to none.
	Middleware []Middleware
	// ShutdownTimeout bounds a graceful stop: jobs still running after it
	// are cancelled and go back to the head of their queue. Defaults to
	// 30s.
	ShutdownTimeout time.Duration
	// RecoverAfter is how long the lease of a running job (renewed by its
	// worker process every 5 s) must go unrenewed before another process
	// puts the job back at the head of its queue, without using up a
	// retry; should the process come back, it finishes nothing of the job
	// (ErrFenced). At least MinRecoverAfter; defaults to
	// DefaultRecoverAfter. docs/RELIABILITY.md.
	RecoverAfter time.Duration
	// OnRecover is called when this process put back jobs of a worker
	// process that stopped answering (one call per pool and process). Like
	// OnBreakerChange it must be quick and must not block. Defaults to
	// none.
	OnRecover func(Recovery)
	// Logger receives the engine's and asynq's logs. Defaults to
	// slog.Default().
	Logger *slog.Logger
	// RetryDelay says how long a failed job waits before its n-th retry.
	// Defaults to asynq's backoff (n^4 + 15 s + jitter); a job recovered
	// after a worker crash waits RetryAfterCrash whatever this says.
	RetryDelay func(n int, err error) time.Duration
	// DelayedCheckInterval is how often due retries and scheduled jobs move
	// back to their queue: the floor of any retry delay. Defaults to 5s.
	DelayedCheckInterval time.Duration
	// Clock is this process's clock, used only for local durations (how
	// long jobs waited for a slot). Everything that processes must agree on,
	// the expiry of slots and waits, is timed by Redis's clock, so a process
	// whose clock is off cannot break a pool's cap; tests skew Clock to show
	// it. Defaults to time.Now.
	Clock func() time.Time
	// Observer is told when each job starts and ends (package metrics
	// exports that to Prometheus). Defaults to none.
	Observer Observer
	// OnBreakerChange is called on every change of state of a pool's
	// circuit breaker, with the change (see BreakerChange for which
	// process sees which). It is called on the goroutine of the call that
	// made the change (a job's, the breaker's tick, ForceBreaker's
	// caller), never while the engine holds a lock; it must be quick, must
	// not block and must be safe for concurrent use. Changes made by
	// different goroutines may reach it out of order (a probe's close
	// before the tick's half-open, on a busy machine): BreakerChange.At,
	// Redis's clock, orders them. It never changes what happens. Defaults
	// to none.
	OnBreakerChange func(BreakerChange)
	// TracerProvider makes the engine's OpenTelemetry spans: one for each
	// job a Client enqueues (kind producer) and one for each run of a job
	// (kind consumer), the child of the enqueue's span even in another
	// process; see docs/TRACING.md. Defaults to the global provider
	// (otel.GetTracerProvider), which makes no spans until the program
	// installs an SDK. A no-op provider (go.opentelemetry.io/otel/trace/noop)
	// turns the engine's tracing off altogether: no spans, no headers.
	TracerProvider trace.TracerProvider
	// Propagator writes a job's trace context into its headers at enqueue
	// and reads it back at its run. Defaults to W3C Trace Context
	// (propagation.TraceContext), whatever the global propagator is: the
	// engine is at both ends, so nothing else needs to read them.
	Propagator propagation.TextMapPropagator
	// Dependencies are what the pools' jobs draw on beside their slots (a
	// database's connections, an API's tokens), each with the capacity the
	// workers may hold of it at once; a pool says what one of its jobs
	// uses (PoolConfig.Uses) and the engine checks that the pools fit (see
	// docs/DEPENDENCIES.md). Defaults to none.
	Dependencies []Dependency
	// AllowOverbooking lets the pools claim more of a dependency than its
	// capacity: the budget check at load, reload and resize is skipped.
	// Jobs then wait for the dependency (DependencyHandle.Acquire) instead
	// of being refused a slot. Defaults to false.
	AllowOverbooking bool
}

// Middleware wraps a pool's handler.
type Middleware func(pool *Pool, next asynq.Handler) asynq.Handler

// PoolConfig describes one pool: a bulkhead with its own asynq server.
type PoolConfig struct {
	// Name identifies the pool in logs, queue names and errors. Required;
	// matches ^[a-z0-9][a-z0-9_-]{0,62}$.
	Name string `json:"name"`
	// Size is the most jobs of this pool that run at once: across every
	// worker process with ScopeCluster (the default), per process with
	// ScopeProcess. Required; at least 1. An operator may change a
	// cluster-scoped pool's size at runtime (Client.Resize), up to MaxSize.
	Size int `json:"size"`
	// MaxSize is the most a cluster-scoped pool may be resized to at
	// runtime (Client.Resize). Each worker process runs up to MaxSize of
	// the pool's jobs at once (its bulkhead), and the cluster-wide gate
	// holds them all to the pool's size in effect. A pool without
	// steering or a start rate also holds up to MaxSize/2 more, taken from
	// its queues and waiting for a slot (its look-ahead: asynq's
	// concurrency is MaxSize plus that; see docs/CLUSTER.md). A MaxSize
	// above Size costs no idle goroutine (asynq starts one per job), but a
	// process may take up to MaxSize jobs (plus its look-ahead) from the
	// queues, which then wait for a slot, and a program that gives each pool a share of
	// another resource sizes it by MaxSize (Concurrency). Defaults to
	// Size; at least Size; only for ScopeCluster.
	MaxSize int `json:"max_size,omitempty"`
	// JobTypes are the job types routed to this pool. Each job type belongs
	// to exactly one pool. Required.
	JobTypes []string `json:"job_types"`
	// Tiers are the priority tiers this pool serves, each its own queue.
	// Their order comes from Config.Tiers, not from this list, and they
	// must include its default tier. Nil for a pool with a single queue; an
	// empty non-nil list is an error.
	Tiers []string `json:"tiers,omitempty"`
	// QueueOrder is how the pool picks among its tiers. Defaults to
	// QueueOrderStrict.
	QueueOrder QueueOrder `json:"queue_order"`
	// Weights gives each tier its weight under QueueOrderWeighted; every
	// tier needs one, each at least 1. Not allowed with QueueOrderStrict.
	Weights map[string]int `json:"weights,omitempty"`
	// PollInterval is how long an idle pool waits before looking for work
	// again (asynq's TaskCheckInterval; the actual wait is jittered between
	// half and one and a half times it). Defaults to 1s; at least 10ms.
	PollInterval time.Duration `json:"poll_interval"`
	// DequeueLoops is how many asynq servers run the pool in each worker
	// process, each with its own dequeue loop; the pool's concurrency in
	// the process (Concurrency) is split among them as evenly as it goes,
	// and the pool's bulkhead, size and tiers are shared, so the pool
	// runs no more jobs than with one. One asynq server takes jobs one
	// dequeue at a time (about one round trip each), which caps a pool of
	// very short jobs near one server's rate whatever its size; more loops
	// take jobs in parallel. Each loop costs what an asynq server costs
	// an idle pool (its heartbeat and polls). Defaults to 1; at most the
	// pool's concurrency.
	DequeueLoops int `json:"dequeue_loops,omitempty"`
	// JobTimeout is how long one job may take, its wait for a slot
	// included. The handler's context ends a little earlier (a tenth of
	// the time left when it starts, 0.1 to 5 s), so that its failure is
	// counted against MaxRetry before asynq's deadline. asynq stores whole
	// seconds, so it must be a whole number of seconds. Defaults to 30m.
	JobTimeout time.Duration `json:"job_timeout"`
	// Scope says where Size holds. Defaults to ScopeCluster.
	Scope Scope `json:"scope"`
	// JobLog is the level of the one log line per job (pool, tier, job,
	// duration, outcome), or JobLogOff. Defaults to JobLogInfo for a pool
	// whose JobTimeout is over a minute (slow jobs, such as reports) and to
	// JobLogDebug otherwise.
	JobLog JobLog `json:"job_log"`
	// MaxRetry is how many times a failed job is retried before it is
	// archived; NoRetry archives it at its first failure. A worker crash
	// while the job runs does not count (up to CrashRetries crashes).
	// Defaults to 25.
	MaxRetry int `json:"max_retry"`

	// The door: what may enter the pool (see docs/DOOR.md).

	// MaxBacklog bounds the pool's backlog: its jobs pending, scheduled or
	// waiting for a retry, in all of its tiers. An enqueue that would pass
	// it is refused (a *BacklogError). Defaults to 0: unbounded.
	MaxBacklog int `json:"max_backlog,omitempty"`
	// TierLimits gives tiers a lower limit on the pool's backlog: a job of
	// the tier is admitted only while the pool's backlog (all tiers) stays
	// within the tier's limit, so that when the pool fills up, lower tiers
	// are refused first. Tiers without one use MaxBacklog. Needs
	// MaxBacklog; each limit is at least 1 and at most MaxBacklog.
	TierLimits map[string]int `json:"tier_limits,omitempty"`
	// BacklogWait makes an enqueue refused for the backlog wait up to this
	// long for room, first come first served among the waiting requests
	// that fit, before it is refused. Defaults to 0: refused at once. At
	// most MaxBacklogWait; needs MaxBacklog.
	BacklogWait time.Duration `json:"backlog_wait,omitempty"`
	// EnqueueRate limits the jobs enqueued into the pool, by every producer
	// on the Redis together. Defaults to none.
	EnqueueRate *Rate `json:"enqueue_rate,omitempty"`
	// EnqueueRatePerKey limits the jobs enqueued into the pool per caller
	// key (EnqueueOptions.RateKey: a requester, a tenant), each key on its
	// own. Jobs without a key are not limited by it. Defaults to none.
	EnqueueRatePerKey *Rate `json:"enqueue_rate_per_key,omitempty"`
	// JobTypeRates limits the jobs of one job type enqueued, per job type
	// of the pool. Defaults to none.
	JobTypeRates map[string]Rate `json:"job_type_rates,omitempty"`
	// StartRate limits how many of the pool's jobs start, across every
	// worker process: no job is taken from its queue faster than this (the
	// gate keeps the queues paused in between), so none is put back. Needs
	// ScopeCluster. Defaults to none.
	StartRate *Rate `json:"start_rate,omitempty"`

	// Breaker is the pool's circuit breaker: when the pool's jobs keep
	// failing (its database or service is down), no worker process takes
	// its jobs until probes show the dependency is back; the jobs wait in
	// their queues without using up retries (see docs/BREAKER.md).
	// Defaults to none.
	Breaker *BreakerConfig `json:"breaker,omitempty"`

	// Steering: how the cluster-wide gate shares the pool's slots among
	// its tiers (see docs/STEERING.md). Both need ScopeCluster.

	// Reserved keeps slots for a tier and the tiers above it: a job of a
	// lower tier never takes one, so a job of the tier arriving into a
	// pool busy with lower tiers starts at the next poll. Each at least 1;
	// together below Size; not for the pool's lowest tier (a reservation
	// for it would cover every job). Defaults to none.
	Reserved map[string]int `json:"reserved,omitempty"`
	// MaxWait is a tier's maximum wait: once its oldest pending job has
	// waited longer, that job is served before every higher tier (aging),
	// so the tier makes progress under a steady stream of higher-tier
	// work. Needs QueueOrderStrict; not for the pool's highest tier; each
	// at least MinMaxWait. Defaults to none: strict order.
	MaxWait map[string]time.Duration `json:"max_wait,omitempty"`

	// Dependencies (see docs/DEPENDENCIES.md).

	// Uses says how much of each dependency (Config.Dependencies) one of
	// the pool's jobs holds: a pool claims its size times that, and the
	// pools' claims must fit each dependency's capacity. Each at least 1;
	// needs ScopeCluster. Defaults to none.
	Uses map[string]int `json:"uses,omitempty"`
	// Adaptive lets the pool's size in effect move between Adaptive.Min
	// and MaxSize with the latency of its jobs (and the time they wait for
	// their dependencies): down when they slow against their recent
	// baseline, back up when they recover. Needs ScopeCluster. Defaults to
	// none: the size holds until an operator's resize.
	Adaptive *AdaptiveConfig `json:"adaptive,omitempty"`
}

// ConfigError lists every problem found in a configuration.
type ConfigError struct {
	// Source names where the configuration came from (a file), or is empty
	// for a Config built in Go.
	Source   string
	Problems []string
}

func (e *ConfigError) Error() string {
	noun := "problems"
	if len(e.Problems) == 1 {
		noun = "problem"
	}
	where := "config"
	if e.Source != "" {
		where += " " + e.Source
	}
	return fmt.Sprintf("%s: %d %s:\n  - %s", where, len(e.Problems), noun, strings.Join(e.Problems, "\n  - "))
}

// WithDefaults returns a copy of c with every zero field that has a default
// filled in. c is not changed.
func (c Config) WithDefaults() Config {
	c.Namespace = cmp.Or(c.Namespace, DefaultNamespace)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, DefaultShutdownTimeout)
	c.RecoverAfter = cmp.Or(c.RecoverAfter, DefaultRecoverAfter)
	c.DelayedCheckInterval = cmp.Or(c.DelayedCheckInterval, DefaultDelayedCheckInterval)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	c.Middleware = slices.Clone(c.Middleware)
	c.Dependencies = slices.Clone(c.Dependencies)
	pools := make([]PoolConfig, len(c.Pools))
	for i, p := range c.Pools {
		pools[i] = p.WithDefaults()
	}
	c.Pools = pools
	return c
}

// WithDefaults returns a copy of p with its defaults filled in.
func (p PoolConfig) WithDefaults() PoolConfig {
	p.Scope = cmp.Or(p.Scope, ScopeCluster)
	if p.Scope == ScopeCluster {
		p.MaxSize = cmp.Or(p.MaxSize, p.Size)
	}
	p.QueueOrder = cmp.Or(p.QueueOrder, QueueOrderStrict)
	p.PollInterval = cmp.Or(p.PollInterval, DefaultPollInterval)
	p.DequeueLoops = cmp.Or(p.DequeueLoops, DefaultDequeueLoops)
	p.JobTimeout = cmp.Or(p.JobTimeout, DefaultJobTimeout)
	p.MaxRetry = cmp.Or(p.MaxRetry, DefaultMaxRetry)
	if p.JobLog == "" {
		p.JobLog = JobLogDebug
		if p.JobTimeout > slowPoolTimeout {
			p.JobLog = JobLogInfo
		}
	}
	p.JobTypes = slices.Clone(p.JobTypes)
	if p.Tiers != nil {
		p.Tiers = slices.Clone(p.Tiers)
	}
	p.Weights = maps.Clone(p.Weights)
	p.TierLimits = maps.Clone(p.TierLimits)
	p.Reserved = maps.Clone(p.Reserved)
	p.MaxWait = maps.Clone(p.MaxWait)
	p.EnqueueRate = p.EnqueueRate.withDefaults()
	p.EnqueueRatePerKey = p.EnqueueRatePerKey.withDefaults()
	p.StartRate = p.StartRate.withDefaults()
	p.Breaker = p.Breaker.withDefaults()
	p.Uses = maps.Clone(p.Uses)
	p.Adaptive = p.Adaptive.withDefaults()
	if p.JobTypeRates != nil {
		rates := make(map[string]Rate, len(p.JobTypeRates))
		for jt, r := range p.JobTypeRates {
			rates[jt] = *r.withDefaults()
		}
		p.JobTypeRates = rates
	}
	return p
}

// concurrency is how many of the pool's jobs one worker process runs at
// once (defaults filled): its asynq concurrency and bulkhead size. A
// cluster-scoped pool may be resized up to MaxSize, so each process is
// ready for that many; the gate holds them to the size in effect.
func (p PoolConfig) concurrency() int {
	if p.Scope == ScopeCluster {
		return max(p.MaxSize, p.Size)
	}
	return p.Size
}

// lookAhead is how many of the pool's jobs one worker process may hold
// beyond those it runs (defaults filled): taken from the queue, waiting
// for a cluster-wide slot, so that a slot freed anywhere is handed to one
// of them at once (see docs/CLUSTER.md). Half the process's concurrency
// (rounded down: none for a pool of 1, whose jobs then start in the order
// they were taken) for a cluster-scoped pool without steering or a start rate,
// whose gate keeps the queues open while the pool is full (up to a bound
// on the jobs waiting, lua/gate_lib.lua); none otherwise, since those
// pause as soon as the pool is full.
func (p PoolConfig) lookAhead() int {
	if p.Scope != ScopeCluster || p.pausesWhenFull() {
		return 0
	}
	return p.concurrency() / 2
}

// pausesWhenFull says whether the pool's gate must see every free slot at
// once: with steering (reservations, maximum waits) or a start rate, it
// pauses the queues as soon as the pool is full, holds no jobs ahead of a
// slot (lookAhead) and frees a slot without delay (the gate's
// releaseLater); see lua/gate_lib.lua, settle.
func (p PoolConfig) pausesWhenFull() bool {
	return p.StartRate != nil || len(p.Reserved) > 0 || len(p.MaxWait) > 0
}

// Concurrency is how many of the pool's jobs one worker process runs at
// once, defaults filled: MaxSize for a cluster-scoped pool, Size for a
// process-scoped one. A program that gives each pool a share of another
// resource (database connections) sizes the share by it.
func (p PoolConfig) Concurrency() int { return p.WithDefaults().concurrency() }

// retries returns asynq's count of real retries for the pool (defaults
// filled): NoRetry is zero.
func (p PoolConfig) retries() int { return max(0, p.MaxRetry) }

// Validate fills the defaults on a copy of c and checks it, returning a
// *ConfigError that lists every problem, or nil.
func (c Config) Validate() error {
	if p := c.WithDefaults().Problems(); len(p) > 0 {
		return &ConfigError{Problems: p}
	}
	return nil
}

// Problems returns every problem of c, whose defaults must be filled
// (WithDefaults). Programs that validate more than the engine's part of a
// larger configuration add these to their own, so a user sees all of them
// at once.
func (c Config) Problems() []string {
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }

	if !namePattern.MatchString(c.Namespace) {
		add("namespace: %q must match %s", c.Namespace, namePattern)
	}
	if c.RecoverAfter < MinRecoverAfter {
		add("recover_after: must be at least %s (asynq renews a running job's lease every 5s), got %s", MinRecoverAfter, c.RecoverAfter)
	}
	if c.ShutdownTimeout < 0 {
		add("shutdown_timeout: must be >= 0, got %s", c.ShutdownTimeout)
	}
	if c.DelayedCheckInterval < 0 {
		add("delayed_check_interval: must be >= 0, got %s", c.DelayedCheckInterval)
	}
	if len(c.Pools) == 0 {
		add("pools: at least one pool is required")
	}
	seenPool := map[string]bool{}
	routedTo := map[string]string{} // job type -> pool name
	routedAt := map[string]int{}    // job type -> pool index
	for i, p := range c.Pools {
		out = append(out, p.problems(i, c.Tiers)...)
		if p.Name != "" && seenPool[p.Name] {
			add("pool %q: duplicate pool name", p.Name)
		}
		seenPool[p.Name] = true
		for _, jt := range p.JobTypes {
			if strings.TrimSpace(jt) == "" {
				continue // reported by problems
			}
			if other, ok := routedTo[jt]; ok {
				if routedAt[jt] == i {
					add("pool %q: job type %q is listed twice", p.Name, jt)
				} else {
					add("job type %q is routed to two pools: %q and %q", jt, other, p.Name)
				}
				continue
			}
			routedTo[jt] = p.Name
			routedAt[jt] = i
		}
	}
	out = append(out, c.dependencyProblems()...)
	if c.Handlers != nil {
		have := map[string]bool{}
		for _, jt := range c.Handlers.JobTypes() {
			have[jt] = true
			if _, ok := routedTo[jt]; !ok {
				add("job type %q has a handler but is routed to no pool", jt)
			}
		}
		for _, jt := range slices.Sorted(maps.Keys(routedTo)) {
			if !have[jt] {
				add("pool %q: job type %q has no handler (handlers: %q)", routedTo[jt], jt, c.Handlers.JobTypes())
			}
		}
	}
	return out
}

// problems checks one pool on its own (defaults filled); index i names a
// pool without a name.
func (p PoolConfig) problems(i int, policy *priority.Policy) []string {
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	label := fmt.Sprintf("pool %q", p.Name)
	if p.Name == "" {
		label = fmt.Sprintf("pools[%d]", i)
		add("%s: name is required", label)
	} else if !namePattern.MatchString(p.Name) {
		add("%s: name must match %s", label, namePattern)
	}
	if p.Size < 1 {
		add("%s: size must be >= 1, got %d", label, p.Size)
	}
	if len(p.JobTypes) == 0 {
		add("%s: job_types must list at least one job type", label)
	}
	for _, jt := range p.JobTypes {
		if strings.TrimSpace(jt) == "" {
			add("%s: job_types: an empty job type", label)
		}
	}
	if p.PollInterval < MinPollInterval {
		add("%s: poll_interval must be >= %s, got %s", label, MinPollInterval, p.PollInterval)
	}
	if c := p.concurrency(); p.DequeueLoops < 1 || (p.Size >= 1 && p.DequeueLoops > c) {
		add("%s: dequeue_loops must be from 1 to the pool's concurrency in a process (%d: max_size, or size for scope: process), got %d", label, c, p.DequeueLoops)
	}
	switch {
	case p.JobTimeout < time.Second:
		add("%s: job_timeout must be at least 1s, got %s (asynq stores whole seconds and would silently use its 30m default)", label, p.JobTimeout)
	case p.JobTimeout%time.Second != 0:
		add("%s: job_timeout must be a whole number of seconds, got %s (asynq stores whole seconds)", label, p.JobTimeout)
	}
	if p.MaxRetry < NoRetry {
		add("%s: max_retry must be >= 0, or NoRetry (-1), got %d", label, p.MaxRetry)
	}
	switch p.JobLog {
	case JobLogInfo, JobLogDebug, JobLogOff:
	default:
		add("%s: job_log must be %q, %q or %q, got %q", label, JobLogInfo, JobLogDebug, JobLogOff, p.JobLog)
	}
	if p.Scope != ScopeCluster && p.Scope != ScopeProcess {
		add("%s: scope must be %q or %q, got %q", label, ScopeCluster, ScopeProcess, p.Scope)
	}
	switch {
	case p.Scope == ScopeProcess && p.MaxSize != 0:
		add("%s: max_size is only for scope: cluster (a process-scoped pool cannot be resized at runtime)", label)
	case p.Scope == ScopeCluster && p.MaxSize < p.Size:
		add("%s: max_size must be >= size (%d), got %d", label, p.Size, p.MaxSize)
	}
	switch p.QueueOrder {
	case QueueOrderStrict:
		if len(p.Weights) > 0 {
			add("%s: weights are only used with queue_order: weighted", label)
		}
	case QueueOrderWeighted:
		if p.Tiers == nil {
			add("%s: queue_order: weighted needs tiers", label)
		}
	default:
		add("%s: queue_order must be %q or %q, got %q", label, QueueOrderStrict, QueueOrderWeighted, p.QueueOrder)
	}
	out = append(out, p.doorProblems(label, policy)...)
	out = append(out, p.Breaker.problems(label)...)
	out = append(out, p.steeringProblems(label, policy)...)
	out = append(out, p.adaptiveProblems(label)...)
	if p.Tiers == nil {
		return out
	}
	if len(p.Tiers) == 0 {
		add("%s: tiers: the list is empty (omit tiers for a pool with a single queue)", label)
		return out
	}
	if policy == nil {
		add("%s: tiers need a priority policy (priorities)", label)
		return out
	}
	seen := map[string]bool{}
	for _, t := range p.Tiers {
		if seen[t] {
			add("%s: tier %q is listed twice", label, t)
		}
		seen[t] = true
		if !policy.Has(t) {
			add("%s: unknown tier %q (the priorities define %q)", label, t, policy.Tiers())
		}
	}
	if !seen[policy.Default()] {
		add("%s: tiers must include the default tier %q, where jobs without a tier go", label, policy.Default())
	}
	if p.QueueOrder == QueueOrderWeighted {
		for _, t := range p.Tiers {
			if w, ok := p.Weights[t]; !ok {
				add("%s: weights: tier %q needs a weight", label, t)
			} else if w < 1 {
				add("%s: weights: tier %q must be >= 1, got %d", label, t, w)
			}
		}
		for _, t := range slices.Sorted(maps.Keys(p.Weights)) {
			if !seen[t] {
				add("%s: weights: tier %q is not one of the pool's tiers", label, t)
			}
		}
	}
	return out
}

// Package demo runs the month-end story in one process, twice on the same
// load: first BEFORE, as in the story (one shared pool: one asynq server
// for every queue, and every job taking database connections freely from
// the same pool), where the month-end's reports take every slot and
// connection and orders wait and time out; then AFTER, with the walls
// (the runner's pools, each drawing connections only inside its share),
// where they do not. A third act, SLOWDOWN, follows on the same walls:
// the report database becomes 5x slower in the middle of a month-end, the
// batch pool's adaptive limit falls, and it climbs back once the database
// recovers (slowdown.go). Each phase has a live view counted inside the
// job handlers, and the closing summary sets them side by side.
package demo

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/reports"
	"github.com/lci-labs/compartment/internal/web"
	"github.com/lci-labs/compartment/metrics"
	"github.com/lci-labs/compartment/queues"
)

// Defaults of Options.
const (
	DefaultOrdersPerSecond   = 40
	DefaultSearchesPerSecond = 20
	DefaultWarmup            = 3 * time.Second
	DefaultRefresh           = 500 * time.Millisecond
	DefaultOrderTimeout      = 2 * time.Second
	DefaultOutageMin         = 20 * time.Second
	DefaultSlowFor           = 15 * time.Second
	// DefaultPeriods is how many months, the last full ones of the seeded
	// data, the month-end runs for when Options.Periods is empty.
	DefaultPeriods = 4
)

// What the BEFORE phase must show for the run to count: the outage
// reproduced when order p99 during the month-end is at least
// OutageP99Ratio times its p99 before, or when at least OutageTimeouts
// orders enqueued during the month-end timed out.
const (
	OutageP99Ratio = 5.0
	OutageTimeouts = 1
)

// NotCounted is PoolResult.MaxConns for a row whose connections are not
// counted on their own (the shared pool as a whole).
const NotCounted = -1

// Options tune a demo run.
type Options struct {
	// Config is the loaded config (normally configs/demo.yaml).
	Config *app.Config
	// Plan is the month-end plan file.
	Plan string
	// Periods are the months to run the plan for. Defaults to the last
	// DefaultPeriods full months of the seeded data.
	Periods []string
	// OrdersPerSecond and SearchesPerSecond are the steady traffic of
	// every phase and of the third act. Default to 40 and 20.
	OrdersPerSecond, SearchesPerSecond int
	// Warmup is how long traffic runs before each phase's month-end, and
	// in the third act, at least, before the database slows. Defaults to
	// 3s.
	Warmup time.Duration
	// OrderTimeout is how long an order request waits: an order job not
	// done this long after it was enqueued fails as timed out
	// (ErrOrderTimedOut). Defaults to 2s.
	OrderTimeout time.Duration
	// SkipOutage skips the BEFORE phase (the outage). Defaults to false.
	SkipOutage bool
	// SkipSlowdown skips the third act (the database slows). Defaults to
	// false; the act needs the report pool to be adaptive
	// (PoolConfig.Adaptive), and Run refuses a config where it is not
	// unless the act is skipped.
	SkipSlowdown bool
	// SlowFor is how long the third act keeps the report database slow at
	// least: it recovers once this has passed and the batch pool's limit
	// has fallen (or, if it does not fall, after SlowdownFallLimit).
	// Defaults to DefaultSlowFor.
	SlowFor time.Duration
	// OutageMin is how long the BEFORE phase lasts at least: once its
	// reports are done, the traffic goes on until then, so that a person
	// who opened the dashboard sees the outage and its end. Defaults to
	// DefaultOutageMin; negative: no minimum.
	OutageMin time.Duration
	// Out receives the live views and the summary. Defaults to discarding
	// them.
	Out io.Writer
	// Terminal redraws the live view in place.
	Terminal bool
	// Logger receives the worker's logs. Defaults to discarding them.
	Logger *slog.Logger
	// Refresh is the live view's refresh interval on a terminal; plain
	// lines come every fourth refresh. Defaults to 500ms.
	Refresh time.Duration
}

func (o Options) withDefaults() Options {
	o.OrdersPerSecond = cmp.Or(o.OrdersPerSecond, DefaultOrdersPerSecond)
	o.SearchesPerSecond = cmp.Or(o.SearchesPerSecond, DefaultSearchesPerSecond)
	o.Warmup = cmp.Or(o.Warmup, DefaultWarmup)
	o.Refresh = cmp.Or(o.Refresh, DefaultRefresh)
	o.OrderTimeout = cmp.Or(o.OrderTimeout, DefaultOrderTimeout)
	o.OutageMin = cmp.Or(o.OutageMin, DefaultOutageMin)
	o.SlowFor = cmp.Or(o.SlowFor, DefaultSlowFor)
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	return o
}

// ReportStart is one report starting, in order.
type ReportStart struct {
	Report, Period, Tier string
	At                   time.Duration // since the month-end began
}

// PoolResult is what one pool did, or in the shared pool, one kind of job.
type PoolResult struct {
	Name string
	// Size is the pool's size; for a kind of job in the shared pool, the
	// shared pool's size (any kind may take all of it).
	Size          int
	MaxConcurrent int // most jobs at once, observed inside the handlers
	MaxConns      int // most database connections held at once, or NotCounted
	Jobs          int
}

// Exceeded reports whether the pool ran more jobs, or held more
// connections, than its size.
func (p PoolResult) Exceeded() bool { return p.MaxConcurrent > p.Size || p.MaxConns > p.Size }

// Latency summarises order job latencies.
type Latency struct {
	N             int
	P50, P99, Max time.Duration
}

// Phase is what one phase did.
type Phase struct {
	Name     string // BEFORE or AFTER
	Setup    string // in a few words
	Describe string // in a sentence
	// Pools: the runner's pools; in the shared phase, the shared pool
	// first, then each kind of job named by the pool it gets with walls.
	Pools []PoolResult
	// Orders enqueued before the month-end and during it. Latency is from
	// enqueue to the end of the order's job, timed-out ones included.
	OrderBefore, OrderDuring                 Orders
	ReportsTotal, ReportsDone, ReportsFailed int
	Failures                                 []string
	MonthEndTook, Enqueue                    time.Duration
	// Runs says, per period, how its month-end run ended (walls only).
	Runs []string
}

// P99Ratio is order p99 during the month-end over order p99 before it, or 0
// when either has no orders.
func (p Phase) P99Ratio() float64 {
	if p.OrderBefore.N == 0 || p.OrderDuring.N == 0 {
		return 0
	}
	return float64(p.OrderDuring.P99) / float64(max(p.OrderBefore.P99, time.Microsecond))
}

// Summary is the outcome of a run.
type Summary struct {
	// Outage is the BEFORE phase, nil when it was skipped.
	Outage *Phase
	// Walls is the AFTER phase.
	Walls Phase
	// Slowdown is the third act, nil when it was skipped.
	Slowdown *SlowdownAct
	// Starts are the AFTER phase's report starts, in order; Inversions
	// counts the starts that overtook a higher tier.
	Starts     []ReportStart
	Inversions int
	// Tiers are the report tiers, highest first.
	Tiers []string
	// OrderTimeout is how long an order request waited in both phases.
	OrderTimeout time.Duration
}

// OutageReproduced reports whether the BEFORE phase ran and showed the
// outage (see OutageP99Ratio and OutageTimeouts).
func (s Summary) OutageReproduced() bool {
	return s.Outage != nil && (s.Outage.P99Ratio() >= OutageP99Ratio || s.Outage.OrderDuring.TimedOut >= OutageTimeouts)
}

// WallsHeld reports whether the AFTER phase showed what it should: every
// report completed, no pool above its size, no tier overtaken.
func (s Summary) WallsHeld() bool {
	for _, p := range s.Walls.Pools {
		if p.Exceeded() {
			return false
		}
	}
	return s.Walls.ReportsFailed == 0 && s.Walls.ReportsDone == s.Walls.ReportsTotal && s.Inversions == 0
}

// OK reports whether the run showed what it should: the walls held and,
// unless they were skipped, the BEFORE phase reproduced the outage and the
// third act's limit did its part (SlowdownAct.Held).
func (s Summary) OK() bool {
	return s.WallsHeld() && (s.Outage == nil || s.OutageReproduced()) && (s.Slowdown == nil || s.Slowdown.Held())
}

func summarize(ds []time.Duration) Latency {
	if len(ds) == 0 {
		return Latency{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(p float64) time.Duration { return s[int(p*float64(len(s)-1))] }
	return Latency{N: len(s), P50: at(0.5), P99: at(0.99), Max: s[len(s)-1]}
}

// Run runs the story, BEFORE then AFTER (or AFTER only), and returns its
// summary.
func Run(ctx context.Context, o Options) (Summary, error) {
	o = o.withDefaults()
	cfg := o.Config
	if cfg.Policy == nil {
		return Summary{}, errors.New("the month-end needs the report tiers, and the config names no priorities file")
	}
	if len(o.Periods) == 0 {
		until, err := time.Parse("2006-01", cfg.Database.SeedUntil)
		if err != nil {
			return Summary{}, err
		}
		for i := min(DefaultPeriods, cfg.Database.SeedMonths); i >= 1; i-- {
			o.Periods = append(o.Periods, until.AddDate(0, -i, 0).Format("2006-01"))
		}
	}
	var plans []*reports.Plan
	for _, period := range o.Periods {
		p, err := reports.LoadPlan(o.Plan, period, cfg.Catalog, cfg.Policy)
		if err != nil {
			return Summary{}, err
		}
		plans = append(plans, p)
	}

	var act *slowdownSetup
	if !o.SkipSlowdown {
		var err error
		if act, err = slowdownFor(cfg); err != nil {
			return Summary{}, err
		}
	}

	// The handlers count their jobs in the recorder of the part that runs:
	// AFTER's, then the third act's.
	rec := newRecorder(o.OrderTimeout, tierOfQueue)
	var current atomic.Pointer[recorder]
	current.Store(rec)
	redisDesc := "Redis at " + cfg.Redis.Addr()
	if cfg.Redis.Embedded {
		redisDesc = "embedded Redis"
	}
	fmt.Fprintf(o.Out, "starting: %s, %s, %d database connections; month-end of %d reports for %v\n",
		redisDesc, cfg.Database.Describe(), cfg.Database.MaxConnections, len(monthEnd(cfg, plans)), o.Periods)
	// With http.listen set, metrics and the dashboard watch the walls.
	var m *metrics.Metrics
	var hist *web.History
	var observer queues.Observer
	if cfg.HTTP.Listen != "" {
		m = metrics.New()
		// The timeline samples every second: the demo lasts about one
		// minute, both phases on it.
		hist = &web.History{Next: m, Every: time.Second}
		observer = hist
	}
	st := &stage{}
	w, err := app.NewWorker(ctx, cfg, app.WorkerOptions{Logger: o.Logger, Observer: observer, Middleware: []queues.Middleware{
		func(p *queues.Pool, next asynq.Handler) asynq.Handler {
			name := []string{p.Name()}
			rows := func(string) []string { return name }
			return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
				return current.Load().wrap(rows, next).ProcessTask(ctx, t)
			})
		},
	}})
	if err != nil {
		return Summary{}, err
	}
	defer w.Close()
	if m != nil {
		srv, err := web.StartForWorker(ctx, w, m, hist, st.get, o.Logger)
		if err != nil {
			return Summary{}, fmt.Errorf("%w (pick another port with -http HOST:PORT, or remove http.listen from the config)", err)
		}
		defer srv.Stop(context.Background())
		web.Announce(o.Logger, srv.Listening(), cfg.HTTP.Token != "")
		fmt.Fprintf(o.Out, "dashboard: %s (live while the demo runs; Prometheus metrics at %smetrics)\n", srv.URL(), srv.URL())
	}
	fmt.Fprintf(o.Out, "each phase: order traffic %d/s and search traffic %d/s, a %s warm-up, then the month-end; an order request times out after %s\n",
		o.OrdersPerSecond, o.SearchesPerSecond, o.Warmup, o.OrderTimeout)
	if act != nil {
		fmt.Fprintf(o.Out, "then SLOWDOWN: the same traffic and month-end on the walls; the report database becomes %gx slower for %s or more, then recovers\n",
			SlowdownFactor, o.SlowFor)
	}
	fmt.Fprint(o.Out, legend(o.Refresh, o.OrderTimeout))
	if act != nil {
		fmt.Fprint(o.Out, limitLegend)
	}

	s := Summary{Tiers: cfg.Policy.Tiers(), OrderTimeout: o.OrderTimeout}
	if !o.SkipOutage {
		out, err := runOutage(ctx, o, w.Redis.Client, plans, st)
		if err != nil {
			return Summary{}, fmt.Errorf("the BEFORE phase: %w", err)
		}
		s.Outage = &out
	}
	if s.Walls, err = runWalls(ctx, o, w, rec, plans, st, act != nil); err != nil {
		return Summary{}, fmt.Errorf("the AFTER phase: %w", err)
	}
	s.Starts = rec.reportStarts()
	s.Inversions = inversions(s.Starts, s.Tiers)
	if act != nil {
		actRec := newRecorder(o.OrderTimeout, nil)
		actRec.watch = act.pool
		current.Store(actRec)
		a, err := runSlowdown(ctx, o, w, actRec, plans, st, act)
		if err != nil {
			return Summary{}, fmt.Errorf("the SLOWDOWN act: %w", err)
		}
		s.Slowdown = &a
		if err := w.Stop(ctx); err != nil {
			return Summary{}, err
		}
	}
	return s, nil
}

// inversions counts report starts that came after a start of a lower tier
// while the month-end backlog was in place: with strict tiers, once a lower
// tier has started, no higher tier may start after it (everything was
// enqueued up front). Starts are recorded inside the handlers, after the
// gate granted their slots: jobs granted slots in the same step (every
// report holds the same report_min_duration, so slots free together) may
// reach their handlers in either order, so a start within sameStep of the
// lower tier's is not counted.
func inversions(starts []ReportStart, tiers []string) int {
	rank := map[string]int{}
	for i, t := range tiers {
		rank[t] = i
	}
	n, lowest := 0, -1
	var lowestAt time.Duration
	for _, s := range starts {
		r := rank[s.Tier]
		if r < lowest && s.At-lowestAt > sameStep {
			n++
		}
		if r > lowest {
			lowest, lowestAt = r, s.At
		}
	}
	return n
}

// sameStep is how far apart two report starts recorded in their handlers
// may be and still come from slots granted in one step of the gate.
const sameStep = 50 * time.Millisecond

// Package demo runs the month-end story in one process: the three pools on
// a shared database, order and search traffic, a month-end plan of reports
// in several tiers, a live view, and a closing summary that shows the
// bulkheads held.
package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lci-labs/compartment/handlers"
	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/database"
	"github.com/lci-labs/compartment/internal/reports"
	"github.com/lci-labs/compartment/queues"
)

// Options tune a demo run.
type Options struct {
	// Config is the loaded config (normally configs/demo.yaml).
	Config *app.Config
	// Plan is the month-end plan file.
	Plan string
	// Periods are the months to run the plan for. Defaults to the last
	// SeedMonths full months of the seeded data.
	Periods []string
	// OrdersPerSecond and SearchesPerSecond are the steady traffic.
	// Default to 40 and 20.
	OrdersPerSecond, SearchesPerSecond int
	// Warmup is how long traffic runs before the month-end starts.
	// Defaults to 3s.
	Warmup time.Duration
	// Out receives the live view and the summary.
	Out io.Writer
	// Terminal redraws the live view in place.
	Terminal bool
	// Logger receives the worker's logs. Defaults to discarding them.
	Logger *slog.Logger
	// Refresh is the live view's refresh interval. Defaults to 500ms.
	Refresh time.Duration
}

// ReportStart is one report starting, in order.
type ReportStart struct {
	Report, Period, Tier string
	At                   time.Duration // since the month-end began
}

// PoolResult is what one pool did.
type PoolResult struct {
	Name          string
	Size          int
	MaxConcurrent int // observed inside the handlers
	MaxConns      int // database connections held at once
	Jobs          int
}

// Summary is the outcome of a run.
type Summary struct {
	Pools                 []PoolResult
	OrderBefore           Latency // warm-up, no month-end
	OrderDuring           Latency // while reports ran
	Starts                []ReportStart
	Inversions            int
	ReportsDone, Failed   int
	Failures              []string
	MonthEndTook, Enqueue time.Duration
}

// Latency summarises order job latencies (enqueue to done).
type Latency struct {
	N             int
	P50, P99, Max time.Duration
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

// OK reports whether the run showed what it should: every report done, no
// pool above its size, no tier inversion.
func (s Summary) OK() bool {
	for _, p := range s.Pools {
		if p.MaxConcurrent > p.Size || p.MaxConns > p.Size {
			return false
		}
	}
	return s.Failed == 0 && s.Inversions == 0
}

// recorder observes every job from inside the pools.
type recorder struct {
	mu         sync.Mutex
	inside     map[string]int
	peak       map[string]int
	jobs       map[string]int
	enqueuedAt map[string]time.Time // order job ID -> enqueue time
	orderLat   []time.Duration
	monthEnd   time.Time // zero until the month-end starts
	latBefore  []time.Duration
	starts     []ReportStart
}

func newRecorder() *recorder {
	return &recorder{inside: map[string]int{}, peak: map[string]int{}, jobs: map[string]int{}, enqueuedAt: map[string]time.Time{}}
}

func (r *recorder) middleware(p *queues.Pool, next asynq.Handler) asynq.Handler {
	name := p.Name()
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		r.mu.Lock()
		r.inside[name]++
		r.peak[name] = max(r.peak[name], r.inside[name])
		if t.Type() == handlers.TypeReport {
			var rp handlers.ReportPayload
			_ = json.Unmarshal(t.Payload(), &rp)
			q, _ := asynq.GetQueueName(ctx)
			r.starts = append(r.starts, ReportStart{Report: rp.Report, Period: rp.Period, Tier: q[strings.LastIndex(q, ":")+1:], At: time.Since(r.monthEnd)})
		}
		r.mu.Unlock()

		err := next.ProcessTask(ctx, t)

		r.mu.Lock()
		r.inside[name]--
		r.jobs[name]++
		if t.Type() == handlers.TypeOrder && err == nil {
			id, _ := asynq.GetTaskID(ctx)
			if at, ok := r.enqueuedAt[id]; ok {
				delete(r.enqueuedAt, id)
				lat := time.Since(at)
				if r.monthEnd.IsZero() {
					r.latBefore = append(r.latBefore, lat)
				} else {
					r.orderLat = append(r.orderLat, lat)
				}
			}
		}
		r.mu.Unlock()
		return err
	})
}

// Run runs the story and returns its summary.
func Run(ctx context.Context, o Options) (Summary, error) {
	cfg := o.Config
	if o.OrdersPerSecond == 0 {
		o.OrdersPerSecond = 40
	}
	if o.SearchesPerSecond == 0 {
		o.SearchesPerSecond = 20
	}
	if o.Warmup == 0 {
		o.Warmup = 3 * time.Second
	}
	if o.Refresh == 0 {
		o.Refresh = 500 * time.Millisecond
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if len(o.Periods) == 0 {
		until, err := time.Parse("2006-01", cfg.Database.SeedUntil)
		if err != nil {
			return Summary{}, err
		}
		for i := cfg.Database.SeedMonths; i >= 1; i-- {
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

	rec := newRecorder()
	redisDesc := "Redis at " + cfg.Redis.Addr()
	if cfg.Redis.Embedded {
		redisDesc = "embedded Redis"
	}
	fmt.Fprintf(o.Out, "starting: %s, %s, pools %s\n", redisDesc, cfg.Database.Describe(), poolList(cfg))
	w, err := app.NewWorker(ctx, cfg, app.WorkerOptions{Logger: o.Logger, Middleware: []queues.Middleware{rec.middleware}})
	if err != nil {
		return Summary{}, err
	}
	defer w.Close()
	enq, err := app.NewEnqueuerFor(cfg, w.Redis)
	if err != nil {
		return Summary{}, err
	}
	defer enq.Close()
	if err := w.Start(ctx); err != nil {
		return Summary{}, err
	}

	// Steady order and search traffic for the whole run.
	trafficCtx, stopTraffic := context.WithCancel(ctx)
	var traffic sync.WaitGroup
	traffic.Add(2)
	go func() { defer traffic.Done(); orders(trafficCtx, enq, rec, o.OrdersPerSecond) }()
	go func() { defer traffic.Done(); searches(trafficCtx, enq, o.SearchesPerSecond) }()
	defer func() { stopTraffic(); traffic.Wait() }()

	fmt.Fprintf(o.Out, "order traffic %d/s and search traffic %d/s; month-end starts in %s\n", o.OrdersPerSecond, o.SearchesPerSecond, o.Warmup)
	select {
	case <-ctx.Done():
		return Summary{}, ctx.Err()
	case <-time.After(o.Warmup):
	}

	// The month-end: every plan, highest tiers first.
	rec.mu.Lock()
	rec.monthEnd = time.Now()
	rec.mu.Unlock()
	// Tier by tier, so that a report which starts while the rest are still
	// being enqueued is never overtaken by a higher tier enqueued later.
	var jobs []app.ReportJob
	enqStart := time.Now()
	for _, tier := range cfg.Policy.Tiers() {
		for _, p := range plans {
			sub := &reports.Plan{Period: p.Period}
			for _, e := range p.Entries {
				if e.Tier == tier {
					sub.Entries = append(sub.Entries, e)
				}
			}
			if len(sub.Entries) == 0 {
				continue
			}
			res, err := enq.EnqueuePlan(ctx, sub)
			if err != nil {
				return Summary{}, err
			}
			jobs = append(jobs, res.Jobs...)
		}
	}
	enqTook := time.Since(enqStart)
	fmt.Fprintf(o.Out, "month-end: enqueued %d reports for %s in %s\n", len(jobs), strings.Join(o.Periods, ", "), enqTook.Round(time.Millisecond))

	view := &app.ProgressView{W: o.Out, Terminal: o.Terminal}
	tick := time.NewTicker(o.Refresh)
	defer tick.Stop()
	var states []app.JobState
	lastPlain := time.Time{}
	for {
		states, err = enq.Progress(ctx, jobs)
		if err != nil {
			return Summary{}, err
		}
		counts := app.CountByTier(states, cfg.Policy.Tiers())
		finished := true
		for _, c := range counts {
			finished = finished && c.Finished()
		}
		if o.Terminal || time.Since(lastPlain) >= 2*time.Second || finished {
			view.Draw(counts, time.Since(rec.monthEnd), poolLines(w, rec)...)
			lastPlain = time.Now()
		}
		if finished {
			break
		}
		select {
		case <-ctx.Done():
			return Summary{}, ctx.Err()
		case <-tick.C:
		}
	}
	took := time.Since(rec.monthEnd)
	stopTraffic()
	traffic.Wait()
	if err := w.Stop(ctx); err != nil {
		return Summary{}, err
	}

	return buildSummary(w, rec, states, cfg, took, enqTook), nil
}

// poolLines describes each pool's slots and the order latency so far.
func poolLines(w *app.Worker, rec *recorder) []string {
	rec.mu.Lock()
	lat := summarize(rec.orderLat)
	rec.mu.Unlock()
	var out []string
	for _, p := range w.Client.Pools() {
		bh := p.Bulkhead()
		active := bh.Active()
		out = append(out, fmt.Sprintf("  pool %-7s %s %2d/%-2d active", p.Name(), bar(active, bh.MaxConcurrent()), active, bh.MaxConcurrent()))
	}
	return append(out, fmt.Sprintf("  order latency during month-end: p50 %s  p99 %s  (%d orders)",
		lat.P50.Round(time.Millisecond), lat.P99.Round(time.Millisecond), lat.N))
}

func bar(n, size int) string {
	return "[" + strings.Repeat("#", n) + strings.Repeat(".", max(0, size-n)) + "]"
}

// every calls fn perSecond times a second until ctx ends.
func every(ctx context.Context, perSecond int, fn func()) {
	tick := time.NewTicker(time.Second / time.Duration(perSecond))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			fn()
		}
	}
}

func orders(ctx context.Context, enq *app.Enqueuer, rec *recorder, perSecond int) {
	rng := rand.New(rand.NewPCG(1, 1))
	every(ctx, perSecond, func() {
		order := handlers.OrderPayload{
			Region: database.Regions[rng.IntN(len(database.Regions))], Category: database.Categories[rng.IntN(len(database.Categories))],
			CustomerID: 1 + rng.IntN(2000), AmountCents: 500 + rng.Int64N(9500),
		}
		at := time.Now()
		info, err := queues.Enqueue(ctx, enq.Client, handlers.Order, order, queues.EnqueueOptions{})
		if err != nil {
			return // the demo's traffic is best effort; the summary counts what ran
		}
		rec.mu.Lock()
		rec.enqueuedAt[info.ID] = at
		rec.mu.Unlock()
	})
}

func searches(ctx context.Context, enq *app.Enqueuer, perSecond int) {
	rng := rand.New(rand.NewPCG(2, 2))
	every(ctx, perSecond, func() {
		id := 1 + rng.Int64N(500)
		product := handlers.SearchPayload{ProductID: id, Title: fmt.Sprintf("product %d", id), Category: database.Categories[id%int64(len(database.Categories))]}
		_, _ = queues.Enqueue(ctx, enq.Client, handlers.Search, product, queues.EnqueueOptions{})
	})
}

func buildSummary(w *app.Worker, rec *recorder, states []app.JobState, cfg *app.Config, took, enqTook time.Duration) Summary {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	s := Summary{OrderBefore: summarize(rec.latBefore), OrderDuring: summarize(rec.orderLat), Starts: slices.Clone(rec.starts), MonthEndTook: took, Enqueue: enqTook}
	conns := w.DB.PeakConnections()
	for _, p := range w.Client.Pools() {
		s.Pools = append(s.Pools, PoolResult{Name: p.Name(), Size: p.Size(), MaxConcurrent: rec.peak[p.Name()], MaxConns: conns[p.Name()], Jobs: rec.jobs[p.Name()]})
	}
	for _, st := range states {
		switch st.State {
		case "completed":
			s.ReportsDone++
		default:
			s.Failed++
			s.Failures = append(s.Failures, fmt.Sprintf("%s %s: %s %s", st.Job.Report, st.Job.Period, st.State, st.LastErr))
		}
	}
	s.Inversions = inversions(s.Starts, cfg.Policy.Tiers())
	return s
}

// inversions counts report starts that came after a start of a lower tier
// while the month-end backlog was in place: with strict tiers, once a lower
// tier has started, no higher tier may start after it (everything was
// enqueued up front).
func inversions(starts []ReportStart, tiers []string) int {
	rank := map[string]int{}
	for i, t := range tiers {
		rank[t] = i
	}
	n, lowest := 0, -1
	for _, s := range starts {
		r := rank[s.Tier]
		if r < lowest {
			n++
		}
		lowest = max(lowest, r)
	}
	return n
}

// Print writes the closing summary.
func (s Summary) Print(out io.Writer) {
	fmt.Fprintf(out, "\n=== month-end summary ===\n")
	fmt.Fprintf(out, "reports: %d completed, %d failed, in %s (enqueued in %s)\n", s.ReportsDone, s.Failed, s.MonthEndTook.Round(100*time.Millisecond), s.Enqueue.Round(time.Millisecond))
	for _, f := range s.Failures {
		fmt.Fprintf(out, "  FAILED %s\n", f)
	}
	fmt.Fprintf(out, "\n%-8s %5s %16s %16s %8s\n", "pool", "size", "max concurrent", "max db conns", "jobs")
	for _, p := range s.Pools {
		verdict := "held"
		if p.MaxConcurrent > p.Size || p.MaxConns > p.Size {
			verdict = "EXCEEDED"
		}
		fmt.Fprintf(out, "%-8s %5d %16d %16d %8d  %s\n", p.Name, p.Size, p.MaxConcurrent, p.MaxConns, p.Jobs, verdict)
	}
	fmt.Fprintf(out, "\norder latency (enqueue to done):\n")
	fmt.Fprintf(out, "  before month-end: p50 %-8s p99 %-8s max %-8s (%d orders)\n", s.OrderBefore.P50.Round(time.Millisecond), s.OrderBefore.P99.Round(time.Millisecond), s.OrderBefore.Max.Round(time.Millisecond), s.OrderBefore.N)
	fmt.Fprintf(out, "  during month-end: p50 %-8s p99 %-8s max %-8s (%d orders)\n", s.OrderDuring.P50.Round(time.Millisecond), s.OrderDuring.P99.Round(time.Millisecond), s.OrderDuring.Max.Round(time.Millisecond), s.OrderDuring.N)
	fmt.Fprintf(out, "\nreports in the order they started (tier inversions: %d):\n", s.Inversions)
	sorted := slices.Clone(s.Starts)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].At < sorted[j].At })
	for i, st := range sorted {
		fmt.Fprintf(out, "  %3d  %7s  %-11s %-20s %s\n", i+1, st.At.Round(100*time.Millisecond), st.Tier, st.Report, st.Period)
	}
}

func poolList(cfg *app.Config) string {
	parts := make([]string, len(cfg.Pools))
	for i, p := range cfg.Pools {
		parts[i] = fmt.Sprintf("%s %d", p.Name, p.Size)
	}
	return strings.Join(parts, ", ") + fmt.Sprintf(" on %d connections", cfg.Database.MaxConnections)
}

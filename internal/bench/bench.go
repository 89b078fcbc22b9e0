// Package bench measures the runner beside its peers on one Redis in one
// run: the month-end outage reproduced (one shared server) and prevented
// (partitioned pools), the runner's overhead against raw asynq, idle pickup
// latency, month-end enqueue speed, tier order and worker memory. Every
// figure is printed beside its baseline with the ratio, because the machines
// it runs on are shared and noisy.
package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/lci-labs/compartment/queues"
)

// Options size a run.
type Options struct {
	// Redis is the server every section uses.
	Redis redis.UniversalClient
	// Cluster, when set, is a Redis Cluster the overhead section also
	// drains its backlogs on, beside Redis, reporting the ratio.
	Cluster redis.UniversalClient
	// RedisURL reaches the same server, for the worker process the memory
	// section starts.
	RedisURL string
	// Out receives the tables.
	Out io.Writer
	// Smoke shrinks every section to a few seconds, to check that each one
	// runs. It judges only the targets that hold at any scale (no tier
	// inversion): at that scale the other figures are noise (though the
	// isolation section still shows the outage).
	Smoke bool
	// Scale multiplies job counts and durations of a full run. Defaults to 1.
	Scale float64
	// TempDir holds databases and binaries.
	TempDir string
	// Sections to run, by name; all when empty.
	Sections []string
	// Log receives progress notes. Defaults to discarding them.
	Log *slog.Logger
}

// Section is one measurement.
type Section struct {
	Name  string
	Title string
	Run   func(ctx context.Context, o *Options) (*Table, error)
}

// Sections lists every section in run order.
func Sections() []Section {
	return []Section{
		{"isolation", "1. Isolation: the month-end outage, shared vs partitioned", runIsolation},
		{"overhead", "2. Overhead: the runner against raw asynq", runOverhead},
		{"pickup", "3. Pickup latency on an idle pool, and what an idle worker costs Redis", runPickup},
		{"enqueue", "4. Month-end enqueue against a sequential Client.Enqueue loop", runEnqueue},
		{"priority", "5. Priority: tier inversions in start order", runPriority},
		{"memory", "6. Memory: worker resident set", runMemory},
		{"door", "7. The door: enqueue checks and a start rate", runDoor},
		{"breaker", "8. The circuit breaker's cost while closed", runBreaker},
		{"steering", "9. Steering: a reserved slot and the starvation guard", runSteering},
		{"clustercap", "10. The cluster-wide cap at full speed: short jobs, three processes, several dequeue loops", runClusterCap},
		{"adaptive", "11. The adaptive cap against a static one: the report database slows 5x", runAdaptive},
		{"growth", "12. What a job costs Redis as processes and slots grow", runGrowth},
	}
}

// Table is a section's result.
type Table struct {
	Header []string
	Rows   [][]string
	Notes  []string
	// Targets are what the section aims for, each with whether this run
	// met it.
	Targets []Target
}

// Target is one aim of a section and whether a run met it.
type Target struct {
	What string
	Met  bool
	// AnyScale marks a target that a smoke run judges too: a property
	// (no tier inversion), not a measure that needs a full run.
	AnyScale bool
}

// judged reports whether a run judges the target.
func (tg Target) judged(smoke bool) bool { return !smoke || tg.AnyScale }

func (t *Table) row(cells ...any) {
	r := make([]string, len(cells))
	for i, c := range cells {
		r[i] = fmt.Sprint(c)
	}
	t.Rows = append(t.Rows, r)
}

func (t *Table) note(format string, args ...any) {
	t.Notes = append(t.Notes, fmt.Sprintf(format, args...))
}

// target records a target and whether it was met.
func (t *Table) target(what string, met bool) {
	t.Targets = append(t.Targets, Target{What: what, Met: met})
}

// property records a target that holds at any scale, smoke runs included.
func (t *Table) property(what string, met bool) {
	t.Targets = append(t.Targets, Target{What: what, Met: met, AnyScale: true})
}

// Print writes the table, its notes and its targets. In a smoke run a
// target that needs a full run is printed as not judged.
func (t *Table) Print(w io.Writer, smoke bool) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(t.Header, "\t"))
	for _, r := range t.Rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	_ = tw.Flush()
	for _, n := range t.Notes {
		fmt.Fprintln(w, "  "+n)
	}
	for _, tg := range t.Targets {
		verdict := "not judged at smoke scale"
		switch {
		case tg.judged(smoke) && tg.Met:
			verdict = "met"
		case tg.judged(smoke):
			verdict = "MISSED"
		}
		fmt.Fprintf(w, "  target %s: %s\n", tg.What, verdict)
	}
}

// Run runs the chosen sections and prints each table. It returns the
// targets missed among those the run judges.
func Run(ctx context.Context, o Options) ([]string, error) {
	if o.Scale == 0 {
		o.Scale = 1
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	var missed []string
	for _, s := range Sections() {
		if len(o.Sections) > 0 && !slices.Contains(o.Sections, s.Name) {
			continue
		}
		fmt.Fprintf(o.Out, "\n## %s\n\n", s.Title)
		start := time.Now()
		t, err := s.Run(ctx, &o)
		if err != nil {
			return missed, fmt.Errorf("%s: %w", s.Name, err)
		}
		t.Print(o.Out, o.Smoke)
		fmt.Fprintf(o.Out, "  (section took %s)\n", time.Since(start).Round(100*time.Millisecond))
		for _, tg := range t.Targets {
			if !tg.Met && tg.judged(o.Smoke) {
				missed = append(missed, s.Name+": "+tg.What)
			}
		}
	}
	return missed, nil
}

// n scales a count for the run: small in smoke mode.
func (o *Options) n(full, smoke int) int {
	if o.Smoke {
		return smoke
	}
	return max(1, int(float64(full)*o.Scale))
}

// d scales a duration for the run.
func (o *Options) d(full, smoke time.Duration) time.Duration {
	if o.Smoke {
		return smoke
	}
	return time.Duration(float64(full) * o.Scale)
}

// namespace returns a queue prefix unique to this run and section, and a
// func that deletes its queues and keys.
func namespace(o *Options, section string) (string, func()) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	ns := "bench" + hex.EncodeToString(b[:]) + "-" + section
	return ns, func() { cleanup(o.Redis, ns) }
}

func cleanup(rdb redis.UniversalClient, ns string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	insp := asynq.NewInspectorFromRedisClient(rdb)
	if qs, err := insp.Queues(); err == nil {
		for _, q := range qs {
			if strings.HasPrefix(q, ns) {
				_ = insp.DeleteQueue(q, true)
			}
		}
	}
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		// A cluster: scan every master, and delete key by key (the keys of
		// one call must share a slot).
		_ = cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			for _, pattern := range queues.NamespaceKeyPatterns(ns) {
				iter := m.Scan(ctx, 0, pattern, 1000).Iterator()
				pipe := m.Pipeline()
				for iter.Next(ctx) {
					pipe.Unlink(ctx, iter.Val())
				}
				_, _ = pipe.Exec(ctx)
			}
			return nil
		})
		return
	}
	for _, pattern := range queues.NamespaceKeyPatterns(ns) {
		iter := rdb.Scan(ctx, 0, pattern, 1000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
			if len(keys) == 1000 {
				rdb.Del(ctx, keys...)
				keys = keys[:0]
			}
		}
		if len(keys) > 0 {
			rdb.Del(ctx, keys...)
		}
	}
}

// fill enqueues n tasks of jobType into queue with 8 goroutines.
func fill(ctx context.Context, rdb redis.UniversalClient, queue, jobType string, n int, opts ...asynq.Option) error {
	c := asynq.NewClientFromRedisClient(rdb)
	defer c.Close()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for i := range n {
		g.Go(func() error {
			_, err := c.EnqueueContext(gctx, asynq.NewTask(jobType, []byte(fmt.Sprint(i))), append([]asynq.Option{asynq.Queue(queue)}, opts...)...)
			return err
		})
	}
	return g.Wait()
}

// counter counts handled jobs and closes done at n. It remembers when the
// first and the last job were counted, for a throughput that leaves the
// start-up out (counter.rate).
type counter struct {
	mu          sync.Mutex
	n           int
	want        int
	done        chan struct{}
	first, last time.Time
}

func newCounter(want int) *counter { return &counter{want: want, done: make(chan struct{})} }

func (c *counter) add() {
	now := time.Now()
	c.mu.Lock()
	c.n++
	if c.n == 1 {
		c.first = now
	}
	c.last = now
	if c.n == c.want {
		close(c.done)
	}
	c.mu.Unlock()
}

func (c *counter) wait(ctx context.Context, timeout time.Duration) error {
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(timeout):
		c.mu.Lock()
		defer c.mu.Unlock()
		return fmt.Errorf("timed out after %s with %d of %d jobs done", timeout, c.n, c.want)
	}
}

// rate is the jobs per second counted between the first job and the last:
// the throughput of a drain once it runs, without its start-up. since is
// when the start-up began; startup is how long it took until the first job.
func (c *counter) rate(since time.Time) (perSecond float64, startup time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n < 2 || !c.last.After(c.first) {
		return 0, 0
	}
	return float64(c.n-1) / c.last.Sub(c.first).Seconds(), c.first.Sub(since)
}

// median returns the middle of xs (the upper one of an even count), for
// the per-round ratios of a section.
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// fmtRatios lists per-round ratios, two decimals each.
func fmtRatios(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf("%.2f", x)
	}
	return strings.Join(parts, ", ")
}

type latencies []time.Duration

func (l latencies) pct(p float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	s := slices.Clone(l)
	slices.Sort(s)
	return s[int(p*float64(len(s)-1))]
}

func ms(d time.Duration) string {
	return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000)
}

func ratio(a, b float64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", a/b)
}

func quietLogger() asynq.Logger { return silent{} }

type silent struct{}

func (silent) Debug(...any) {}
func (silent) Info(...any)  {}
func (silent) Warn(...any)  {}
func (silent) Error(...any) {}
func (silent) Fatal(...any) {}

// startClient builds a client over o.Redis that runs cfg's pools with h,
// and starts it.
func startClient(ctx context.Context, o *Options, cfg queues.Config, h *queues.Handlers) (*queues.Client, error) {
	cfg.Handlers = h
	c, err := queues.NewClient(o.Redis, cfg)
	if err != nil {
		return nil, err
	}
	if err := c.Start(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// stopClient stops c, waiting for its jobs to finish.
func stopClient(c *queues.Client) { _ = c.Stop(context.Background()) }

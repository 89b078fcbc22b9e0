package bench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"strconv"
	"syscall"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lci-labs/compartment/metrics"
	"github.com/lci-labs/compartment/queues"
)

// metricsScrapeEvery is how often the metrics-on rounds scrape: far more
// often than Prometheus's usual 15 s, so the scrape's cost shows.
const metricsScrapeEvery = time.Second

// metricsOverhead adds to t the runner with metrics on (the observer on
// every job, and a scrape every second) against the same runner with
// metrics off, alternating over rounds.
func metricsOverhead(ctx context.Context, o *Options, t *Table, n, rounds, concurrency int) error {
	// More rounds than the other rows: the effect sought is a few percent,
	// well inside one round's noise on a shared machine.
	if !o.Smoke {
		rounds = max(rounds, 6)
	}
	var offTotal, onTotal float64
	var offCPU, onCPU time.Duration
	var ratios []float64
	for round := 1; round <= rounds; round++ {
		// Alternate which goes first, so a drift in the machine's load
		// does not favour one side.
		var off, on float64
		var err error
		for _, metricsOn := range []bool{round%2 == 0, round%2 == 1} {
			v, cpu, derr := drainObserved(ctx, o, concurrency, n, metricsOn)
			if metricsOn {
				on, onCPU = v, onCPU+cpu
			} else {
				off, offCPU = v, offCPU+cpu
			}
			err = cmp.Or(err, derr)
		}
		if err != nil {
			return err
		}
		offTotal += off
		onTotal += on
		ratios = append(ratios, on/off)
		t.row(fmt.Sprintf("metrics on vs off, 1 pool, C=%d, no-op jobs", concurrency), round,
			fmt.Sprintf("%.0f (off)", off), fmt.Sprintf("%.0f (on)", on), ratio(on, off))
	}
	r := onTotal / offTotal
	t.row("metrics on vs off: all rounds", "-", fmt.Sprintf("%.0f", offTotal/float64(rounds)), fmt.Sprintf("%.0f", onTotal/float64(rounds)), fmt.Sprintf("%.3fx", r))
	perJob := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(n*rounds) }
	t.row("metrics on vs off: median round", "-", "", "", fmt.Sprintf("%.3fx", median(ratios)))
	t.row("metrics on vs off: CPU of this process per job", "-", fmt.Sprintf("%.1f µs (off)", perJob(offCPU)), fmt.Sprintf("%.1f µs (on)", perJob(onCPU)),
		fmt.Sprintf("%.3fx", float64(onCPU)/float64(offCPU)))
	t.target("metrics on >= 0.98x metrics off", r >= 0.98)
	t.note("metrics CPU row: this process's CPU time (getrusage) from the pool's start to its last job, per job; Redis's own work is not in it")
	t.note("metrics rows: the same pool (scope process) and jobs, enqueued through the Client (so each carries its enqueue time); on = the Prometheus observer on every job plus a scrape every %s", metricsScrapeEvery)
	return nil
}

// drainObserved drains n no-op jobs through one runner pool, with or
// without metrics, and returns jobs per second.
func drainObserved(ctx context.Context, o *Options, concurrency, n int, withMetrics bool) (float64, time.Duration, error) {
	ns, clean := namespace(o, "metrics")
	defer clean()
	c := newCounter(n)
	cfg := queues.Config{Namespace: ns, Logger: slog.New(slog.DiscardHandler), Handlers: queues.NewHandlers(),
		Pools: []queues.PoolConfig{{Name: "p", Size: concurrency, JobTypes: []string{"noop"}, PollInterval: 20 * time.Millisecond, Scope: queues.ScopeProcess}}}
	cfg.Handlers.HandleFunc("noop", func(context.Context, *asynq.Task) error { c.add(); return nil })
	var m *metrics.Metrics
	if withMetrics {
		m = metrics.New()
		cfg.Observer = m
	}
	enq, err := queues.NewClient(o.Redis, queues.Config{Namespace: ns, Pools: cfg.Pools, Logger: cfg.Logger})
	if err != nil {
		return 0, 0, err
	}
	reqs := make([]queues.Request, n)
	for i := range reqs {
		reqs[i] = queues.Request{JobType: "noop", Payload: []byte(strconv.Itoa(i))}
	}
	for start := 0; start < n; start += 2000 {
		if _, err := enq.EnqueueMany(ctx, reqs[start:min(n, start+2000)]); err != nil {
			return 0, 0, err
		}
	}
	start, cpu0 := time.Now(), processCPU()
	r, err := startClient(ctx, o, cfg, cfg.Handlers)
	if err != nil {
		return 0, 0, err
	}
	stopScrape := func() {}
	if m != nil {
		if err := m.Watch(r); err != nil {
			stopClient(r)
			return 0, 0, err
		}
		stopScrape = scrapeEvery(m, metricsScrapeEvery)
	}
	err = c.wait(ctx, 5*time.Minute)
	took, cpu := time.Since(start), processCPU()-cpu0
	stopScrape()
	stopClient(r)
	if err != nil {
		return 0, 0, err
	}
	return float64(n) / took.Seconds(), cpu, nil
}

// processCPU is the CPU time this process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// scrapeEvery scrapes m's handler every d until the returned func is
// called.
func scrapeEvery(m *metrics.Metrics, d time.Duration) func() {
	done := make(chan struct{})
	stopped := make(chan struct{})
	h := m.Handler()
	go func() {
		defer close(stopped)
		tick := time.NewTicker(d)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
				_, _ = io.Copy(io.Discard, rec.Body)
			}
		}
	}()
	return func() {
		close(done)
		<-stopped
	}
}

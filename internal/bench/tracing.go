package bench

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/hibiken/asynq"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/lci-labs/compartment/queues"
)

// tracingMode is how a tracing round traces.
type tracingMode int

const (
	// tracingSkipped: a no-op provider, which the engine recognizes and
	// skips: no spans, no headers. The code as it was before tracing.
	tracingSkipped tracingMode = iota
	// tracingOff: the default, otel's global provider with no SDK
	// installed, as in a service that does not trace.
	tracingOff
	// tracingOn: an SDK provider sampling every span, into an exporter
	// that drops them.
	tracingOn
)

func (m tracingMode) String() string {
	return [...]string{"skipped", "off", "on"}[m]
}

// discard is a span exporter that drops what it gets.
type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }

// tracingOverhead adds to t what tracing costs: the engine with tracing
// off (the default, no SDK) against the engine with it skipped, and, for
// information, with it on, alternating the order over rounds. Each round
// enqueues n no-op jobs through EnqueueMany (timed) and drains them
// (timed).
func tracingOverhead(ctx context.Context, o *Options, t *Table, n, rounds, concurrency int) error {
	if !o.Smoke {
		rounds = max(rounds, 6)
	}
	modes := []tracingMode{tracingSkipped, tracingOff, tracingOn}
	var runTotal, enqTotal [3]float64
	var runRatios, enqRatios []float64
	for round := 1; round <= rounds; round++ {
		var runRate, enqRate [3]float64
		var err error
		for k := range modes {
			m := modes[(k+round)%len(modes)] // each mode goes first in turn
			enq, run, derr := drainTraced(ctx, o, concurrency, n, m)
			enqRate[m], runRate[m] = enq, run
			err = cmp.Or(err, derr)
		}
		if err != nil {
			return err
		}
		for _, m := range modes {
			runTotal[m] += runRate[m]
			enqTotal[m] += enqRate[m]
		}
		runRatios = append(runRatios, runRate[tracingSkipped]/runRate[tracingOff])
		enqRatios = append(enqRatios, enqRate[tracingSkipped]/enqRate[tracingOff])
		t.row(fmt.Sprintf("tracing off vs skipped, runs, 1 pool, C=%d, no-op jobs", concurrency), round,
			fmt.Sprintf("%.0f (skipped)", runRate[tracingSkipped]), fmt.Sprintf("%.0f (off)", runRate[tracingOff]),
			fmt.Sprintf("%.3fx cost; on: %.0f", runRate[tracingSkipped]/runRate[tracingOff], runRate[tracingOn]))
		t.row("tracing off vs skipped, EnqueueMany of the same jobs", round,
			fmt.Sprintf("%.0f (skipped)", enqRate[tracingSkipped]), fmt.Sprintf("%.0f (off)", enqRate[tracingOff]),
			fmt.Sprintf("%.3fx cost; on: %.0f", enqRate[tracingSkipped]/enqRate[tracingOff], enqRate[tracingOn]))
	}
	runCost := runTotal[tracingSkipped] / runTotal[tracingOff]
	enqCost := enqTotal[tracingSkipped] / enqTotal[tracingOff]
	per := func(x float64) string { return fmt.Sprintf("%.0f", x/float64(rounds)) }
	t.row("tracing off vs skipped, runs: all rounds", "-", per(runTotal[tracingSkipped]), per(runTotal[tracingOff]),
		fmt.Sprintf("%.3fx cost (median round %.3fx); on: %s, %.3fx cost", runCost, median(runRatios), per(runTotal[tracingOn]), runTotal[tracingSkipped]/runTotal[tracingOn]))
	t.row("tracing off vs skipped, EnqueueMany: all rounds", "-", per(enqTotal[tracingSkipped]), per(enqTotal[tracingOff]),
		fmt.Sprintf("%.3fx cost (median round %.3fx); on: %s, %.3fx cost", enqCost, median(enqRatios), per(enqTotal[tracingOn]), enqTotal[tracingSkipped]/enqTotal[tracingOn]))
	t.target("tracing off costs <= 1.02x (runs: jobs/s skipped over jobs/s off)", runCost <= 1.02)
	t.note("tracing rows: cost = throughput with tracing skipped (a no-op provider, which the engine recognizes: no spans, no headers, the code as before tracing) over throughput with tracing off (the default: otel's global provider, no SDK installed); on = an SDK provider sampling every span into an exporter that drops them, for information")
	return nil
}

// drainTraced enqueues n no-op jobs through one process-scoped pool and
// drains them, with tracing in mode m; it returns jobs per second of the
// enqueue and of the drain.
func drainTraced(ctx context.Context, o *Options, concurrency, n int, m tracingMode) (float64, float64, error) {
	ns, clean := namespace(o, "tracing")
	defer clean()
	var tp trace.TracerProvider // nil: the global one (off)
	switch m {
	case tracingSkipped:
		tp = noop.NewTracerProvider()
	case tracingOn:
		sdk := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discard{}), sdktrace.WithSampler(sdktrace.AlwaysSample()))
		defer func() { _ = sdk.Shutdown(context.Background()) }()
		tp = sdk
	}
	c := newCounter(n)
	cfg := queues.Config{Namespace: ns, Logger: slog.New(slog.DiscardHandler), Handlers: queues.NewHandlers(), TracerProvider: tp,
		Pools: []queues.PoolConfig{{Name: "p", Size: concurrency, JobTypes: []string{"noop"}, PollInterval: 20 * time.Millisecond, Scope: queues.ScopeProcess}}}
	cfg.Handlers.HandleFunc("noop", func(context.Context, *asynq.Task) error { c.add(); return nil })
	enq, err := queues.NewClient(o.Redis, queues.Config{Namespace: ns, Pools: cfg.Pools, Logger: cfg.Logger, TracerProvider: tp})
	if err != nil {
		return 0, 0, err
	}
	reqs := make([]queues.Request, n)
	for i := range reqs {
		reqs[i] = queues.Request{JobType: "noop", Payload: []byte(strconv.Itoa(i))}
	}
	began := time.Now()
	for start := 0; start < n; start += 2000 {
		if _, err := enq.EnqueueMany(ctx, reqs[start:min(n, start+2000)]); err != nil {
			return 0, 0, err
		}
	}
	enqRate := float64(n) / time.Since(began).Seconds()
	start := time.Now()
	r, err := startClient(ctx, o, cfg, cfg.Handlers)
	if err != nil {
		return 0, 0, err
	}
	err = c.wait(ctx, 5*time.Minute)
	took := time.Since(start)
	stopClient(r)
	if err != nil {
		return 0, 0, err
	}
	return enqRate, float64(n) / took.Seconds(), nil
}

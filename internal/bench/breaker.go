package bench

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lci-labs/compartment/queues"
)

// runBreaker measures what a closed circuit breaker costs: the same backlog
// of no-op jobs drained by one pool without a breaker and with one,
// alternating over several rounds. No-op jobs show the whole cost (a local
// count per job, one report to Redis per process every 250 ms, and a batched
// delete of the jobs' failure counts).
func runBreaker(ctx context.Context, o *Options) (*Table, error) {
	n := o.n(20000, 600)
	rounds := o.n(5, 1)
	const concurrency = 10
	t := &Table{Header: []string{"setup", "round", "no breaker jobs/s", "breaker (closed) jobs/s", "ratio", "start-up (none / breaker)"}}
	var ratios []float64
	var withoutTotal, withTotal float64
	var upWithout, upWith []float64
	for round := 1; round <= rounds; round++ {
		// Which goes first alternates: the second drain of a round tends to
		// be faster (a warm Redis), which would favour one side.
		var without, with float64
		var upA, upB time.Duration
		for i := range 2 {
			var err error
			if (i+round)%2 == 1 {
				without, upA, err = drainBreaker(ctx, o, concurrency, n, nil)
			} else {
				with, upB, err = drainBreaker(ctx, o, concurrency, n, &queues.BreakerConfig{})
			}
			if err != nil {
				return nil, err
			}
		}
		withoutTotal += without
		withTotal += with
		ratios = append(ratios, with/without)
		upWithout, upWith = append(upWithout, float64(upA.Milliseconds())), append(upWith, float64(upB.Milliseconds()))
		t.row(fmt.Sprintf("1 pool, C=%d, no-op jobs", concurrency), round, fmt.Sprintf("%.0f", without), fmt.Sprintf("%.0f", with), ratio(with, without),
			fmt.Sprintf("%d / %d ms", upA.Milliseconds(), upB.Milliseconds()))
	}
	r := median(ratios)
	t.row("all rounds", "-", fmt.Sprintf("%.0f", withoutTotal/float64(rounds)), fmt.Sprintf("%.0f", withTotal/float64(rounds)), fmt.Sprintf("%.3fx median (per round: %s)", r, fmtRatios(ratios)),
		fmt.Sprintf("%.0f / %.0f ms median", median(upWithout), median(upWith)))
	t.target("a closed breaker >= 0.97x the throughput without one (median of the rounds)", r >= 0.97)
	t.note("each round: %d no-op jobs enqueued up front, then drained by one process-scoped pool without a breaker and with breaker: {} (defaults), which one first alternating by round", n)
	t.note("jobs/s counts from the first job to the last, so that a drain's start-up (Start until the first job runs, shown apart) does not weigh on its throughput")
	return t, nil
}

// drainBreaker drains n no-op jobs and returns the throughput from the first
// job to the last, and the start-up: from Start until the first job ran.
func drainBreaker(ctx context.Context, o *Options, concurrency, n int, b *queues.BreakerConfig) (float64, time.Duration, error) {
	ns, clean := namespace(o, "breaker")
	defer clean()
	c := newCounter(n)
	cfg := queues.Config{Namespace: ns, Logger: slog.New(slog.DiscardHandler), Handlers: queues.NewHandlers()}
	cfg.Pools = []queues.PoolConfig{{Name: "p", Size: concurrency, JobTypes: []string{"noop"}, PollInterval: 20 * time.Millisecond,
		Scope: queues.ScopeProcess, Breaker: b}}
	cfg.Handlers.HandleFunc("noop", func(context.Context, *asynq.Task) error { c.add(); return nil })
	if err := fill(ctx, o.Redis, queues.QueueName(ns, "p", ""), "noop", n); err != nil {
		return 0, 0, err
	}
	start := time.Now()
	r, err := startClient(ctx, o, cfg, cfg.Handlers)
	if err != nil {
		return 0, 0, err
	}
	err = c.wait(ctx, 5*time.Minute)
	stopClient(r)
	if err != nil {
		return 0, 0, err
	}
	rate, up := c.rate(start)
	return rate, up, nil
}

package bench

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lci-labs/compartment/queues"
)

// runOverhead drains a backlog of no-op jobs through raw asynq servers and
// through the runner, alternating A and B over several rounds.
func runOverhead(ctx context.Context, o *Options) (*Table, error) {
	n := o.n(20000, 600)
	rounds := o.n(3, 1)
	const concurrency = 10
	t := &Table{Header: []string{"setup", "round", "raw asynq jobs/s", "runner jobs/s", "runner / raw"}}
	for _, pools := range []int{1, 3} {
		var rawTotal, oursTotal float64
		for round := 1; round <= rounds; round++ {
			raw, err := drainRaw(ctx, o, pools, concurrency, n)
			if err != nil {
				return nil, err
			}
			ours, err := drainRunner(ctx, o, pools, concurrency, n, queues.ScopeProcess, 0)
			if err != nil {
				return nil, err
			}
			rawTotal += raw
			oursTotal += ours
			t.row(fmt.Sprintf("%d pool(s), C=%d each", pools, concurrency), round, fmt.Sprintf("%.0f", raw), fmt.Sprintf("%.0f", ours), ratio(ours, raw))
		}
		r := oursTotal / rawTotal
		t.row(fmt.Sprintf("%d pool(s): all rounds", pools), "-", fmt.Sprintf("%.0f", rawTotal/float64(rounds)), fmt.Sprintf("%.0f", oursTotal/float64(rounds)), fmt.Sprintf("%.3fx", r))
		if pools == 1 {
			t.target("one pool >= 0.97x raw throughput", r >= 0.97)
		} else {
			t.target("three pools >= 0.95x three raw servers", r >= 0.95)
		}
	}
	// The cluster-wide gate against the per-process cap, same pool, same
	// jobs: no-op jobs (the gate's whole cost shows) and 2 ms jobs.
	for _, work := range []time.Duration{0, 2 * time.Millisecond} {
		jobs := n
		label := "no-op jobs"
		if work > 0 {
			jobs, label = max(1, n/5), fmt.Sprintf("%s jobs", work)
		}
		var procTotal, clusterTotal float64
		for round := 1; round <= rounds; round++ {
			proc, err := drainRunner(ctx, o, 1, concurrency, jobs, queues.ScopeProcess, work)
			if err != nil {
				return nil, err
			}
			cluster, err := drainRunner(ctx, o, 1, concurrency, jobs, queues.ScopeCluster, work)
			if err != nil {
				return nil, err
			}
			procTotal += proc
			clusterTotal += cluster
			t.row(fmt.Sprintf("cluster vs process scope, C=%d, %s", concurrency, label), round, fmt.Sprintf("%.0f (process)", proc), fmt.Sprintf("%.0f (cluster)", cluster), ratio(cluster, proc))
		}
		cr := clusterTotal / procTotal
		t.row(fmt.Sprintf("cluster vs process scope, %s: all rounds", label), "-", fmt.Sprintf("%.0f", procTotal/float64(rounds)), fmt.Sprintf("%.0f", clusterTotal/float64(rounds)), fmt.Sprintf("%.3fx", cr))
		t.target(fmt.Sprintf("cluster-wide cap costs <= 10%% throughput on %s (>= 0.90x the per-process cap)", label), cr >= 0.90)
	}
	if err := metricsOverhead(ctx, o, t, n, rounds, concurrency); err != nil {
		return nil, err
	}
	if err := tracingOverhead(ctx, o, t, n, rounds, concurrency); err != nil {
		return nil, err
	}
	if o.Cluster != nil {
		if err := clusterOverhead(ctx, o, t, n, max(rounds, 5), concurrency); err != nil {
			return nil, err
		}
	}
	t.note("each round: %d no-op jobs enqueued up front, then drained; throughput = jobs / time from server start to the last job done", n)
	t.note("the runner rows use scope: process, to compare with raw asynq; the cluster rows add the gate: two Lua calls per job and a lease renewal every 5 s; %s jobs with work", fmt.Sprint(max(1, n/5)))
	return t, nil
}

func drainRaw(ctx context.Context, o *Options, pools, concurrency, n int) (float64, error) {
	ns, clean := namespace(o, "raw")
	defer clean()
	per := n / pools
	c := newCounter(per * pools)
	var servers []*asynq.Server
	for i := range pools {
		q := fmt.Sprintf("%s:p%d", ns, i)
		if err := fill(ctx, o.Redis, q, "noop", per); err != nil {
			return 0, err
		}
		servers = append(servers, asynq.NewServerFromRedisClient(o.Redis, asynq.Config{
			Concurrency: concurrency, Queues: map[string]int{q: 1}, TaskCheckInterval: 20 * time.Millisecond, Logger: quietLogger(),
		}))
	}
	h := asynq.HandlerFunc(func(context.Context, *asynq.Task) error { c.add(); return nil })
	start := time.Now()
	for _, s := range servers {
		if err := s.Start(h); err != nil {
			return 0, err
		}
	}
	err := c.wait(ctx, 5*time.Minute)
	took := time.Since(start)
	for _, s := range servers {
		s.Shutdown()
	}
	if err != nil {
		return 0, err
	}
	return float64(per*pools) / took.Seconds(), nil
}

func drainRunner(ctx context.Context, o *Options, pools, concurrency, n int, scope queues.Scope, work time.Duration) (float64, error) {
	ns, clean := namespace(o, "ours")
	defer clean()
	per := n / pools
	c := newCounter(per * pools)
	cfg := queues.Config{Namespace: ns, Logger: slog.New(slog.DiscardHandler), Handlers: queues.NewHandlers()}
	for i := range pools {
		jt := fmt.Sprintf("noop%d", i)
		cfg.Pools = append(cfg.Pools, queues.PoolConfig{Name: fmt.Sprintf("p%d", i), Size: concurrency, JobTypes: []string{jt}, PollInterval: 20 * time.Millisecond, Scope: scope})
		cfg.Handlers.HandleFunc(jt, func(context.Context, *asynq.Task) error {
			if work > 0 {
				time.Sleep(work) // a job's own work
			}
			c.add()
			return nil
		})
		if err := fill(ctx, o.Redis, queues.QueueName(ns, fmt.Sprintf("p%d", i), ""), jt, per); err != nil {
			return 0, err
		}
	}
	start := time.Now()
	r, err := startClient(ctx, o, cfg, cfg.Handlers)
	if err != nil {
		return 0, err
	}
	err = c.wait(ctx, 5*time.Minute)
	took := time.Since(start)
	stopClient(r)
	if err != nil {
		return 0, err
	}
	return float64(per*pools) / took.Seconds(), nil
}

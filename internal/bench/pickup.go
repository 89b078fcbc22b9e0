package bench

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lci-labs/compartment/handlers"
	"github.com/lci-labs/compartment/queues"
)

// runPickup measures enqueue-to-start latency on an idle pool with asynq's
// default poll interval and a tuned one, and the Redis commands per second
// an idle worker with three pools costs.
func runPickup(ctx context.Context, o *Options) (*Table, error) {
	samples := o.n(15, 2)
	t := &Table{Header: []string{"poll interval", "samples", "pickup p50", "pickup p99", "pickup max", "idle Redis commands/s (3 pools)"}}
	var results []latencies
	for _, poll := range []time.Duration{time.Second, 50 * time.Millisecond} {
		lat, err := pickup(ctx, o, poll, samples)
		if err != nil {
			return nil, err
		}
		cps, err := idleCommands(ctx, o, poll)
		if err != nil {
			return nil, err
		}
		results = append(results, lat)
		label := poll.String()
		if poll == time.Second {
			label += " (asynq default)"
		}
		t.row(label, len(lat), ms(lat.pct(.5)), ms(lat.pct(.99)), ms(lat.pct(1)), fmt.Sprintf("%.1f", cps))
	}
	t.note("tuned / default pickup p50: %s", ratio(float64(results[1].pct(.5)), float64(results[0].pct(.5))))
	t.note("pickup: one job at a time into an idle pool, each after the previous was handled and a pause; asynq sleeps poll/2 + rand(poll) when every queue is empty")
	t.note("idle commands/s: INFO total_commands_processed over the window, less the INFO calls; includes any other client of this Redis")
	return t, nil
}

func pickup(ctx context.Context, o *Options, poll time.Duration, samples int) (latencies, error) {
	ns, clean := namespace(o, "pickup")
	defer clean()
	started := make(chan time.Time, 1)
	mux := queues.NewHandlers()
	mux.HandleFunc(handlers.TypeOrder, func(context.Context, *asynq.Task) error { started <- time.Now(); return nil })
	cfg := queues.Config{Namespace: ns, Logger: slog.New(slog.DiscardHandler), Pools: []queues.PoolConfig{
		{Name: "order", Size: 1, JobTypes: []string{handlers.TypeOrder}, PollInterval: poll},
	}}
	client, err := startClient(ctx, o, cfg, mux)
	if err != nil {
		return nil, err
	}
	defer stopClient(client)
	var out latencies
	for i := range samples {
		// Let the pool go idle: its last look found nothing.
		idle := poll + time.Duration(i%3)*poll/3
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(idle):
		}
		at := time.Now()
		if _, err := client.Enqueue(ctx, handlers.TypeOrder, nil, queues.EnqueueOptions{}); err != nil {
			return nil, err
		}
		select {
		case s := <-started:
			out = append(out, s.Sub(at))
		case <-time.After(10 * poll):
			return nil, fmt.Errorf("a job was not picked up within %s", 10*poll)
		}
	}
	return out, nil
}

func idleCommands(ctx context.Context, o *Options, poll time.Duration) (float64, error) {
	ns, clean := namespace(o, "idle")
	defer clean()
	mux := queues.NewHandlers()
	cfg := queues.Config{Namespace: ns, Logger: slog.New(slog.DiscardHandler)}
	for _, name := range []string{"order", "search", "batch"} {
		jt := name + ":job"
		cfg.Pools = append(cfg.Pools, queues.PoolConfig{Name: name, Size: 4, JobTypes: []string{jt}, PollInterval: poll})
		mux.HandleFunc(jt, func(context.Context, *asynq.Task) error { return nil })
	}
	r, err := startClient(ctx, o, cfg, mux)
	if err != nil {
		return 0, err
	}
	defer stopClient(r)
	time.Sleep(time.Second) // past start-up writes (heartbeat, server info)
	window := o.d(6*time.Second, time.Second)
	before, err := commandsProcessed(ctx, o)
	if err != nil {
		return 0, err
	}
	time.Sleep(window)
	after, err := commandsProcessed(ctx, o)
	if err != nil {
		return 0, err
	}
	return float64(after-before-1) / window.Seconds(), nil
}

func commandsProcessed(ctx context.Context, o *Options) (int64, error) {
	info, err := o.Redis.Info(ctx, "stats").Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_commands_processed:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("INFO stats has no total_commands_processed (is this a real Redis?)")
}

// redisCPU returns the CPU time the Redis server has used so far (user and
// system, INFO cpu).
func redisCPU(ctx context.Context, o *Options) (time.Duration, error) {
	info, err := o.Redis.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	var total float64
	found := 0
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		for _, key := range []string{"used_cpu_sys:", "used_cpu_user:"} {
			if v, ok := strings.CutPrefix(line, key); ok {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					return 0, fmt.Errorf("INFO cpu: %s %q: %w", key, v, err)
				}
				total += f
				found++
			}
		}
	}
	if found != 2 {
		return 0, fmt.Errorf("INFO cpu has no used_cpu_sys and used_cpu_user (is this a real Redis?)")
	}
	return time.Duration(total * float64(time.Second)), nil
}

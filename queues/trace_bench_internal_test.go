package queues

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// BenchmarkTracingPerJob measures what the engine's tracing adds to each
// job, on the engine's side only (no Redis): a run's span started and
// ended, and a one-job batch's enqueue span with its headers, with
// tracing off (the default: otel's global provider, no SDK) and skipped
// (a no-op provider). cmd/bench's overhead section puts the same against
// whole jobs through Redis; this one isolates the nanoseconds.
func BenchmarkTracingPerJob(b *testing.B) {
	cfg := Config{Pools: []PoolConfig{{Name: "p", Size: 1, JobTypes: []string{"noop"}, Scope: ScopeProcess}}}.WithDefaults()
	reg, err := newRegistry(cfg, rdb.NewKeyspace(cfg.Namespace, false), nil)
	if err != nil {
		b.Fatal(err)
	}
	p := reg.pools[0]
	task := asynq.NewTaskWithHeaders("noop", nil, jobHeaders(time.Now(), EnqueueOptions{}, nil))
	for _, mode := range []struct {
		name string
		tr   *tracing
	}{
		{"skipped", newTracing(Config{TracerProvider: tracenoop.NewTracerProvider()})},
		{"off", newTracing(Config{})},
	} {
		b.Run("run/"+mode.name, func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				c, span := mode.tr.startRun(ctx, p, task)
				span.slotWait(0)
				span.end(c, nil, false)
			}
		})
		b.Run("enqueue/"+mode.name, func(b *testing.B) {
			ctx := context.Background()
			bt := &batch{reqs: []Request{{JobType: "noop"}}, pools: []*Pool{p}, results: []EnqueueResult{{Outcome: Enqueued}}}
			b.ReportAllocs()
			for b.Loop() {
				es := mode.tr.startEnqueue(ctx, bt)
				_ = jobHeaders(time.Now(), EnqueueOptions{}, es.of(0))
				es.end(bt, nil)
			}
		})
	}
}
